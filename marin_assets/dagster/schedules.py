"""The refresh schedule: on a cron, materialize only the assets of a selection that are unsynced.

"Unsynced" is Dagster's own verdict (the stale-status resolver behind the UI's "Materialize
unsynced"): never materialized, or the code version (identity hash) or an upstream data
version differs from the last materialization. When everything is up to date the tick is
skipped and no run starts.
"""

from __future__ import annotations

import dagster as dg

UNSYNCED_TAG = "marin/unsynced"
"""Run tag: how many assets the tick found unsynced."""


def stale_or_missing(instance: dg.DagsterInstance, repository_def: dg.RepositoryDefinition,
                     keys: list[dg.AssetKey]) -> set[dg.AssetKey]:
    """The `keys` Dagster itself calls STALE or MISSING (the UI's "unsynced"), read from `instance`.

    Private API, pinned `dagster==1.13.27`: `CachingStaleStatusResolver` and the `LoadingContext` it
    reads through (`dagster._core.definitions.data_version`, `dagster._core.loader`). No public API
    answers this inside a schedule evaluation: `RunRequest(stale_assets_only=True)` narrows a
    request only later, in the daemon (so a tick could neither skip nor say what it found), and the
    automation conditions `code_version_changed()` / `missing()` compare with their previous
    evaluation's cursor, not with the last materialization. Pinned by `tests/test_private_apis.py`.
    """
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContext

    class InstanceLoadingContext(LoadingContext):
        """The batching cache the resolver reads the instance through, for one call."""

        def __init__(self) -> None:
            self._loaders: dict = {}

        @property
        def instance(self) -> dg.DagsterInstance:
            return instance

        @property
        def loaders(self) -> dict:
            return self._loaders

    resolver = CachingStaleStatusResolver(instance, repository_def.asset_graph, InstanceLoadingContext())
    return {k for k in keys if resolver.get_status(k) in (StaleStatus.STALE, StaleStatus.MISSING)}


def unsynced_keys(instance: dg.DagsterInstance, repository_def: dg.RepositoryDefinition,
                  selection: dg.AssetSelection) -> list[dg.AssetKey]:
    """Unpartitioned assets of `selection` that are missing or stale, in key order."""
    graph = repository_def.asset_graph
    keys = [k for k in selection.resolve(graph) if not graph.get(k).is_partitioned]
    return sorted(stale_or_missing(instance, repository_def, keys), key=lambda k: k.to_user_string())


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
