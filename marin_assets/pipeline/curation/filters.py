"""The curation filter seam: a stage that decides, row by row, which documents of a shard to keep.

A filter is three things (as in datatrove's `BaseFilter`, whose filter is one method, but on a whole
shard at once, so a rule can be measured in numpy over every row):

- `name`: the stage (`heuristic_filter`, `quality_filter`, …): it names the stage in identity, in
  the result and in every error message;
- `identity()`: every setting that changes what it keeps — the step's `hash_attrs`;
- `decide(table, shard)`: for each row of the shard's `pyarrow.Table` (`id`, `text`, `source` and
  whatever earlier stages added) None to keep it or the reason it is removed (`Verdicts`), and
  optionally new texts (a paragraph taken out), columns to add (a score) and counters.

Optional hooks: `deps()`, the steps it reads besides the dataset (a classifier, evaluation sets);
`prepare(output_path, shards, workers)`, a pass over the whole dataset before any shard is decided (a
score quantile, an evaluation-set index, duplicate clusters), returning the filter that decides (itself,
or a copy carrying what the pass found); `result(summary)`, its typed `CurationResult`.

`run_filter` prepares the filter, then rewrites every shard without its removed rows (resumable per
shard, fanned out over Ray: filters travel to Ray tasks, so keep them plain picklable data, such as
frozen dataclasses) and sums the counts per reason; `filter_step` makes that a step.
"""

from __future__ import annotations

import contextlib
import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.curation.shards import Shard, list_shards, read_shard, returning_memory, write_shard
from marin_assets.pipeline.curation.stage import (
    CurationResult,
    Removed,
    ShardStats,
    curation_step,
    run_phase,
    summarize,
)

SHARDS_PHASE = "shards"
"""The phase that rewrites the shards: its outcomes are `_work/shards/{split}-NNNNN.json`."""


@dataclass
class Verdicts:
    """What a filter decided about one shard's rows."""

    removed: list[str | None]
    """Per row: None to keep it, or the reason it is removed."""
    texts: list[str] | None = None
    """New texts (a paragraph taken out), or None when no text changes."""
    modified: list[str | None] | None = None
    """Per row: the reason its text changed, or None."""
    columns: dict[str, pa.Array | pa.ChunkedArray | np.ndarray | list[Any]] = field(default_factory=dict)
    """Columns to add or replace (a score, a mark), one value per row."""
    counters: dict[str, int] = field(default_factory=dict)


class CurationFilter(ABC):
    """Decides per row of a shard what to keep; `filter_step` makes a step of it (see the module)."""

    name: str
    """The stage's name: in identity (`stage`), the result and every message."""
    kinds: tuple[str, ...] = ("parquet",)
    """The step's kind tags (the technologies it uses)."""
    returns_memory: bool = False
    """Whether the stage allocates Arrow memory from a pool that gives freed pages back at once
    (`shards.returning_memory`): for a stage whose passes over every shard would otherwise keep memory that grows
    with the corpus (fuzzy dedup), at some speed; the others keep Arrow's faster default pool."""

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Every setting that changes the output (the step's hash_attrs, beside `stage` and the format)."""

    @abstractmethod
    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        """The verdict on each row of `table`, the contents of `shard` (one verdict per row)."""

    def deps(self) -> Sequence[Step]:
        """Steps it reads besides the dataset (their identities enter the step's through its deps)."""
        return ()

    def prepare(self, output_path: str, shards: Sequence[Shard], workers: int) -> CurationFilter:
        """A pass over every shard before any is decided; the filter that decides (by default, this one).
        Bookkeeping goes under `shards.work_path(output_path, …)`, in resumable `stage.run_phase`s."""
        return self

    def result(self, summary: CurationResult) -> CurationResult:
        """What the stage records: the summed counts, and whatever the filter adds (`CurationResult.of`)."""
        return summary


def rewrite_shard(output_path: str, chosen: CurationFilter, shard: Shard) -> dict[str, Any]:
    """Read `shard`, apply `chosen.decide`'s verdicts, write the kept rows under `output_path`; its counts (JSON)."""
    table = read_shard(chosen.name, shard.path)
    rows = table.num_rows
    verdicts = chosen.decide(table, shard)
    if len(verdicts.removed) != rows:
        raise ValueError(f"{chosen.name}: {len(verdicts.removed)} verdicts for {rows} rows of {shard.path}")
    size_in = pc.binary_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)
    removed: dict[str, Removed] = {}
    if verdicts.texts is not None:
        table = table.set_column(table.column_names.index("text"), "text", pa.array(verdicts.texts, pa.string()))
    size_out = pc.binary_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)
    for row, reason in enumerate(verdicts.modified or ()):
        if reason is not None and verdicts.removed[row] is None:
            removed[reason] = removed.get(reason, Removed()) + Removed(0, int(size_in[row] - size_out[row]), 1)
    for row, reason in enumerate(verdicts.removed):
        if reason is not None:
            removed[reason] = removed.get(reason, Removed()) + Removed(1, int(size_in[row]), 0)
    for name, values in verdicts.columns.items():
        column = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values)
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, column)
        else:
            table = table.append_column(name, column)
    keep = np.array([r is None for r in verdicts.removed], dtype=bool)
    kept = table.filter(pa.array(keep)) if rows else table
    write_shard(kept, shard.output_under(output_path))
    return ShardStats(shard.split, rows, int(size_in.sum()), kept.num_rows, int(size_out[keep].sum()), removed,
                      dict(verdicts.counters)).to_json()


def run_filter(output_path: str, dataset_path: str, chosen: CurationFilter, workers: int = 1) -> CurationResult:
    """`dataset_path`'s shards without the rows `chosen` removes, written to `output_path`: prepared, then
    every shard rewritten (resumable, up to `workers` at once on Ray), counted per reason (on the returning pool
    where the filter `returns_memory`)."""
    shards = list_shards(chosen.name, dataset_path)
    with returning_memory() if chosen.returns_memory else contextlib.nullcontext():
        deciding = chosen.prepare(output_path, shards, workers)
        outcomes = run_phase(output_path, SHARDS_PHASE, shards,
                             functools.partial(rewrite_shard, output_path, deciding),
                             key_of=lambda s: s.key, workers=workers, name=f"{chosen.name} of {len(shards)} shards")
    return deciding.result(summarize(chosen.name, output_path, [ShardStats.from_json(o) for o in outcomes]))


def filter_step(name: str, dataset: Step, chosen: CurationFilter, *, workers: int = 1,
                max_removed_fraction: float = 0.5, description: str | None = None) -> Step:
    """`dataset` (curated shards) through `chosen` as a step.

    Identity: the stage, `chosen.identity()`, the format and the deps (`dataset`, `chosen.deps()`); not `workers`
    nor `max_removed_fraction`, the limit of its catastrophic-removal check.
    """
    return curation_step(name, chosen.name, lambda out: run_filter(out, dataset.output_path, chosen, workers),
                         dataset, chosen.identity(), description=description or made_by(type(chosen)),
                         max_removed_fraction=max_removed_fraction, more_deps=chosen.deps(), kinds=chosen.kinds)
