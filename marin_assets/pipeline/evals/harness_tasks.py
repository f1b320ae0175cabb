"""lm-eval tasks as content: a local YAML task and every file it reads (includes, data files) hashed
into its identity, few-shot settings verified, and the tasks this project ships.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHIPPED_TASKS_DIR = Path(__file__).resolve().parents[3] / "resources" / "eval_tasks"
"""The tasks the project ships: `{name}/{name}.yaml` and its data (see `generate.py` there)."""


SHIPPED_TASKS = ("pydocs_next_sentence", "pydocs_last_word")
"""Multiple choice and loglikelihood, on sentences of Python's documentation held out from the demo corpus."""


SHIPPED_GENERATIVE_TASKS = ("arith_word_problems",)
"""Generative (`generate_until`): arithmetic word problems in GSM8K's format, held out from the training split
`word_problems_step` writes (`pipeline/data/word_problems.py`)."""


OUTPUT_TYPES = ("multiple_choice", "loglikelihood", "generate_until")
"""What the Levanter adapter scores: loglikelihoods of continuations, and answers written by the generation engine
(no rolling windows)."""


class HarnessTaskError(ValueError):
    """A task cannot be used: its YAML or a data file is missing or malformed, or it changed since its step
    was defined."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class HarnessTask:
    """An lm-eval task from a YAML file, identified by the content of every file it reads."""

    name: str
    """The YAML's `task`: the name lm-eval reports results under."""
    yaml: str
    """Absolute path of the YAML file (not identity: the same files elsewhere are the same task)."""
    output_type: str
    files: Mapping[str, str]
    """Path relative to the YAML's folder → sha256: the YAML, the YAMLs it includes, its data files and the
    Python files its `!function`s live in."""
    data_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Split → data files relative to the YAML's folder, as the YAML names them."""

    def identity(self) -> dict[str, Any]:
        """What enters a step's identity: the task's name and its files' content."""
        return {"name": self.name, "files": dict(sorted(self.files.items()))}

    @property
    def folder(self) -> Path:
        """The YAML's folder, which the task's relative paths start from."""
        return Path(self.yaml).parent

    def verify(self) -> None:
        """Raise if a file changed since the task was read (the step's identity would no longer describe it)."""
        for relative, digest in self.files.items():
            path = self.folder / relative
            if not path.is_file():
                raise HarnessTaskError(f"harness task {self.yaml}: {relative} is gone since the step was defined")
            if _sha256(path) != digest:
                raise HarnessTaskError(f"harness task {self.yaml}: {relative} changed since the step was defined"
                                       " (its content is the step's identity): define the step again")

    def config(self, cache_dir: str | None = None) -> dict[str, Any]:
        """The task as an lm-eval config dict: `!function`s imported, data files as absolute paths, and the
        datasets cache in `cache_dir` (None: the datasets library's own)."""
        from lm_eval.tasks._yaml_loader import load_yaml

        config = load_yaml(self.yaml, resolve_func=True)
        kwargs = dict(config.get("dataset_kwargs") or {})
        kwargs["data_files"] = {split: [str(self.folder / f) for f in files]
                                for split, files in self.data_files.items()}
        if cache_dir is not None:
            kwargs["cache_dir"] = cache_dir
        config["dataset_kwargs"] = kwargs
        return config

    def examples(self, cache_dir: str | None = None) -> list[tuple[int, str]]:
        """(lm-eval's `doc_id`, text) of each document lm-eval scores (its test split, else validation), the text
        being what a model that had seen the test would have read: the prompt (`doc_to_text`), the target
        delimiter and the gold answer (`doc_to_target`; for multiple choice, the gold choice — not the others).
        Rendered by lm-eval itself, so templates, `process_docs` and `!function`s apply as when scoring."""
        from lm_eval.tasks import TaskManager

        self.verify()
        task = TaskManager(include_defaults=False).load([self.config(cache_dir=cache_dir)])["tasks"][self.name]
        delimiter = task.config.target_delimiter
        out = []
        for doc_id, doc in enumerate(task.eval_docs):
            context, target = task.doc_to_text(doc), task.doc_to_target(doc)
            if task.config.output_type == "multiple_choice":
                choices = task.doc_to_choice(doc)
                context = choices[context] if isinstance(context, int) else context  # a choice as the context
                golds = target if isinstance(target, list) else [target]
                target = " ".join(choices[t] if isinstance(t, int) else str(t) for t in golds)
            out.append((doc_id, f"{context}{delimiter}{target}"))
        return out


_FUNCTION_TAG = re.compile(r"!function\s+([A-Za-z_][\w.]*)\.[A-Za-z_]\w*")


@functools.cache
def _yaml_loader() -> type:
    """A safe YAML loader reading lm-eval's `!function module.name` tags as text (lm-eval's own loader imports
    them, and importing lm-eval takes seconds: too slow where steps are defined)."""
    import yaml

    class TaskLoader(yaml.SafeLoader):
        """Safe YAML plus lm-eval's `!function` tag."""

    TaskLoader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")
    return TaskLoader


