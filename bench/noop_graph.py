"""Plain Dagster no-op assets with the shape of another graph: the reference for the demo measures.

The shape (keys, deps, groups) comes as JSON from the file named by `MARIN_BENCH_SHAPE`, so
that this module imports nothing but Dagster — `dagster asset materialize -f bench/noop_graph.py`
is the plain-Dagster process whose memory and time ours is compared with. Its executor is ours
(`build_definitions` runs a run's steps in one process): Dagster's default, a process per step,
would compare two executors rather than our layer with none.
"""

from __future__ import annotations

import functools
import json
import operator
import os

import dagster as dg


def selection_of(text: str) -> dg.AssetSelection:
    """The CLI's `--select` text (comma-separated clauses) as an AssetSelection."""
    return functools.reduce(operator.or_, [dg.AssetSelection.from_string(part) for part in text.split(",")])


def shape_of(definitions: dg.Definitions, selection: str | None = None) -> list[dict]:
    """Keys, deps, groups and check names of the assets `selection` picks in `definitions` (None: every
    materializable asset), in JSON form."""
    graph = definitions.resolve_asset_graph()
    keys = selection_of(selection).resolve(graph) if selection else set(graph.materializable_asset_keys)
    return [{"key": list(key.path), "deps": [list(p.path) for p in graph.get(key).parent_keys if p in keys],
             "group": graph.get(key).group_name, "checks": sorted(c.name for c in graph.get(key).check_keys)}
            for key in sorted(keys)]


def noop_definitions(shape: list[dict], checks: bool = True) -> dg.Definitions:
    """One `@asset` per entry, doing nothing, with the same key, deps, group and (with `checks`)
    asset checks of the same names that pass without looking at anything."""
    assets = []
    for entry in shape:
        key = dg.AssetKey(entry["key"])
        names = entry["checks"] if checks else []

        assets.append(dg.asset(key=key, deps=[dg.AssetKey(d) for d in entry["deps"]], group_name=entry["group"],
                               check_specs=[dg.AssetCheckSpec(n, asset=key) for n in names])(_passing(names)))
    return dg.Definitions(assets=assets, executor=dg.in_process_executor)


def _passing(names: list[str]):
    def body() -> dg.MaterializeResult:
        return dg.MaterializeResult(check_results=[dg.AssetCheckResult(check_name=n, passed=True) for n in names])

    return body


if os.environ.get("MARIN_BENCH_SHAPE"):
    with open(os.environ["MARIN_BENCH_SHAPE"]) as f:
        defs = noop_definitions(json.load(f))
