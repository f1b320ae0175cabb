"""The instance settings of the tests that run the Dagster daemon: the project's (`marin_assets/dagster/
instance.py`), with the run queue's intervals shortened so a test does not wait on Dagster's defaults."""

from typing import Any

import dagster as dg

from marin_assets.dagster.instance import instance_settings
from tests.support.helpers import wait_for


def daemon_settings(max_concurrent_runs: int = 2, start_timeout_s: int = 45) -> dict[str, Any]:
    """The project's settings as a `QueuedRunCoordinator`'s config (which also takes the dequeue interval):
    the same user-code retries, 1 s apart instead of 5; runs dequeued every second; a run not started after
    `start_timeout_s` failed (and so retried)."""
    settings = instance_settings(run_monitoring={"enabled": True, "start_timeout_seconds": start_timeout_s,
                                                 "poll_interval_seconds": 2})
    queue = settings.pop("run_queue")
    settings["run_coordinator"] = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator",
                                   "config": {**queue, "user_code_failure_retry_delay": 1,
                                              "max_concurrent_runs": max_concurrent_runs,
                                              "dequeue_interval_seconds": 1}}
    return settings


def sensor_ticks(instance: dg.DagsterInstance, sensor: str) -> int:
    """How many ticks of `sensor` the daemon has recorded."""
    [state] = [s for s in instance.all_instigator_state() if s.name == sensor]
    return len(instance.get_ticks(state.instigator_origin_id, state.selector_id))


def wait_for_ticks(instance: dg.DagsterInstance, sensor: str, more: int = 3, timeout: float = 60.0) -> None:
    """Wait until the daemon has ticked `sensor` `more` more times: what a late request would show in."""
    seen = sensor_ticks(instance, sensor)
    wait_for(lambda: sensor_ticks(instance, sensor) >= seen + more, f"{more} more ticks of {sensor}",
             timeout=timeout, interval=0.2)
