"""Ask again for work whose run was lost to the infrastructure, never for a step's own failure.

A sensor's run request can be lost after the sensor made it: the daemon or the code server went down
while the run was being dequeued or launched (the run ends `FAILURE` before any step started), or the
process running it died with it (a `STARTED` run whose local run worker is gone stays `STARTED` forever
under Dagster's default launcher, which cannot check a worker's health). The run queue's own retries
(`max_user_code_failure_retries`) and Dagster's run retries (`run_retries`, not on a step's failure) cover
most of it; what they miss, a sensor that made the requests covers here, each tick:

- a run of the sensor still `STARTED` whose run worker (a process on this machine) is gone is marked
  failed, naming the process — then it is lost work like any other;
- a request whose latest run failed without a step failure (no step started, or its worker was lost), with
  no run of the same request succeeded, in progress or about to be retried by Dagster, is asked again under
  a new run key, at most `max_attempts` times, with the tags `marin/resubmitted` (the attempt) and
  `marin/resubmitted_after` (the lost run);
- a run in which a step failed is never asked again: its error is the step's, and a rerun is a person's
  decision (or Dagster's run retries, if they are set to retry step failures).

The sensors' requests carry run keys; a resubmission's run key is the original's with `#resubmit-N`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from marin_assets.core.status import process_alive

RESUBMITTED_TAG = "marin/resubmitted"
"""The attempt number of a request asked again after its run was lost (1, 2, …)."""
RESUBMITTED_AFTER_TAG = "marin/resubmitted_after"
"""The run id of the lost run a resubmission replaces."""
WORKER_LOST = "run worker lost"
"""The start of the failure message of a run whose worker died (`fail_runs_with_lost_workers`)."""
MAX_ATTEMPTS = 3
"""How many times a sensor asks again for one request by default."""
_SENSOR_TAG = "dagster/sensor_name"
_RUN_KEY_TAG = "dagster/run_key"
_WILL_RETRY_TAG = "dagster/will_retry"
_FAILURE_REASON_TAG = "dagster/failure_reason"
_KEPT_DAGSTER_TAGS = {"dagster/priority", "dagster/max_retries", "dagster/retry_strategy", "dagster/max_runtime"}
"""Dagster's tags a user sets on a request (Dagster's own bookkeeping tags are not copied to a resubmission)."""
_RESUBMIT_SUFFIX = re.compile(r"#resubmit-\d+$")
_WORKER_PID = re.compile(r"Started process for run \(pid: (\d+)\)")
_IN_PROGRESS = {dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.MANAGED}


def request_key(run: dg.DagsterRun) -> str | None:
    """The run key of the request `run` served (a resubmission's and a Dagster retry's included)."""
    key = run.tags.get(_RUN_KEY_TAG)
    return _RESUBMIT_SUFFIX.sub("", key) if key else None


def step_failed(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Whether a step of `run` failed on its own (a failure of the step, not of the run around it)."""
    if run.tags.get(_FAILURE_REASON_TAG) == "STEP_FAILURE":
        return True
    failures = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE, limit=1)
    return bool(failures.records)


def worker_pid(instance: dg.DagsterInstance, run: dg.DagsterRun) -> int | None:
    """The pid of `run`'s run worker, from the engine event Dagster's run worker writes when it starts."""
    events = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT, limit=50).records
    for record in events:
        match = _WORKER_PID.search(record.event_log_entry.message or "")
        if match:
            return int(match.group(1))
    return None


def fail_runs_with_lost_workers(instance: dg.DagsterInstance, runs: Iterable[dg.DagsterRun],
                                log: Any = None) -> list[str]:
    """Mark failed each `STARTED` run among `runs` whose run worker, a process on this machine, is gone.

    Only where runs are launched as local processes (Dagster's `DefaultRunLauncher`): a run launched
    elsewhere (a container, another machine) has no pid here and is left to its launcher's monitoring.
    Returns the run ids marked failed."""
    if not isinstance(instance.run_launcher, dg.DefaultRunLauncher):
        return []
    failed = []
    for run in runs:
        if run.status is not dg.DagsterRunStatus.STARTED:
            continue
        pid = worker_pid(instance, run)
        if pid is None or process_alive(pid):
            continue
        current = instance.get_run_by_id(run.run_id)
        if current is None or current.status is not dg.DagsterRunStatus.STARTED:
            continue  # it finished after all
        message = f"{WORKER_LOST}: its process (pid {pid}) is gone, but the run was never marked finished"
        instance.report_run_failed(current, message)
        failed.append(run.run_id)
        if log is not None:
            log.warning(f"run {run.run_id}: {message}")
    return failed


