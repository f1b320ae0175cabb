"""Validation suites: a named collection of held-out datasets every training run can be scored on.

Marin scores every run on Paloma (and "uncheatable" sets) beside its own validation split: one
download of the suite's repository at a pinned commit, then one tokenized cache per set with the
run's tokenizer, each a validation component (weight 0) of the training step, so every eval logs
`eval/{suite}-{set}/loss` and `bpb`. A suite is steps like any other: the download is shared by every
tokenizer, each tokenized set is computed once per tokenizer and reused by every run that uses it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.data.download import hf_download_step, is_commit_sha, url_download_step
from marin_assets.pipeline.tokens.tokenize import TokenizeStep, tokenize_step


@dataclass(frozen=True)
class ValidationSuite:
    """A pinned download and its sets (name → file globs inside it); `tokenized` makes the caches."""

    name: str
    """The suite's name: prefixes its steps (`raw/{name}`, `tokenized/{name}/{set}-…`) and its components."""
    download: Step
    """The suite's files at a pinned revision (Hugging Face commit sha, or fixed URLs)."""
    sets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Set name → globs of its files, relative to the download (e.g. `c4_en/val/*.jsonl.gz`)."""
    text_field: str = "text"
    """The field of each record that holds the text."""

    def tokenized(self, tokenizer: Step, workers: int = 1) -> dict[str, TokenizeStep]:
        """One cache per set, its files as the `validation` split, tokenized with `tokenizer` — as
        components named `{suite}-{set}`, ready for `train_step(validation=…)` or `loss_eval_step`."""
        tag = tokenizer.name.rstrip("/").rsplit("/", 1)[-1]
        return {f"{self.name}-{key}": tokenize_step(f"tokenized/{self.name}/{key}-{tag}", self.download, tokenizer,
                                                    splits={"validation": list(globs)}, text_field=self.text_field,
                                                    workers=workers)
                for key, globs in sorted(self.sets.items())}


def _checked_sets(suite: str, sets: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    if not sets:
        raise StepDefinitionError(f"validation suite {suite!r} has no sets")
    checked: dict[str, tuple[str, ...]] = {}
    for key, globs in sets.items():
        if isinstance(globs, str):
            globs = [globs]
        if not key or "/" in key or not globs:
            raise StepDefinitionError(f"validation suite {suite!r}: set {key!r} needs a name without '/' and at least"
                                      f" one file glob (got {list(globs)})")
        checked[key] = tuple(globs)
    return checked


def hf_validation_suite(name: str, repo_id: str, revision: str, sets: Mapping[str, Sequence[str]],
                        text_field: str = "text", repo_type: str = "dataset") -> ValidationSuite:
    """A suite from a Hugging Face repository at a commit (`revision` must be a 40-hex commit sha: a suite
    that moved under a branch would make old and new evaluations incomparable). Only the sets' files are
    downloaded."""
    checked = _checked_sets(name, sets)
    if not is_commit_sha(revision):
        raise StepDefinitionError(f"validation suite {name!r}: pin {repo_id} to a commit sha, not {revision!r}"
                                  " (its scores must stay comparable across runs)")
    include = sorted({g for globs in checked.values() for g in globs})
    return _suite(name, hf_download_step(f"raw/{name}", repo_id, revision, include, repo_type), checked, text_field)


def url_validation_suite(name: str, urls: Sequence[str], sets: Mapping[str, Sequence[str]],
                         text_field: str = "text") -> ValidationSuite:
    """A suite from fixed fsspec URLs (a release folder, a bucket path); the download follows their
    content versions like any `url_download_step`. Set globs match the copied files' names."""
    checked = _checked_sets(name, sets)
    return _suite(name, url_download_step(f"raw/{name}", urls), checked, text_field)


def unmatched_globs(sets: Mapping[str, Sequence[str]], files: Sequence[str]) -> dict[str, list[str]]:
    """The globs of each set that match none of `files` (relative paths): what a suite definition got wrong."""
    missing = {key: [g for g in globs if not fnmatch.filter(files, g)] for key, globs in sets.items()}
    return {key: globs for key, globs in missing.items() if globs}


def _every_set_has_files(sets: Mapping[str, tuple[str, ...]]) -> Check:
    def check(output_path: str, result: dict) -> CheckOutcome:
        missing = unmatched_globs(sets, [f["path"] for f in result["files"]])
        if missing:
            return CheckOutcome(False, f"globs matching no downloaded file: {missing}",
                                {"sets_without_files": len(missing)})
        return CheckOutcome(True, f"all {len(sets)} sets have files", {"sets": len(sets)})

    return Check("every_set_has_files", check, "Every set's globs match downloaded files.", blocking=True)


def _suite(name: str, download: Step, sets: dict[str, tuple[str, ...]], text_field: str) -> ValidationSuite:
    return ValidationSuite(name, replace(download, checks=[*download.checks, _every_set_has_files(sets)]), sets,
                           text_field)


__all__ = ["ValidationSuite", "hf_validation_suite", "unmatched_globs", "url_validation_suite"]
