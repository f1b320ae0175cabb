"""What every curation stage shares: per-item work that survives a crash, counts, the result, the check.

A stage is phases of per-item work (`run_phase`): each item (a shard, a hash bucket) is worked on
once, by this process or a Ray task (`execution.fanout.fan_out`), and its small JSON outcome is
written to `_work/{phase}/{key}.json` *after* its data. A re-run after a crash reads the outcomes
that exist and works only on the rest; a task that died mid-item leaves a stale claim the caller
takes over. The outcomes are summed into a `CurationResult`: documents and bytes in and out, and
removed per reason (rule, duplicate, contaminating evaluation set), shown as tables in the UI.
Stages that decide row by row what to keep are `filters.CurationFilter`s; this module is what they
and the transforming stages (normalize, HTML to text) share.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.estimate import bytes_read_estimate
from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Resources, Step
from marin_assets.execution.fanout import fan_out
from marin_assets.pipeline.curation.shards import CurationError, work_path

T = TypeVar("T")

FORMAT = "curated-parquet-v1"
"""Enters every stage's identity: the layout of `shards`."""


@dataclass(frozen=True)
class Removed:
    """What one reason took out: whole documents, bytes, and documents that only lost a part."""

    documents: int = 0
    bytes: int = 0
    modified: int = 0
    """Documents kept with some of their text removed (a duplicate paragraph, a contaminated one)."""

    def __add__(self, other: Removed) -> Removed:
        return Removed(self.documents + other.documents, self.bytes + other.bytes, self.modified + other.modified)


@dataclass(frozen=True)
class ShardStats:
    """One shard's counts, as a stage wrote it."""

    split: str
    documents_in: int = 0
    bytes_in: int = 0
    documents_out: int = 0
    bytes_out: int = 0
    removed: dict[str, Removed] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    """Stage-specific counts (paragraphs removed, documents marked, …)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardStats:
        return cls(**{**data, "removed": {k: Removed(**v) for k, v in data["removed"].items()}})


@dataclass(frozen=True)
class SplitCount:
    """One split of a stage's output."""

    shards: int
    documents: int
    bytes: int


@record_type("curation_result")
@dataclass(frozen=True)
class CurationResult:
    """What a curation stage did: counts in and out, removed per reason, per split."""

    path: str
    stage: str
    documents_in: int
    bytes_in: int
    documents_out: int
    bytes_out: int
    removed: dict[str, Removed]
    """Per reason: a rule's name, `duplicate`, an evaluation set's name, …"""
    splits: dict[str, SplitCount]
    counters: dict[str, int]

    @classmethod
    def of(cls, summary: CurationResult, **more: Any) -> Self:
        """A stage's own result: `summary`'s counts and the stage's fields `more`."""
        return cls(**{f.name: getattr(summary, f.name) for f in dataclasses.fields(CurationResult)}, **more)


def summarize(stage: str, output_path: str, stats: Iterable[ShardStats]) -> CurationResult:
    """A stage's counts, summed from its shards' (its own result adds its fields: `CurationResult.of`)."""
    stats = list(stats)
    removed: dict[str, Removed] = {}
    counters: dict[str, int] = {}
    splits: dict[str, SplitCount] = {}
    for s in stats:
        for reason, r in s.removed.items():
            removed[reason] = removed.get(reason, Removed()) + r
        for name, n in s.counters.items():
            counters[name] = counters.get(name, 0) + n
        old = splits.get(s.split, SplitCount(0, 0, 0))
        splits[s.split] = SplitCount(old.shards + 1, old.documents + s.documents_out, old.bytes + s.bytes_out)
    documents_out = sum(s.documents_out for s in stats)
    documents_in = sum(s.documents_in for s in stats)
    if documents_in and not documents_out:
        reasons = ", ".join(f"{k}: {v.documents}" for k, v in sorted(removed.items())) or "none recorded"
        raise CurationError(f"{stage}: removed every one of {documents_in} documents ({reasons}); nothing is written"
                            " as a success — loosen the stage's parameters")
    return CurationResult(path=output_path, stage=stage, documents_in=documents_in,
                          bytes_in=sum(s.bytes_in for s in stats), documents_out=documents_out,
                          bytes_out=sum(s.bytes_out for s in stats), removed=dict(sorted(removed.items())),
                          splits=dict(sorted(splits.items())), counters=dict(sorted(counters.items())))


