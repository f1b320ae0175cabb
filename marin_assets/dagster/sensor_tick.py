"""One tick of a sensor without the daemon: evaluate it once and run what it requests, here.

`make demo` uses it so the per-checkpoint evaluation partitions are materialized before the UI
is first opened, and a cron job or CI can use it where no daemon runs. It does what the daemon
does in one tick — add the dynamic partitions the sensor asks for, then launch one run per run
request (its assets, partition and tags) — except that runs execute in this process, one after
another, recorded in the instance like any run. A request whose run key already has a successful
run of this sensor is skipped, so a second tick does nothing; the cursor is not kept (the
sensor starts from none each time, as on its first daemon tick).
"""

from __future__ import annotations

import dataclasses

import dagster as dg

SENSOR_NAME_TAG = "dagster/sensor_name"
RUN_KEY_TAG = "dagster/run_key"


@dataclasses.dataclass(frozen=True)
class TickRun:
    """One run request of the tick and what came of it."""

    run_key: str | None
    """The request's run key (None: the sensor gave none)."""
    partition_key: str | None
    """The partition it materializes, if any."""
    assets: tuple[str, ...]
    """The asset keys it selects, `a/b` form."""
    outcome: str
    """`succeeded`, `failed` or `skipped` (its run key already succeeded)."""
    run_id: str | None = None
    """The Dagster run, when one was launched."""


def already_succeeded(instance: dg.DagsterInstance, sensor: str, run_key: str) -> bool:
    runs = instance.get_runs(filters=dg.RunsFilter(tags={SENSOR_NAME_TAG: sensor, RUN_KEY_TAG: run_key},
                                                   statuses=[dg.DagsterRunStatus.SUCCESS]), limit=1)
    return bool(runs)


def tick_sensor(defs: dg.Definitions, name: str, instance: dg.DagsterInstance) -> tuple[list[TickRun], str | None]:
    """Evaluate sensor `name` of `defs` once and run its requests in this process, in order.

    Returns each request's outcome and the sensor's skip reason (None when it requested runs).
    A failed run does not stop the others; the caller decides what a failure means.
    """
    sensor = defs.resolve_sensor_def(name)
    with dg.build_sensor_context(instance=instance, sensor_name=name, resources=defs.resources or {},
                                 definitions=defs) as context:  # resources such as Ray are context managers
        result = sensor(context)
    if isinstance(result, dg.SkipReason):
        return [], result.skip_message
    if isinstance(result, dg.RunRequest):
        result = dg.SensorResult(run_requests=[result])
    if not isinstance(result, dg.SensorResult):  # a generator or a list of run requests
        requests = list(result or [])
        result = dg.SensorResult(run_requests=[r for r in requests if isinstance(r, dg.RunRequest)])
    for change in result.dynamic_partitions_requests or ():
        if isinstance(change, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(change.partitions_def_name, list(change.partition_keys))
        else:
            for key in change.partition_keys:
                instance.delete_dynamic_partition(change.partitions_def_name, key)
    job = defs.resolve_implicit_global_asset_job_def()
    runs: list[TickRun] = []
    for request in result.run_requests or ():
        if request.asset_selection is not None:
            keys = list(request.asset_selection)
        elif sensor.asset_selection is not None:
            keys = sorted(sensor.asset_selection.resolve(defs.resolve_asset_graph()))
        else:
            raise ValueError(f"sensor {name!r}: a run request without assets, and the sensor targets none")
        done = TickRun(request.run_key, request.partition_key, tuple(k.to_user_string() for k in keys), "skipped")
        if request.run_key and already_succeeded(instance, name, request.run_key):
            runs.append(done)
            continue
        tags = {**request.tags, SENSOR_NAME_TAG: name, **({RUN_KEY_TAG: request.run_key} if request.run_key else {})}
        run = job.execute_in_process(instance=instance, asset_selection=keys, partition_key=request.partition_key,
                                     tags=tags, raise_on_error=False)
        runs.append(dataclasses.replace(done, outcome="succeeded" if run.success else "failed", run_id=run.run_id))
    reason = result.skip_reason
    skip = (reason.skip_message if isinstance(reason, dg.SkipReason) else reason) if not runs else None
    return runs, skip
