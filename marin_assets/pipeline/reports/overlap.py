"""The train–test overlap report: Marin's `train_test_overlap` matrix as a step.

Rows are evaluation sets — lm-eval tasks (each scored document: the prompt and the gold answer), files of a
step's output (an `EvalSet`, a validation suite's sets) or the validation split behind a token cache; columns are
training datasets — usually those of a model's lineage (`training_datasets_of`: the text each of its tokenize
steps read) — and the union of them all. A cell is the share of the set's examples with at least one 15-word
n-gram in the dataset (`curation.ngram_overlap`). The matrix is a table in the UI, with a few matches per cell (the
example, the shared words, the training file and row); every match is in `hits.jsonl`, the matrix in
`overlap_matrix.csv`. Training whose text is not in the graph (weights from a folder, a pretokenized cache) is
listed as not scanned: the union is then a lower bound.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from marin_assets.core.files import atomic_write
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.decontaminate import EvalSet
from marin_assets.pipeline.curation.ngram_overlap import (
    DEFAULT_NGRAM,
    UNION,
    EvalExamples,
    OverlapError,
    OverlapHit,
    TrainText,
    ngram_overlap,
    read_documents,
)
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.data.text_files import expand_files
from marin_assets.pipeline.evals.harness_tasks import HarnessTask, HarnessTaskError, harness_task
from marin_assets.pipeline.tokens.tokenize import TokenizeStep
from marin_assets.pipeline.tokens.validation_suite import ValidationSuite
from marin_assets.pipeline.training.lineage import DatasetText, Lineage, text_of, training_datasets_of

HITS_FILE = "hits.jsonl"
MATRIX_FILE = "overlap_matrix.csv"
HITS_PER_CELL = 3
"""Matches kept in the record (and shown in the UI) per evaluation set and training dataset."""


@dataclass(frozen=True)
class EvalSetSummary:
    """One row's evaluation set."""

    examples: int
    short_examples: int
    """Examples with fewer words than the n-gram, checked whole."""
    contaminated: int
    """Examples some training dataset holds (the union)."""
    source: str
    """Where its examples come from."""


@dataclass(frozen=True)
class TrainingDatasetSummary:
    """One column's training dataset, as read."""

    files: int
    documents: int
    characters: int
    about: dict[str, Any] = field(default_factory=dict)
    """How the model came to read it: its step, the caches and training steps that read it, what it was made
    from (`DatasetText`); empty for a dataset given directly."""


@record_type("overlap_report")
@dataclass(frozen=True)
class OverlapResult:
    """Marin's train–test overlap matrix, and where each overlap is."""

    ngram: int
    matrix: dict[str, dict[str, float]]
    """Evaluation set → {training dataset: the share of its examples that dataset holds, …, "union": the share
    any of them holds}. A table in the UI, one row per evaluation set."""
    examples_hit: dict[str, dict[str, int]]
    """The same, as counts of examples."""
    eval_sets: dict[str, EvalSetSummary]
    training_datasets: dict[str, TrainingDatasetSummary]
    hits: list[OverlapHit]
    """The first `HITS_PER_CELL` matches of each cell; all of them are in `hits_file`."""
    max_union: float
    """The largest union share over the evaluation sets: 0 when no evaluation set overlaps."""
    unscanned: list[str]
    """Training whose text is not in the graph, in words: when any, the union is a lower bound."""
    seconds: float
    hits_file: str = HITS_FILE
    """Every match (one per example and training dataset it is found in), JSON lines, relative to the output."""
    matrix_file: str = MATRIX_FILE
    """The matrix as CSV (Marin's `overlap_matrix.csv` layout), relative to the output."""


def overlap_report(output_path: str, eval_sets: Sequence[EvalExamples], train: Sequence[TrainText],
                   ngram: int = DEFAULT_NGRAM, unscanned: Sequence[str] = (),
                   about: Mapping[str, Mapping[str, Any]] | None = None,
                   hits_per_cell: int = HITS_PER_CELL) -> OverlapResult:
    """The train–test overlap of evaluation sets (their examples as text) with training datasets (their files):
    per set and dataset, the share of examples with at least one `ngram`-word n-gram in the dataset, and the
    union; the matrix and every match written under `output_path`. `about`: per training dataset, how a model
    came to read it (shown with it); `unscanned`: training whose text was not read (shown, and the union then
    a lower bound)."""
    started = time.monotonic()
    found = ngram_overlap(eval_sets, train, ngram)
    matrix = found.matrix()
    counts = {e: {**{t: len(found.hit[e][t]) for t in found.scanned}, UNION: len(found.union[e])}
              for e in found.examples}
    lines = "".join(json.dumps(asdict(h), ensure_ascii=False) + "\n" for h in found.hits)
    atomic_write(join_path(output_path, HITS_FILE), lines.encode())
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow(["evaluation_dataset", *found.scanned, UNION])
    for e, row in matrix.items():
        writer.writerow([e, *(f"{row[t]:.6f}" for t in (*found.scanned, UNION))])
    atomic_write(join_path(output_path, MATRIX_FILE), table.getvalue().encode())
    shown = [h for e in found.examples for t in found.scanned
             for h in [h for h in found.hits if h.eval_set == e and h.train == t][:hits_per_cell]]
    return OverlapResult(
        ngram, matrix, counts,
        {e: EvalSetSummary(found.examples[e], found.short_examples[e], len(found.union[e]), found.eval_sources[e])
         for e in found.examples},
        {t: TrainingDatasetSummary(s.files, s.documents, s.characters, dict((about or {}).get(t, {})))
         for t, s in found.scanned.items()},
        shown, max(row[UNION] for row in matrix.values()), list(unscanned), round(time.monotonic() - started, 2))


