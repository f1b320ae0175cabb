"""decontaminate: take out text that overlaps evaluation sets, so a model is not trained on its own exam.

As in Marin: word n-grams (13 by default, `ngrams`), and a paragraph (the text between two
`paragraph_separator`s) is contaminated when at least `threshold` of its n-grams occur in an
evaluation set: in the index of every evaluation set's n-grams (`eval_index`: a Bloom filter whose
every hit is confirmed exactly, each n-gram traced to its record), built once by the filter's `prepare`.

Per shard (resumable, fanned out), by `mode`: `remove_paragraph` drops contaminated paragraphs (a
document left empty is removed), `remove_document` drops the document, `mark` keeps everything and
adds `contaminated_by` (the sets' names, comma-joined; "" when clean). The reason is the set that
matched most of the paragraph's n-grams. Every contaminated paragraph is listed, for people to read,
in `{output}/contamination/{split}-NNNNN.parquet` (one per shard, beside the splits: not a split).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.paths import join_path
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.eval_index import (
    INDEX_PHASE,
    STAGE,
    Index,
    build_index,
    hash_in_chunks,
    index_params,
    load_index,
)
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step, run_filter
from marin_assets.pipeline.curation.shards import CurationError, Shard, write_shard
from marin_assets.pipeline.curation.stage import CurationResult, run_phase
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.data.text_files import expand_files

MODES = ("remove_paragraph", "remove_document", "mark")
CONTAMINATION_DIR = "contamination"
"""Under the output, beside the splits: the contaminated paragraphs, one parquet per shard."""
MARK_COLUMN = "contaminated_by"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
SIDE_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("paragraph", pa.int32()),
                         ("eval_set", pa.string()), ("eval_file", pa.string()), ("eval_record", pa.int64()),
                         ("overlap", pa.float64())])
"""A row per contaminated paragraph: the document, the paragraph's index in it (from 0), the set, the file
and line (from 1) of the record that matched most of it, and the share of its n-grams found."""


@dataclass(frozen=True)
class EvalFiles:
    """An evaluation set as files (paths or URLs): what an `EvalSet` is once its step has run."""

    name: str
    files: tuple[str, ...]
    text_field: str = "text"
    text_format: str = "auto"

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "files": list(self.files), "text_field": self.text_field,
                "text_format": self.text_format}

    def resolve(self) -> EvalFiles:
        return self


@dataclass(frozen=True)
class EvalSet:
    """An evaluation set: some files of another step's output. Its name is the removal reason."""

    name: str
    """Letters, digits, `_`, `-`, `.`: names the reason (`stdlib-qa`) and the `contaminated_by` mark."""
    step: Step
    """The step whose output holds the files (a dependency of the decontaminate step)."""
    files: tuple[str, ...] = ("**/*.jsonl*",)
    """Globs relative to the step's output."""
    text_field: str = "text"
    """The field (JSON lines) or column (parquet) holding a record's text."""
    text_format: str = "auto"
    """As `readers.FORMATS`: "auto" tells it from the file names."""

    def identity(self) -> dict[str, Any]:
        """The set in the step's identity: its step by name (its hash enters through the deps)."""
        return {"name": self.name, "step": self.step.name, "files": list(self.files), "text_field": self.text_field,
                "text_format": self.text_format}

    def resolve(self) -> EvalFiles:
        """Its files, found under its step's output (now: the step has run)."""
        try:
            found = expand_files(self.step.output_path, self.files)
        except DatasetError as error:
            raise CurationError(f"{STAGE}: evaluation set {self.name!r} of step {self.step.name!r}: {error}") from None
        return EvalFiles(self.name, tuple(found), self.text_field, self.text_format)


@dataclass(frozen=True)
class SetHits:
    """What one evaluation set contaminated."""

    documents: int
    """Documents with at least one paragraph attributed to the set."""
    paragraphs: int


@dataclass(frozen=True)
class DecontaminationResult(CurationResult):
    """A `CurationResult` (removed and modified per evaluation set) and what the evaluation sets held."""

    ngram: int
    threshold: float
    mode: str
    eval_set_records: dict[str, int]
    """Records read per evaluation set."""
    eval_set_ngrams: dict[str, int]
    """Distinct n-grams per evaluation set."""
    hits: dict[str, SetHits]
    contamination_path: str
    """The folder of `{split}-NNNNN.parquet` listing every contaminated paragraph (`SIDE_SCHEMA`)."""


