"""Heuristic filters: the Gopher, C4 and FineWeb rules that remove documents no reader would want.

Every rule is a threshold in `HeuristicRules` (`heuristic_rules`; None turns it off) and has a stable
name, the field's name, which is the removal reason; a document failing several rules is removed for
the first in field order, and `counters` count every rule each document fails (`fails:{rule}`), so how
rules overlap is visible. How the rules measure words, lines and repeats: `heuristic_counts`.
`HeuristicFilter` is the stage as a `filters.CurationFilter`; `heuristic_filter_step` its step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step, run_filter
from marin_assets.pipeline.curation.heuristic_counts import MEASURES, counts
from marin_assets.pipeline.curation.heuristic_rules import RULE_NAMES, STAGE, HeuristicRules, rule_failures
from marin_assets.pipeline.curation.shards import Shard
from marin_assets.pipeline.curation.stage import CurationResult

__all__ = ["RULE_NAMES", "STAGE", "HeuristicFilter", "HeuristicResult", "HeuristicRules", "failing_rule", "failures",
           "first_failures", "heuristic_filter", "heuristic_filter_step"]

DEFAULT_RULES = HeuristicRules()
"""The papers' thresholds, with the rules too aggressive on real documentation off (`HeuristicRules`)."""
BATCH_CHARACTERS = 1 << 20
"""Documents are measured together in batches of about this many characters (numpy over one buffer)."""


@record_type("heuristic_result")
@dataclass(frozen=True)
class HeuristicResult(CurationResult):
    """A heuristic filter's counts (removed per rule) and the rules it applied."""

    rules: HeuristicRules = field(default_factory=HeuristicRules)
    """The thresholds applied (None: the rule was off)."""
    failing: dict[str, int] = field(default_factory=dict)
    """Per rule: documents failing it, whether or not an earlier rule was their removal reason."""


def failures(texts: Sequence[str], rules: HeuristicRules) -> dict[str, np.ndarray]:
    """For each enabled rule, in field order: which documents fail it (a bool per document).
    Documents are measured in batches of about `BATCH_CHARACTERS`, so memory stays flat."""
    enabled = [name for name in RULE_NAMES if getattr(rules, name) not in (None, False)]
    parts: list[dict[str, np.ndarray]] = []
    begin = size = 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= BATCH_CHARACTERS or i == len(texts) - 1:
            batch = texts[begin:i + 1]
            parts.append(rule_failures(counts(batch, rules), rules))
            begin, size = i + 1, 0
    return {name: np.concatenate([p[name] for p in parts]) if parts else np.zeros(0, dtype=bool) for name in enabled}


def first_failures(failed: dict[str, np.ndarray], documents: int) -> list[str | None]:
    """Per document: the first rule (in field order) it fails, or None to keep it."""
    if not failed:
        return [None] * documents
    names = list(failed)
    matrix = np.stack([failed[n] for n in names])
    first = matrix.argmax(axis=0)
    return [names[first[i]] if matrix[first[i], i] else None for i in range(documents)]


def failing_rule(text: str, rules: HeuristicRules = DEFAULT_RULES) -> str | None:
    """The first rule `text` fails, or None: what the filter decides for one document."""
    return first_failures(failures([text], rules), 1)[0]


@dataclass(frozen=True)
class HeuristicFilter(CurationFilter):
    """Removes each document for the first heuristic rule it fails; counts every rule it fails."""

    rules: HeuristicRules = field(default_factory=HeuristicRules)
    name = STAGE

    def identity(self) -> dict[str, Any]:
        return {"rules": self.rules, "measures": MEASURES}

    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        texts = table.column("text").to_pylist()
        failed = failures(texts, self.rules)
        return Verdicts(first_failures(failed, len(texts)),
                        counters={f"fails:{n}": int(f.sum()) for n, f in failed.items()})

    def result(self, summary: CurationResult) -> HeuristicResult:
        failing = {k.split(":", 1)[1]: v for k, v in summary.counters.items() if k.startswith("fails:")}
        return HeuristicResult.of(summary, rules=self.rules, failing=failing)


def heuristic_filter(output_path: str, dataset_path: str, rules: HeuristicRules = DEFAULT_RULES,
                     workers: int = 1) -> HeuristicResult:
    """Documents of a normalized dataset that pass every enabled heuristic rule (Gopher, C4, FineWeb)."""
    result = run_filter(output_path, dataset_path, HeuristicFilter(rules), workers)
    assert isinstance(result, HeuristicResult)
    return result


def heuristic_filter_step(name: str, dataset: Step, rules: HeuristicRules = DEFAULT_RULES, workers: int = 1,
                          max_removed_fraction: float = 0.5) -> Step:
    """`dataset` without the documents that fail a heuristic rule; every threshold is identity.

    Identity: `rules` (every threshold) and the measures (and `dataset`); not `workers` nor `max_removed_fraction`.
    """
    return filter_step(name, dataset, HeuristicFilter(rules), workers=workers,
                       max_removed_fraction=max_removed_fraction, description=made_by(heuristic_filter))