def _read_yaml(path: Path, root: str) -> dict[str, Any]:
    """One YAML file as a mapping, or a `HarnessTaskError` naming it and where it is malformed."""
    import yaml

    if not path.is_file():
        raise HarnessTaskError(f"harness task {root}: no such file {path}")
    try:
        with open(path, "rb") as f:
            config = yaml.load(f, Loader=_yaml_loader())  # noqa: S506 - a safe loader with one more tag
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise HarnessTaskError(f"harness task {root}: {path.name} is not valid YAML ({problem}{where})") from None
    if not isinstance(config, dict):
        raise HarnessTaskError(f"harness task {root}: {path.name} holds a YAML {type(config).__name__}, not a"
                               " mapping of task settings")
    return config


def _check_rows(path: Path, relative: str, root: str) -> None:
    """Every line of a JSON lines data file is a JSON object (else the file and line, not a datasets trace)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise HarnessTaskError(f"harness task {root}: data file {relative}, line {number}: malformed JSON"
                                       f" ({e})") from None
            if not isinstance(row, dict):
                raise HarnessTaskError(f"harness task {root}: data file {relative}, line {number}: a JSON"
                                       f" {type(row).__name__}, not an object (JSON lines hold one object per line)")


def _merged_yaml(path: Path, root: str, files: dict[str, str], seen: frozenset[Path] = frozenset()) -> dict[str, Any]:
    """A YAML with the files it includes merged in as lm-eval merges them (includes in order, then its own keys);
    each file read, and each Python file of its `!function`s, goes into `files` with its sha256."""
    if path in seen:
        raise HarnessTaskError(f"harness task {root}: {path.name} includes itself")
    config = _read_yaml(path, root)
    folder = Path(root).parent
    files[os.path.relpath(path, folder)] = _sha256(path)
    for module in _FUNCTION_TAG.findall(path.read_text(encoding="utf-8", errors="replace")):
        source = path.parent / (module.replace(".", "/") + ".py")
        if source.is_file():
            files[os.path.relpath(source, folder)] = _sha256(source)
    includes = config.pop("include", None) or []
    merged: dict[str, Any] = {}
    for include in includes if isinstance(includes, list) else [includes]:
        merged.update(_merged_yaml((path.parent / str(include)).resolve(), root, files, seen | {path}))
    return {**merged, **config}


def harness_task(yaml_path: str | os.PathLike[str]) -> HarnessTask:
    """Read an lm-eval task YAML and the files it names; malformed or missing ones are a `HarnessTaskError`
    naming the YAML file."""
    path = Path(yaml_path).expanduser().resolve()
    root, folder = str(path), path.parent
    files: dict[str, str] = {}
    merged = _merged_yaml(path, root, files)
    name = merged.get("task")
    if not isinstance(name, str) or not name:
        raise HarnessTaskError(f"harness task {root}: no 'task' name (a task YAML names its task: `task: my_task`)")
    output_type = merged.get("output_type", "generate_until")
    if output_type not in OUTPUT_TYPES:
        raise HarnessTaskError(f"harness task {root}: output_type {output_type!r} is not scored here (only"
                               f" {', '.join(OUTPUT_TYPES)}: rolling loglikelihoods are not)")
    listed = (merged.get("dataset_kwargs") or {}).get("data_files")
    if not listed:
        raise HarnessTaskError(f"harness task {root}: no local data files (dataset_kwargs.data_files): a task's"
                               " identity is its files' content, so its data must be files next to it")
    by_split = listed if isinstance(listed, Mapping) else {"train": listed}
    data_files: dict[str, tuple[str, ...]] = {}
    for split, names in by_split.items():
        data_files[str(split)] = tuple(str(n) for n in (names if isinstance(names, list) else [names]))
        for relative in data_files[str(split)]:
            data = (folder / relative).resolve()
            if not data.is_file():
                raise HarnessTaskError(f"harness task {root}: data file {relative!r} (split {split!r}) not found at"
                                       f" {data} (data files are relative to the YAML's folder)")
            if data.suffix == ".jsonl":
                _check_rows(data, relative, root)
            files[os.path.relpath(data, folder)] = _sha256(data)
    return HarnessTask(name, root, output_type, files, data_files)


def shipped_task(name: str) -> HarnessTask:
    """One of the project's own tasks (`SHIPPED_TASKS`), from `resources/eval_tasks/{name}/{name}.yaml`."""
    if name not in SHIPPED_TASKS + SHIPPED_GENERATIVE_TASKS:
        raise HarnessTaskError(f"no shipped task {name!r} (shipped:"
                               f" {', '.join(SHIPPED_TASKS + SHIPPED_GENERATIVE_TASKS)})")
    return harness_task(SHIPPED_TASKS_DIR / name / f"{name}.yaml")


def shipped_tasks() -> list[HarnessTask]:
    """The project's own loglikelihood and multiple-choice tasks (`SHIPPED_TASKS`; the generative one is
    `shipped_task("arith_word_problems")`)."""
    return [shipped_task(n) for n in SHIPPED_TASKS]
