"""The source sensor: notice that a download's source changed and refresh what depends on it.

A download of a branch or a URL keeps its identity when the data behind it changes. Each
tick asks every such step for its source's current version (`Step.source_version`: one hub
API call, or one listing per URL) and compares it with the version recorded at its output.
When they differ it requests one run: the download, forced (rewritten in place), and every
step downstream of it — which find their recorded input versions out of date and recompute,
while steps that do not read the download stay cache hits. Pinned sources (a commit sha)
have no source version and are never refreshed.

A followed source is expected to move: its asset carries a freshness policy (`freshness=`, default a week,
warning after a day; `marin_assets.dagster.freshness`), which `build_definitions` reads from the sensor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import dagster as dg

from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.step import Step, walk
from marin_assets.dagster.assets import FORCE_TAG, storage_settings
from marin_assets.dagster.freshness import FOLLOWED_SOURCE_FRESHNESS, followed_metadata
from marin_assets.dagster.naming import asset_key
from marin_assets.dagster.resubmit import MAX_ATTEMPTS, resubmit_lost
from resources.storage import StorageResource

SOURCE_VERSION_TAG = "marin/source_version"


def watched_sources(steps: Sequence[Step]) -> list[Step]:
    """Steps among `steps` (and their deps) whose source can change: those with a source version."""
    return [s for s in walk(steps) if s.source_version is not None]


def downstream_of(step: Step, steps: Sequence[Step]) -> list[Step]:
    """Steps among `steps` (and their deps) that read `step`, directly or not, in dependency order.

    One pass over `walk`'s order (dependencies first): no recursion, however deep the graph."""
    reads: set[str] = set()
    out = []
    for s in walk(steps):
        if any(d == step or d.name in reads for d in s.deps):
            reads.add(s.name)
            out.append(s)
    return out


def source_sensor(
    steps: Sequence[Step],
    *,
    name: str = "marin_source_changes",
    include_downstream: bool = True,
    minimum_interval_seconds: int = 300,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    freshness: dg.FreshnessPolicy | None = FOLLOWED_SOURCE_FRESHNESS,
    max_resubmits: int = MAX_ATTEMPTS,
) -> dg.SensorDefinition:
    """Watch the changing sources among `steps` (and their deps); refresh them and, with
    `include_downstream`, everything built from them.

    A refresh whose run was lost before it ran (the daemon or code server down, its run worker dead) is
    asked again, at most `max_resubmits` times, tagged `marin/resubmitted` (`marin_assets.dagster.resubmit`).

    `freshness`: how often each followed source is expected to bring a new version — the policy its asset
    shows when this sensor is served by `build_definitions` (None: no policy)."""
    watched = watched_sources(steps)
    if not watched:
        raise ValueError("source_sensor: none of these steps has a changing source (a source_version)")
    refresh = {s: [s] + (downstream_of(s, steps) if include_downstream else []) for s in watched}
    targets = {asset_key(t.name) for group in refresh.values() for t in group}

    @dg.sensor(
        name=name,
        asset_selection=dg.AssetSelection.assets(*sorted(targets, key=str)),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Refreshes a download (and what is built from it) when its source changes upstream:"
                    " a new commit on a followed branch, a changed file at a URL.",
        metadata=followed_metadata(watched, freshness),
    )
    def follow_sources(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult:
        prefix, _ = storage_settings(storage)
        requested = json.loads(context.cursor) if context.cursor else {}
        runs = []
        for step in watched:
            try:
                record = read_record(step.output_path_under(prefix))
            except RecordNotAvailableError:
                continue  # never materialized (or being made): nothing to refresh
            try:
                now = step.source_version()  # type: ignore[misc]
            except Exception as e:  # an unreachable source is logged and asked again next tick
                context.log.warning(f"{step.name}: cannot read its source's version: {type(e).__name__}: {e}")
                continue
            if now is None or now == record.content_version or requested.get(step.name_with_hash) == now:
                continue
            context.log.info(f"{step.name}: source changed ({record.content_version} → {now}); refreshing"
                             f" {len(refresh[step])} asset(s)")
            runs.append(dg.RunRequest(
                run_key=f"{step.name_with_hash}@{now}",
                asset_selection=[asset_key(s.name) for s in refresh[step]],
                tags={FORCE_TAG: step.name, SOURCE_VERSION_TAG: now},
            ))
            requested[step.name_with_hash] = now
        runs += resubmit_lost(context, name, max_resubmits)
        return dg.SensorResult(run_requests=runs, cursor=json.dumps(requested, sort_keys=True),
                               skip_reason=None if runs else f"{len(watched)} source(s) unchanged")

    return follow_sources