@dataclass(frozen=True)
class Built:
    """What the index build (`Decontaminate.prepare`) found."""

    output_path: str
    token: str
    """Of the build: a process keeps the index it loaded while the token is the same."""
    records: dict[str, int]
    ngrams: dict[str, int]


def _problem(eval_names: Sequence[str], ngram: int, threshold: float, mode: str, paragraph_separator: str,
             false_positive_rate: float = 1e-6) -> str | None:
    """What is wrong with these parameters, or None."""
    if not eval_names:
        return "no evaluation sets"
    bad = [n for n in eval_names if not isinstance(n, str) or not _NAME.match(n)]
    if bad:
        return f"evaluation set name {bad[0]!r} is not letters, digits, '_', '-' or '.'"
    if len(set(eval_names)) != len(eval_names):
        return f"evaluation set names repeat: {list(eval_names)}"
    if mode not in MODES:
        return f"mode {mode!r} is not one of {', '.join(MODES)}"
    if not isinstance(ngram, int) or ngram < 1:
        return f"ngram must be a positive integer, got {ngram!r}"
    if not 0 < threshold <= 1:
        return f"threshold must be in (0, 1], got {threshold!r}"
    if not paragraph_separator:
        return "paragraph_separator must not be empty"
    if not 0 < false_positive_rate < 1:
        return f"false_positive_rate must be in (0, 1), got {false_positive_rate!r}"
    return None


def side_index_path(output_path: str, shard: Shard) -> str:
    """Where a shard's hits are listed (which evaluation record each came from)."""
    return join_path(output_path, CONTAMINATION_DIR, f"{shard.key}.parquet")


