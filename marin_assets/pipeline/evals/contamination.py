"""How much of a downstream task the evaluated model was trained on: the overlap beside every score.

A benchmark score means less when the model read the benchmark. Each lm-eval evaluation finds the model's
training datasets through its lineage (`training.lineage.training_datasets_of`) and measures, per task, the
share of the scored documents (the prompt and the gold answer, `HarnessTask.examples`) that share an n-gram with
that text (`curation.ngram_overlap`: Marin's train–test overlap, 15 words). The evaluation's record keeps it beside
each score and says in one line whether the scores are clean, contaminated, or of unknown standing — when part
of the training is not in the graph (weights from a folder, a pretokenized cache) or its text cannot be read.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from marin_assets.pipeline.curation.ngram_overlap import (
    DEFAULT_NGRAM,
    EvalExamples,
    OverlapError,
    OverlapHit,
    ngram_overlap,
)
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.evals.harness_tasks import HarnessTask
from marin_assets.pipeline.training.lineage import Lineage

HITS_SHOWN = 3
"""Matches kept in the record per task and training dataset (every hit example's id is kept)."""


@dataclass(frozen=True)
class TaskContamination:
    """One task's scored documents found in the model's training data."""

    examples: int
    """Documents scored."""
    contaminated: int
    """Of them, those sharing an n-gram with some training dataset."""
    fraction: float
    """`contaminated / examples`."""
    per_dataset: dict[str, float]
    """Training dataset → the share of the scored documents it holds."""
    ids: list[int]
    """lm-eval `doc_id`s of the contaminated documents (as in `samples/{task}.jsonl`)."""
    hits: list[OverlapHit]
    """A few matches per training dataset: the document, the shared words, the training file and row."""


@dataclass(frozen=True)
class Contamination:
    """The overlap of each task's scored documents with the training data of the evaluated model."""

    model: str
    """The training step whose lineage was followed."""
    ngram: int
    datasets: list[str]
    """Training datasets read (their steps' names, `:split` unless `train`)."""
    unknown: list[str]
    """Training whose text is not known or could not be read: the overlap is then a lower bound."""
    tasks: dict[str, TaskContamination]
    seconds: float


def task_contamination(tasks: Sequence[HarnessTask], lineage: Lineage,
                       scored: Mapping[str, Collection[int]] | None = None,
                       ngram: int = DEFAULT_NGRAM) -> Contamination:
    """Per task, the overlap of its documents (those in `scored`, by `doc_id`, else all) with the text of
    `lineage`'s datasets. A dataset whose files cannot be read is named in `unknown`, not an error: the scores
    stand, marked of unknown standing."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="marin-overlap-data-") as cache:
        sets = []
        for task in tasks:
            wanted = None if scored is None else set(scored.get(task.name, ()))
            chosen = [(i, text) for i, text in task.examples(cache_dir=cache) if wanted is None or i in wanted]
            sets.append(EvalExamples(task.name, tuple(str(i) for i, _ in chosen), tuple(t for _, t in chosen),
                                     task.yaml))
    unknown = list(lineage.unknown)
    texts = []
    for dataset in lineage.datasets:
        try:
            texts.append(dataset.text())
        except (DatasetError, FileNotFoundError) as e:
            unknown.append(f"{dataset.name}: its text could not be read ({e})")
    sets = [s for s in sets if s.texts]
    out: dict[str, TaskContamination] = {}
    if texts and sets:
        try:
            overlap = ngram_overlap(sets, texts, ngram)
        except OverlapError as e:
            unknown.append(f"the training text could not be measured ({e})")
        else:
            for s in sets:
                hits = [h for h in overlap.hits if h.eval_set == s.name]
                shown = [h for t in overlap.scanned for h in [h for h in hits if h.train == t][:HITS_SHOWN]]
                out[s.name] = TaskContamination(len(s.texts), len(overlap.union[s.name]), overlap.fraction(s.name),
                                                {t: overlap.fraction(s.name, t) for t in overlap.scanned},
                                                [int(i) for i in overlap.union[s.name]], shown)
    return Contamination(lineage.model, ngram, [t.name for t in texts], unknown, out,
                         round(time.monotonic() - started, 2))


def contamination_status(contamination: Contamination | None, why_none: str = "") -> str:
    """One line for a person: are these scores clean, contaminated, or of unknown standing?"""
    if contamination is None:
        return f"unknown: the overlap with the training data was not measured ({why_none or 'no lineage given'})"
    tasks = contamination.tasks
    dirty = {n: t for n, t in tasks.items() if t.contaminated}
    scanned = ", ".join(contamination.datasets) or "none"
    missing = f"; not read: {'; '.join(contamination.unknown)}" if contamination.unknown else ""
    if dirty:
        listed = ", ".join(f"{n} {t.contaminated}/{t.examples} ({t.fraction:.1%})" for n, t in dirty.items())
        return (f"CONTAMINATED: {listed} of the scored documents share a {contamination.ngram}-gram with the"
                f" training data ({scanned}); these scores are not clean{missing}")
    if contamination.unknown or not tasks:
        return (f"unknown: no {contamination.ngram}-gram of the scored documents is in the training data read"
                f" ({scanned}){missing}")
    documents = sum(t.examples for t in tasks.values())
    return (f"clean: none of the {documents} scored documents of {len(tasks)} tasks shares a"
            f" {contamination.ngram}-gram with the training data ({scanned})")


__all__ = ["HITS_SHOWN", "Contamination", "TaskContamination", "contamination_status", "task_contamination"]