def _lost_by_worker(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    records = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE, limit=5).records
    return any((r.event_log_entry.message or "").startswith(WORKER_LOST) for r in records)


@dataclass(frozen=True)
class Resubmission:
    """A request to ask again: the lost run and the attempt this will be."""

    lost: dg.DagsterRun
    attempt: int

    def run_request(self) -> dg.RunRequest:
        """The lost run's request again: its assets, partition and own tags, a new run key, the attempt tagged."""
        run = self.lost
        tags = {k: v for k, v in run.tags.items() if not k.startswith("dagster/") or k in _KEPT_DAGSTER_TAGS}
        tags.update({RESUBMITTED_TAG: str(self.attempt), RESUBMITTED_AFTER_TAG: run.run_id})
        return dg.RunRequest(run_key=f"{request_key(run)}#resubmit-{self.attempt}",
                             asset_selection=sorted(run.asset_selection or (), key=str) or None,
                             partition_key=run.tags.get("dagster/partition"), tags=tags)


def lost_requests(instance: dg.DagsterInstance, sensor_name: str, *, max_attempts: int = MAX_ATTEMPTS,
                  retry_grace_s: float = 300.0, log: Any = None,
                  limit: int = 1000) -> list[Resubmission]:
    """The requests of sensor `sensor_name` whose run was lost, to ask again (see the module's docstring).

    `retry_grace_s`: a failed run that Dagster's run retries said they would retry is left to them for this
    long; after it, with still no retry run, it is asked again here."""
    runs = list(instance.get_runs(filters=dg.RunsFilter(tags={_SENSOR_TAG: sensor_name}), limit=limit))
    if fail_runs_with_lost_workers(instance, runs, log):
        runs = list(instance.get_runs(filters=dg.RunsFilter(tags={_SENSOR_TAG: sensor_name}), limit=limit))
    by_request: dict[str, list[dg.DagsterRun]] = {}
    for run in runs:
        key = request_key(run)
        if key is not None:
            by_request.setdefault(key, []).append(run)
    out = []
    for key, group in by_request.items():
        if any(r.status is dg.DagsterRunStatus.SUCCESS or r.status in _IN_PROGRESS for r in group):
            continue
        latest = group[0]  # get_runs: newest first
        if latest.status is not dg.DagsterRunStatus.FAILURE or _left_to_dagster(instance, latest, retry_grace_s):
            continue
        if step_failed(instance, latest) and not _lost_by_worker(instance, latest):
            continue
        attempts = max((int(r.tags.get(RESUBMITTED_TAG, "0")) for r in group), default=0)
        if attempts >= max_attempts:
            if log is not None:
                log.warning(f"{key}: its run {latest.run_id} was lost and {attempts} resubmission(s) were too;"
                            " not asking again")
            continue
        out.append(Resubmission(latest, attempts + 1))
        if log is not None:
            log.info(f"{key}: its run {latest.run_id} failed before its work did (lost to the infrastructure);"
                     f" asking again (attempt {attempts + 1} of {max_attempts})")
    return out


def _left_to_dagster(instance: dg.DagsterInstance, run: dg.DagsterRun, grace_s: float) -> bool:
    """Whether Dagster's run retries will retry `run` (and have had less than `grace_s` to do it)."""
    if run.tags.get(_WILL_RETRY_TAG) != "true" or not instance.run_retries_enabled:
        return False
    record = instance.get_run_record_by_id(run.run_id)
    ended = record.end_time if record is not None and record.end_time else time.time()
    return time.time() - ended < grace_s


def resubmit_lost(context: dg.SensorEvaluationContext, sensor_name: str,
                  max_attempts: int = MAX_ATTEMPTS) -> list[dg.RunRequest]:
    """The run requests a sensor adds to its tick to ask again for its lost work (none without an instance:
    a sensor evaluated on its own, as in a unit test)."""
    if context.instance_ref is None and getattr(context, "_instance", None) is None:
        return []
    return [r.run_request() for r in lost_requests(context.instance, sensor_name, max_attempts=max_attempts,
                                                   log=context.log)]
