"""Sensors ask again for work lost to the infrastructure, never for a step's own failure
(`marin_assets.dagster.resubmit`), on a real instance with the project's settings: runs failed the way the
daemon fails them (at dequeue, with their worker gone), a real step failure, Dagster's own run retries."""

from __future__ import annotations

import inspect
import subprocess
import sys

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

from marin_assets.dagster.resubmit import (
    MAX_ATTEMPTS,
    RESUBMITTED_AFTER_TAG,
    RESUBMITTED_TAG,
    WORKER_LOST,
    lost_requests,
)

SENSOR = "marin_test_sensor"
KEY = dg.AssetKey(["evals", "lost"])


@pytest.fixture
def instance(dagster_home):
    with dg.DagsterInstance.get() as instance:
        yield instance


def request_run(instance, status=dg.DagsterRunStatus.NOT_STARTED, run_key="train:5", **tags) -> dg.DagsterRun:
    """A run as the daemon makes it for the sensor's request of checkpoint 5 (not yet started: a queued run
    needs a code location's origin, which a test instance has none of)."""
    return create_run_for_test(instance, status=status, asset_selection=frozenset({KEY}), tags={
        "dagster/sensor_name": SENSOR, "dagster/run_key": run_key, "dagster/partition": "5",
        "marin/checkpoint": "5", **tags})


def lost_at_dequeue(instance, retries_left: bool = False, **kwargs) -> dg.DagsterRun:
    """A run failed as the daemon fails one it could not hand to the code server; by default one that Dagster's
    run retries will not retry (they are used up: `dagster/max_retries` 0)."""
    run = request_run(instance, **({} if retries_left else {"dagster/max_retries": "0"}), **kwargs)
    instance.report_run_failed(run, "Caught an unrecoverable error while dequeuing the run")
    return run


def test_a_run_lost_at_dequeue_is_asked_again_tagged_and_a_bounded_number_of_times(instance):
    first = lost_at_dequeue(instance)
    assert instance.get_run_by_id(first.run_id).tags["dagster/will_retry"] == "false"
    [again] = lost_requests(instance, SENSOR)
    assert again.attempt == 1 and again.lost.run_id == first.run_id
    request = again.run_request()
    assert request.run_key == "train:5#resubmit-1" and request.partition_key == "5"
    assert list(request.asset_selection) == [KEY]
    assert request.tags == {"marin/checkpoint": "5", RESUBMITTED_TAG: "1", RESUBMITTED_AFTER_TAG: first.run_id,
                            "dagster/max_retries": "0"}

    for attempt in range(1, MAX_ATTEMPTS + 1):  # each resubmission lost in turn
        lost_at_dequeue(instance, run_key=f"train:5#resubmit-{attempt}", **{RESUBMITTED_TAG: str(attempt)})
        again = lost_requests(instance, SENSOR)
        assert [a.attempt for a in again] == ([attempt + 1] if attempt < MAX_ATTEMPTS else [])


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.NOT_STARTED,
                                    dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED])
def test_a_request_with_a_run_succeeded_or_in_progress_is_not_asked_again(instance, status):
    lost_at_dequeue(instance)
    request_run(instance, status=status, run_key="train:5#resubmit-1", **{RESUBMITTED_TAG: "1"})
    assert lost_requests(instance, SENSOR) == []


def test_a_steps_own_failure_is_never_asked_again(instance):
    @dg.asset(key=KEY)
    def lost():
        raise ValueError("the step's own error")

    result = dg.materialize([lost], instance=instance, raise_on_error=False,
                            tags={"dagster/sensor_name": SENSOR, "dagster/run_key": "train:5"})
    assert not result.success
    assert lost_requests(instance, SENSOR) == []
    lost_at_dequeue(instance, run_key="train:6")  # while a lost neighbour is
    assert [a.run_request().run_key for a in lost_requests(instance, SENSOR)] == ["train:6#resubmit-1"]


def test_a_run_dagsters_retries_will_retry_is_left_to_them_for_a_while(instance):
    assert instance.run_retries_enabled  # the project's settings (marin_assets/dagster/instance.py)
    run = lost_at_dequeue(instance, retries_left=True)
    assert instance.get_run_by_id(run.run_id).tags["dagster/will_retry"] == "true"
    assert lost_requests(instance, SENSOR) == []
    assert [a.attempt for a in lost_requests(instance, SENSOR, retry_grace_s=0.0)] == [1]  # none came


def test_a_started_run_whose_worker_is_gone_is_failed_and_asked_again(instance):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = request_run(instance, status=dg.DagsterRunStatus.STARTED, **{"dagster/max_retries": "0"})
    instance.report_engine_event(f"Started process for run (pid: {gone.pid}).", dead)
    alive = request_run(instance, status=dg.DagsterRunStatus.STARTED, run_key="train:6")
    instance.report_engine_event(f"Started process for run (pid: {subprocess.os.getpid()}).", alive)

    [again] = lost_requests(instance, SENSOR)
    assert again.lost.run_id == dead.run_id
    assert instance.get_run_by_id(dead.run_id).status is dg.DagsterRunStatus.FAILURE
    failure = instance.get_records_for_run(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    assert failure[0].event_log_entry.message.startswith(f"{WORKER_LOST}: its process (pid {gone.pid}) is gone")
    assert instance.get_run_by_id(alive.run_id).status is dg.DagsterRunStatus.STARTED  # its worker runs


def test_the_run_worker_start_message_read_is_the_one_dagster_writes():
    """The worker's pid is read from Dagster's engine event (a message format, not an API): checked here
    against the pinned Dagster's own source, so an upgrade that rewords it fails by name."""
    from dagster._grpc import impl

    assert 'f"Started process for run (pid: {pid})."' in inspect.getsource(impl)
