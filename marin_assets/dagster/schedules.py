"""The refresh schedule: on a cron, materialize only the assets of a selection that are unsynced.

"Unsynced" is Dagster's own verdict (the stale-status resolver behind the UI's "Materialize
unsynced"): never materialized, or the code version (identity hash) or an upstream data
version differs from the last materialization. When everything is up to date the tick is
skipped and no run starts.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContext

UNSYNCED_TAG = "marin/unsynced"
"""Run tag: how many assets the tick found unsynced."""


class _InstanceLoadingContext(LoadingContext):
    """The batching cache the stale-status resolver reads the instance through, for one tick."""

    def __init__(self, instance: dg.DagsterInstance):
        self._instance = instance
        self._loaders: dict = {}

    @property
    def instance(self) -> dg.DagsterInstance:
        return self._instance

    @property
    def loaders(self) -> dict:
        return self._loaders


def unsynced_keys(instance: dg.DagsterInstance, repository_def: dg.RepositoryDefinition,
                  selection: dg.AssetSelection) -> list[dg.AssetKey]:
    """Unpartitioned assets of `selection` that are missing or stale, in key order."""
    graph = repository_def.asset_graph
    keys = [k for k in selection.resolve(graph) if not graph.get(k).is_partitioned]
    resolver = CachingStaleStatusResolver(instance, graph, _InstanceLoadingContext(instance))
    return sorted((k for k in keys if resolver.get_status(k) in (StaleStatus.STALE, StaleStatus.MISSING)),
                  key=lambda k: k.to_user_string())


def unsynced_schedule(
    selection: dg.AssetSelection,
    cron_schedule: str,
    *,
    name: str = "marin_refresh_unsynced",
    execution_timezone: str = "UTC",
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> dg.ScheduleDefinition:
    """A schedule that brings the unsynced assets of `selection` up to date (off until started)."""

    @dg.schedule(
        name=name,
        cron_schedule=cron_schedule,
        execution_timezone=execution_timezone,
        target=selection,
        default_status=default_status,
        description="Materializes the unsynced (missing or stale) assets of its selection; skips when none are.",
    )
    def refresh_unsynced(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        keys = unsynced_keys(context.instance, context.repository_def, selection)
        if not keys:
            return dg.SkipReason("every selected asset is up to date")
        context.log.info(f"unsynced: {', '.join(k.to_user_string() for k in keys)}")
        return dg.RunRequest(asset_selection=keys, tags={UNSYNCED_TAG: str(len(keys))})

    return refresh_unsynced