@dataclass(frozen=True)
class Decontaminate(CurationFilter):
    """Removes (or marks) the paragraphs or documents that overlap the evaluation sets."""

    eval_sets: tuple[EvalSet | EvalFiles, ...]
    ngram: int = 13
    threshold: float = 0.5
    mode: str = "remove_paragraph"
    paragraph_separator: str = "\n"
    false_positive_rate: float = 1e-6
    """Sizes the Bloom filter only: every hit is confirmed exactly, so the output does not depend on it."""
    built: Built | None = None
    """Set by `prepare`: the index's build."""
    name = STAGE

    def identity(self) -> dict[str, Any]:
        return {"eval_sets": [e.identity() for e in self.eval_sets], "ngram": self.ngram,
                "threshold": self.threshold, "mode": self.mode, "paragraph_separator": self.paragraph_separator}

    def deps(self) -> Sequence[Step]:
        return list(dict.fromkeys(e.step for e in self.eval_sets if isinstance(e, EvalSet)))

    def problem(self) -> str | None:
        """What is wrong with its parameters, or None."""
        return _problem([e.name for e in self.eval_sets], self.ngram, self.threshold, self.mode,
                        self.paragraph_separator, self.false_positive_rate)

    def prepare(self, output_path: str, shards: Sequence[Shard], workers: int) -> Decontaminate:
        """Resolve the evaluation sets' files and build their index (once: a resumable phase)."""
        resolved = tuple(e.resolve() for e in self.eval_sets)
        files = {e.name: list(e.files) for e in resolved}
        formats = {e.name: (e.text_field, e.text_format) for e in resolved}
        built = run_phase(output_path, INDEX_PHASE, ["index"],
                          functools.partial(build_index, output_path, files, formats, self.ngram,
                                            self.false_positive_rate),
                          key_of=lambda item: item, name=f"{STAGE}: index of {len(files)} evaluation sets")[0]
        if built["params"] != index_params(files, formats, self.ngram):
            raise CurationError(f"{STAGE}: {output_path} holds an evaluation index built from other evaluation sets"
                                f" or n-gram size ({built['params']}); decontaminate into a fresh output")
        return dataclasses.replace(self, eval_sets=resolved,
                                   built=Built(output_path, built["token"], built["records"], built["ngrams"]))

    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        """Find the contaminated paragraphs of one shard, write its side index, and say what to do with each row."""
        if self.built is None:
            raise CurationError(f"{STAGE}: the evaluation index is built by prepare(), before any shard is decided")
        texts = table.column("text").to_pylist()
        found, side, counters = self._contamination(texts, table, load_index(self.built.output_path, self.built.token))
        write_shard(pa.table(side, schema=SIDE_SCHEMA), side_index_path(self.built.output_path, shard))
        names = [e.name for e in self.eval_sets]
        separator = self.paragraph_separator
        removed: list[str | None] = [None] * len(texts)
        modified: list[str | None] = [None] * len(texts)
        new_texts = list(texts) if self.mode == "remove_paragraph" and found else None
        marks = [""] * len(texts)
        for d, hit in found.items():
            by_set = np.bincount([s for _, s in hit], minlength=len(names))
            for s in np.flatnonzero(by_set):
                name = names[s]
                counters[f"documents_hit:{name}"] = counters.get(f"documents_hit:{name}", 0) + 1
                counters[f"paragraphs_hit:{name}"] = counters.get(f"paragraphs_hit:{name}", 0) + int(by_set[s])
            reason = names[int(by_set.argmax())]  # the set that took most of its paragraphs; ties: named first
            marks[d] = ",".join(names[s] for s in np.flatnonzero(by_set))
            if self.mode == "remove_document":
                removed[d] = reason
            elif new_texts is not None:
                dropped = {q for q, _ in hit}
                new_texts[d] = separator.join(q for j, q in enumerate(texts[d].split(separator)) if j not in dropped)
                counters["paragraphs_removed"] = counters.get("paragraphs_removed", 0) + len(dropped)
                modified[d] = reason
                if not new_texts[d].strip():
                    removed[d] = reason  # nothing of its own left
        if self.mode == "mark":
            counters["documents_marked"] = len(found)
            return Verdicts(removed, columns={MARK_COLUMN: pa.array(marks, pa.string())}, counters=counters)
        return Verdicts(removed, new_texts, modified if new_texts is not None else None, counters=counters)

    def _contamination(self, texts: list[str], table: pa.Table, index: Index
                       ) -> tuple[dict[int, list[tuple[int, int]]], dict[str, list[Any]], dict[str, int]]:
        """The contaminated paragraphs of each document (`{document: [(paragraph within it, set)]}`), the
        side index's rows (`SIDE_SCHEMA`) and the counts of paragraphs, n-grams and Bloom hits."""
        paragraphs: list[str] = []
        per_doc = np.zeros(len(texts), dtype=np.int64)
        for d, text in enumerate(texts):
            parts = text.split(self.paragraph_separator)
            paragraphs += parts
            per_doc[d] = len(parts)
        grams, offsets = hash_in_chunks(paragraphs, self.ngram)
        per_paragraph = np.diff(offsets)
        maybe = np.flatnonzero(np.fromiter(map(index.bloom.__contains__, grams.tolist()), dtype=bool, count=len(grams)))
        at = np.minimum(np.searchsorted(index.hashes, grams[maybe]), len(index.hashes) - 1)
        confirmed = index.hashes[at] == grams[maybe]
        hit_gram, hit_entry = maybe[confirmed], at[confirmed]
        hit_paragraph = np.repeat(np.arange(len(paragraphs)), per_paragraph)[hit_gram]
        hits = np.bincount(hit_paragraph, minlength=len(paragraphs))
        overlap = hits / np.maximum(per_paragraph, 1)
        contaminated = np.flatnonzero((hits > 0) & (overlap >= self.threshold))

        # Per contaminated paragraph: the set with most of its n-grams, then that set's record with most.
        keep = np.isin(hit_paragraph, contaminated)
        order = np.argsort(hit_paragraph[keep], kind="stable")
        entries = hit_entry[keep][order]
        bounds = np.searchsorted(hit_paragraph[keep][order], contaminated, side="left")
        bounds = np.append(bounds, len(entries))
        doc_start = np.concatenate([[0], np.cumsum(per_doc)])
        doc_of = np.repeat(np.arange(len(texts)), per_doc)
        found: dict[int, list[tuple[int, int]]] = {}
        side: dict[str, list[Any]] = {name: [] for name in SIDE_SCHEMA.names}
        ids, sources = table.column("id"), table.column("source")
        for i, p in enumerate(contaminated.tolist()):
            mine = entries[bounds[i]:bounds[i + 1]]
            sets = index.sets[mine]
            best = int(np.bincount(sets).argmax())  # ties: the set named first
            records, counts = np.unique(index.records[mine][sets == best], return_counts=True)
            record = int(records[counts.argmax()])
            d = int(doc_of[p])
            found.setdefault(d, []).append((p - int(doc_start[d]), best))
            side["id"].append(ids[d].as_py())
            side["source"].append(sources[d].as_py())
            side["paragraph"].append(p - int(doc_start[d]))
            side["eval_set"].append(self.eval_sets[best].name)
            side["eval_file"].append(index.files[int(index.record_file[record])])
            side["eval_record"].append(int(index.record_line[record]))
            side["overlap"].append(float(overlap[p]))
        counters = {"paragraphs": len(paragraphs), "paragraphs_contaminated": len(contaminated),
                    "documents_contaminated": len(found), "ngrams": len(grams), "bloom_hits": len(maybe),
                    "bloom_false_positives": int(len(maybe) - confirmed.sum())}
        return found, side, counters

    def result(self, summary: CurationResult) -> DecontaminationResult:
        assert self.built is not None
        counters = dict(summary.counters)
        hits = {e.name: SetHits(counters.pop(f"documents_hit:{e.name}", 0), counters.pop(f"paragraphs_hit:{e.name}", 0))
                for e in self.eval_sets}
        return DecontaminationResult.of(
            dataclasses.replace(summary, counters=counters), ngram=self.ngram, threshold=self.threshold,
            mode=self.mode, eval_set_records=self.built.records, eval_set_ngrams=self.built.ngrams, hits=hits,
            contamination_path=join_path(self.built.output_path, CONTAMINATION_DIR))