# --- what the step reads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TaskSet:
    """An lm-eval task's scored documents."""

    task: HarnessTask

    @property
    def name(self) -> str:
        return self.task.name

    def identity(self) -> dict[str, Any]:
        return {"task": self.task.identity()}

    def steps(self) -> list[Step]:
        return []

    def examples(self, cache_dir: str) -> EvalExamples:
        try:
            found = self.task.examples(cache_dir=cache_dir)
        except HarnessTaskError as e:
            raise OverlapError(f"evaluation set {self.name!r}: {e}") from None
        return EvalExamples(self.name, tuple(str(i) for i, _ in found), tuple(t for _, t in found), self.task.yaml)


@dataclass(frozen=True)
class _FileSet:
    """Records of files under a step's output (an `EvalSet`; a validation suite's set)."""

    name: str
    step: Step
    files: tuple[str, ...]
    text_field: str = "text"
    text_format: str = "auto"

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "step": self.step.name, "files": list(self.files), "text_field": self.text_field,
                "text_format": self.text_format}

    def steps(self) -> list[Step]:
        return [self.step]

    def examples(self, cache_dir: str) -> EvalExamples:
        root = self.step.output_path
        try:
            files = expand_files(root, self.files)
            return _read(self.name, TrainText(self.name, tuple(files), "text", self.text_field, self.text_format),
                         root, f"{len(files)} files of {self.step.name}")
        except DatasetError as e:
            raise OverlapError(f"evaluation set {self.name!r} (step {self.step.name_with_hash}): {e}") from None


@dataclass(frozen=True)
class _DatasetSet:
    """The text behind a split of a token cache (a validation split)."""

    text: DatasetText

    @property
    def name(self) -> str:
        return self.text.name

    def identity(self) -> dict[str, Any]:
        return self.text.identity()

    def steps(self) -> list[Step]:
        return [self.text.step]

    def examples(self, cache_dir: str) -> EvalExamples:
        try:
            files = self.text.files()
            return _read(self.name, TrainText(self.name, tuple(files), self.text.reader, self.text.text_field,
                                              self.text.text_format), self.text.step.output_path,
                         f"split {self.text.split!r} of {self.text.step.name}")
        except DatasetError as e:
            raise OverlapError(f"evaluation set {self.name!r}: {e}") from None


def _read(name: str, text: TrainText, root: str, source: str) -> EvalExamples:
    """A dataset's documents as examples, each named `file:line` (the file relative to `root`)."""
    ids, texts = [], []
    for file, line, document in read_documents(text):
        ids.append(f"{os.path.relpath(file, root) if file.startswith(root) else file}:{line}")
        texts.append(document)
    return EvalExamples(name, tuple(ids), tuple(texts), source)


EvalSource = HarnessTask | EvalSet | ValidationSuite | TokenizeStep | str
"""What `overlap_step` takes as evaluation sets: an lm-eval task (or its YAML's path), an `EvalSet` (files of a
step's output), a validation suite (each of its sets), or a token cache (the validation split it was made from)."""


def _eval_sets(where: str, sources: Sequence[EvalSource], split: str) -> list[_TaskSet | _FileSet | _DatasetSet]:
    out: list[_TaskSet | _FileSet | _DatasetSet] = []
    for source in sources:
        if isinstance(source, str):
            try:
                source = harness_task(source)
            except HarnessTaskError as e:
                raise StepDefinitionError(f"{where}: {e}") from None
        if isinstance(source, HarnessTask):
            out.append(_TaskSet(source))
        elif isinstance(source, EvalSet):
            out.append(_FileSet(source.name, source.step, tuple(source.files), source.text_field, source.text_format))
        elif isinstance(source, ValidationSuite):
            out += [_FileSet(f"{source.name}-{key}", source.download, globs, source.text_field)
                    for key, globs in sorted(source.sets.items())]
        elif isinstance(source, TokenizeStep):
            text = text_of(source, split)
            if isinstance(text, str):
                raise StepDefinitionError(f"{where}: evaluation set {text}")
            out.append(_DatasetSet(text))
        else:
            raise StepDefinitionError(f"{where}: {source!r} is not an evaluation set (an lm-eval task or its YAML, an"
                                      " EvalSet, a validation suite or a token cache)")
    return out


