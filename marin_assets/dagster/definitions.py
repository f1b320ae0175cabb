"""`build_definitions`: the `Definitions` serving a list of steps, with resources, sensors, schedules."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from marin_assets.core.paths import default_prefix
from marin_assets.core.step import Step, walk
from marin_assets.dagster.assets import RAY_KEY, STORAGE_KEY, build_assets, step_of
from marin_assets.dagster.drift import drifts_from_instance
from marin_assets.dagster.freshness import followed_freshness, without_finished_runs
from resources.ray import RayResource
from resources.storage import StorageResource

LARGE_GRAPH = 1000
"""From this many assets, `build_definitions` also builds the repository (asset graph, asset
job, job snapshot) right away with the garbage collector paused, and freezes what it built."""


def build_definitions(
    steps: Sequence[Step],
    resources: Mapping[str, Any] | None = None,
    *,
    automation: Mapping[Step, dg.AutomationCondition] | None = None,
    extra_assets: Sequence[dg.AssetsDefinition] = (),
    describe_drift: bool = False,
    **definitions_kwargs: Any,
) -> dg.Definitions:
    """`Definitions` serving `steps`, with default storage and Ray resources unless given.

    The default executor runs a run's steps in one process, so the run shares one embedded
    Ray (started on first use, stopped at the end); the work itself runs on Ray workers.
    `extra_assets` are assets made elsewhere, such as per-checkpoint evaluations; sensors and
    schedules go in `definitions_kwargs`. `describe_drift` reads the Dagster instance (one
    query) so that assets whose identity changed since their last materialization say how
    in their description; it is read when the definitions load (the UI's "Reload").

    Freshness (`marin_assets.dagster.freshness`): the sources a source sensor among `sensors` follows get
    its policy; a per-checkpoint family whose training has finished — its output SUCCESS as the definitions
    load, one status read per family — loses its own.
    """
    all_resources = {STORAGE_KEY: StorageResource(), RAY_KEY: RayResource(), **(resources or {})}
    definitions_kwargs.setdefault("executor", dg.in_process_executor)
    storage = all_resources[STORAGE_KEY]
    prefix = getattr(storage, "prefix", None) or default_prefix()
    extra_kinds = ["gcs"] if prefix.startswith("gs://") else []
    all_steps = walk(steps)
    allow_recursion_for(all_steps)
    drift = drifts_from_instance(all_steps) if describe_drift else None
    other_names = ["/".join(k.path) for a in extra_assets for k in a.keys]
    freshness = followed_freshness(definitions_kwargs.get("sensors") or ())
    with collector_paused():
        assets = [*build_assets(all_steps, automation, extra_kinds=extra_kinds, drift=drift, other_names=other_names,
                                freshness=freshness),
                  *without_finished_runs(extra_assets, prefix)]
        definitions = dg.Definitions(assets=assets, resources=all_resources, **definitions_kwargs)
        if len(assets) >= LARGE_GRAPH:
            prebuild(definitions)
            gc.freeze()
    return definitions


def graph_depth(steps: Sequence[Step]) -> int:
    """The longest dependency chain among `steps` (given dependencies first, as `walk` returns them)."""
    depth: dict[str, int] = {}
    for step in steps:
        depth[step.name] = 1 + max((depth.get(d.name, 0) for d in step.deps), default=0)
    return max(depth.values(), default=0)


def allow_recursion_for(steps: Sequence[Step]) -> None:
    """Raise the interpreter's recursion limit (never lower it) so that Dagster can build the job of
    a graph this deep: its graph code walks dependencies recursively, one or two frames per level
    (a 3,000-step chain needs ~4,000). Our own walking, hashing and planning are iterative.
    Python 3.11 runs Python-to-Python calls without growing the C stack, so the higher limit is safe."""
    needed = 2 * graph_depth(steps) + 2000
    if needed > sys.getrecursionlimit():
        sys.setrecursionlimit(needed)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while definitions are built.

    A 10,000-step sweep is millions of long-lived objects and almost no garbage; each full
    collection walks all of them again, which was a third of its load time
    (bench/adapter_overhead.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def prebuild(definitions: dg.Definitions) -> None:
    """Build (and cache on `definitions`) the repository, its jobs and their snapshots — what a
    code server computes next anyway — while the collector is paused. Once frozen, later full
    collections skip these objects (they live as long as the definitions)."""
    for job in definitions.get_repository_def().get_all_jobs():
        job.get_job_index()


def steps_of(definitions: dg.Definitions) -> dict[dg.AssetKey, Step]:
    """Asset key → step for every (unpartitioned) step asset in `definitions`."""
    out: dict[dg.AssetKey, Step] = {}
    for assets_def in definitions.resolve_asset_graph().assets_defs:
        step = step_of(assets_def)
        if step is not None:
            out[assets_def.key] = step
    return out