def decontaminate(output_path: str, dataset_path: str, eval_sets: Mapping[str, Sequence[str]], text_field: str = "text",
                  text_format: str = "auto", ngram: int = 13, threshold: float = 0.5, mode: str = "remove_paragraph",
                  paragraph_separator: str = "\n", false_positive_rate: float = 1e-6, workers: int = 1,
                  eval_formats: Mapping[str, tuple[str, str]] | None = None) -> DecontaminationResult:
    """A curated dataset without the paragraphs (or documents) that overlap the evaluation sets.

    `eval_sets`: name → its files (paths). `text_field`/`text_format` say how to read them, or per set
    `eval_formats` (name → (text_field, text_format)). `false_positive_rate` sizes the Bloom filter only:
    every hit is confirmed exactly, so the output does not depend on it.
    """
    sets = tuple(EvalFiles(name, tuple(files), *(eval_formats or {}).get(name, (text_field, text_format)))
                 for name, files in eval_sets.items())
    chosen = Decontaminate(sets, ngram, threshold, mode, paragraph_separator, false_positive_rate)
    problem = chosen.problem()
    if problem:
        raise CurationError(f"{STAGE}: {problem}")
    result = run_filter(output_path, dataset_path, chosen, workers)
    assert isinstance(result, DecontaminationResult)
    return result


def resolve_eval_sets(eval_sets: Sequence[EvalSet]) -> dict[str, list[str]]:
    """Each set's files, found under its step's output (now: the step has run)."""
    return {e.name: list(e.resolve().files) for e in eval_sets}


def decontaminate_step(name: str, dataset: Step, eval_sets: Sequence[EvalSet], ngram: int = 13,
                       threshold: float = 0.5, mode: str = "remove_paragraph", paragraph_separator: str = "\n",
                       workers: int = 1, max_removed_fraction: float = 0.5,
                       false_positive_rate: float = 1e-6) -> Step:
    """`dataset` (curated shards) decontaminated against `eval_sets`. Identity: the sets (name, step, files,
    field, format), `ngram`, `threshold`, `mode`, `paragraph_separator`; not `workers` nor the Bloom filter's
    `false_positive_rate` (hits are confirmed exactly)."""
    chosen = Decontaminate(tuple(eval_sets), ngram, threshold, mode, paragraph_separator, false_positive_rate)
    problem = chosen.problem()
    if problem:
        raise StepDefinitionError(f"{STAGE} step {name!r}: {problem}")
    return filter_step(name, dataset, chosen, workers=workers, max_removed_fraction=max_removed_fraction,
                       description=made_by(decontaminate))