TrainSource = Lineage | DatasetText | Step
"""What `overlap_step` takes as training datasets: a model's lineage (`training_datasets_of`), a training step or
a step made from one (its lineage), a token cache (the train split it was made from), or a `DatasetText`."""


def _training(where: str, sources: TrainSource | Sequence[TrainSource]) -> tuple[list[DatasetText], list[str]]:
    """The training datasets (each once) and what could not be scanned."""
    items = [sources] if isinstance(sources, (Lineage, DatasetText, Step)) else list(sources)
    datasets: dict[str, DatasetText] = {}
    unknown: list[str] = []
    for item in items:
        if isinstance(item, TokenizeStep):
            text = text_of(item, "train")
            if isinstance(text, str):
                unknown.append(text)
                continue
            item = text
        elif isinstance(item, Step):
            item = training_datasets_of(item)
        if isinstance(item, Lineage):
            unknown += item.unknown
            for d in item.datasets:
                datasets.setdefault(d.name, d)
        elif isinstance(item, DatasetText):
            datasets.setdefault(item.name, item)
        else:
            raise StepDefinitionError(f"{where}: {item!r} is not a training dataset (a model's lineage, a training"
                                      " step, a token cache or a DatasetText)")
    if not datasets:
        raise StepDefinitionError(f"{where}: no training dataset to scan" + (
            f" (not in the graph: {'; '.join(unknown)})" if unknown else ""))
    return list(datasets.values()), list(dict.fromkeys(unknown))


def overlap_step(name: str, eval_sets: Sequence[EvalSource], train: TrainSource | Sequence[TrainSource],
                 ngram: int = DEFAULT_NGRAM, eval_split: str = "validation",
                 hits_per_cell: int = HITS_PER_CELL) -> Step:
    """The train–test overlap matrix of `eval_sets` × the training datasets of `train` (a model's
    `training_datasets_of`, a training step, caches or `DatasetText`s) and their union. A token cache among the
    evaluation sets stands for its `eval_split` split's text.

    Identity: each evaluation set (a task's files' content; a step's name and globs), each training dataset (its
    step, split and how it is read), `ngram` and what could not be scanned; the datasets' and sets' steps are
    dependencies. Not `hits_per_cell` (display only).
    """
    where = f"overlap step {name!r}"
    sets = _eval_sets(where, eval_sets, eval_split)
    datasets, unknown = _training(where, train)
    names = [s.name for s in sets]
    problem = ("no evaluation sets" if not sets
               else f"two evaluation sets are named {sorted({n for n in names if names.count(n) > 1})}"
               if len(set(names)) != len(names)
               else f"the n-gram size must be a positive integer, got {ngram!r}"
               if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 1 else None)
    if problem:
        raise StepDefinitionError(f"{where}: {problem}")
    about = {d.name: {"step": d.step.name, "split": d.split, "caches": list(d.caches), "trained_by": list(d.trained_by),
                      "derived_from": list(d.derived_from)} for d in datasets}

    def run(out: str) -> OverlapResult:
        with tempfile.TemporaryDirectory(prefix="marin-overlap-tasks-") as cache:
            examples = [s.examples(cache) for s in sets]
        texts = []
        for d in datasets:
            try:
                texts.append(d.text())
            except (DatasetError, FileNotFoundError) as e:
                raise OverlapError(f"training dataset {d.name!r}: {e}") from None
        return overlap_report(out, examples, texts, ngram, unknown, about, hits_per_cell)

    deps = list(dict.fromkeys([*(s for e in sets for s in e.steps()), *(d.step for d in datasets)]))
    return Step(name=name, fn=run, deps=deps, kind="report", resources=Resources(cpu=1),
                hash_attrs={"eval_sets": [s.identity() for s in sets], "train": [d.identity() for d in datasets],
                            "ngram": ngram, "unscanned": unknown},
                description=made_by(overlap_report))


__all__ = ["HITS_FILE", "HITS_PER_CELL", "MATRIX_FILE", "EvalSetSummary", "EvalSource", "OverlapResult",
           "TrainSource", "TrainingDatasetSummary", "overlap_report", "overlap_step"]