def placed(summary: CurationResult, shards: Mapping[str, int]) -> CurationResult:
    """`summary` counting each split's shards as placed (`shards.place_file_shards`), not per input file."""
    return dataclasses.replace(summary, splits={split: dataclasses.replace(count, shards=shards.get(split, 0))
                                                for split, count in summary.splits.items()})


def run_phase(output_path: str, phase: str, items: Sequence[T], fn: Callable[[T], Any], *,
              key_of: Callable[[T], str], workers: int = 1, name: str | None = None) -> list[Any]:
    """`[fn(item) for item in items]`, each outcome (JSON) kept at `_work/{phase}/{key}.json`, after the
    item's data: items whose outcome exists are not worked on again. Up to `workers` at once (Ray)."""
    done = [work_path(output_path, phase, key_of(item) + ".json") for item in items]
    if len(set(done)) != len(done):
        raise ValueError(f"{phase}: key_of must give each item its own key")
    return fan_out(list(zip(items, done, strict=True)), functools.partial(_once, fn),
                   claim_path_of=lambda pair: pair[1][:-len(".json")] + ".claim", workers=workers,
                   name=name or f"{phase} of {len(items)} items")


def _once(fn: Callable[[T], Any], item_and_done: tuple[T, str]) -> Any:
    item, done = item_and_done
    found = read_bytes(done)
    if found is not None:
        return json.loads(found)
    outcome = fn(item)
    atomic_write(done, json.dumps(outcome).encode())
    return outcome


def removed_fraction_within(max_fraction: float) -> Check:
    """The stage removed at most `max_fraction` of its documents: a stage gone wrong (a bad threshold,
    chained duplicate clusters) fails this check instead of quietly emptying a dataset."""

    def check(output_path: str, result: dict) -> CheckOutcome:
        documents_in = result["documents_in"]
        fraction = 1 - result["documents_out"] / documents_in if documents_in else 0.0
        top = sorted(result["removed"].items(), key=lambda kv: -kv[1]["documents"])[:3]
        reasons = ", ".join(f"{k} {v['documents']}" for k, v in top) or "nothing removed"
        return CheckOutcome(fraction <= max_fraction,
                            f"removed {fraction:.1%} of {documents_in} documents (limit {max_fraction:.0%}): {reasons}",
                            {"removed_fraction": round(fraction, 6), "limit": max_fraction})

    return Check("removed_fraction_within", check,
                 f"The stage removed at most {max_fraction:.0%} of its input documents.", blocking=True)


def curation_step(name: str, stage: str, fn: Callable[[str], Any], dataset: Step, hash_attrs: dict[str, Any], *,
                  description: str, max_removed_fraction: float = 0.5, cpu: float = 1,
                  more_deps: Sequence[Step] = (), kinds: Sequence[str] = ("parquet",)) -> Step:
    """A curation stage over `dataset` (and `more_deps`) as a step: `hash_attrs` are what changes its
    output; `max_removed_fraction` (not identity) is the catastrophic-removal check's limit."""
    return Step(name=name, fn=fn, deps=[dataset, *more_deps],
                hash_attrs={"stage": stage, **hash_attrs, "format": FORMAT}, resources=Resources(cpu=cpu),
                kind="curate", kinds=list(kinds), description=description,
                checks=[removed_fraction_within(max_removed_fraction)],
                estimate=bytes_read_estimate(f"curate/{stage}", lambda: [dataset]))
