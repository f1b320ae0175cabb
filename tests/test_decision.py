"""One place says what a status means: `decide`, and a dry run that agrees with a run.

`marin-assets plan`, the lease acquisition and the dependency wait all ask `core.decision`;
these tests put each status on disk and check that the plan's row says what
`materialize_step` then does (reuse, run and why, wait, blocked by a dependency).
"""

import logging
import threading
import time

import pytest

from marin_assets.core.decision import Action, State, decide
from marin_assets.core.lease import Lease, LeaseSettings, acquire
from marin_assets.core.materialize import (
    DependencyNotReadyError,
    compute_and_commit,
    materialize_step,
    run_in_process,
)
from marin_assets.core.plan import plan
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status, status_store
from tests.support.helpers import wait_for

SETTINGS = LeaseSettings(heartbeat_interval=0.2, stale_timeout=1.0, poll_interval=0.05)
NOW = 1_000_000.0


def record(status: Status, age: float = 0.0, error: str | None = None) -> StatusRecord:
    return StatusRecord(status, holder="host:1:abc", token="t", heartbeat=NOW - age, run_id="r1", error=error)


DECISIONS = [
    # status object, recompute → action, state, words the reason must hold
    (None, None, Action.RUN, State.MISSING, "no output yet"),
    (record(Status.SUCCESS), None, Action.REUSE, State.SUCCESS, "SUCCESS (made by run r1)"),
    (record(Status.SUCCESS), "forced", Action.RUN, State.SUCCESS, "recompute of SUCCESS: forced"),
    (record(Status.FAILED, error="ValueError: x"), None, Action.RUN, State.FAILED, "FAILED (ValueError: x)"),
    (record(Status.FAILED), "forced", Action.RUN, State.FAILED, "previous attempt FAILED"),
    (record(Status.RUNNING, age=0.5), None, Action.WAIT, State.LIVE, "RUNNING by host:1:abc"),
    (record(Status.RUNNING, age=0.5), "forced", Action.WAIT, State.LIVE, "heartbeat 0s ago"),
    (record(Status.RUNNING, age=5.0), None, Action.RUN, State.STALE, "no heartbeat for 5s"),
]


@pytest.mark.parametrize("status, recompute, action, state, words", DECISIONS)
def test_decide_is_a_pure_function_of_the_status(status, recompute, action, state, words):
    decision = decide(status, SETTINGS.stale_timeout, recompute=recompute, now=NOW)
    assert (decision.action, decision.state) == (action, state)
    assert words in decision.reason
    assert decision.ready is (state is State.SUCCESS)


def put_status(out: str, status: StatusRecord) -> None:
    store = status_store(out)
    _, version = store.read()
    assert store.write_if(version, status) is not None


def counting(calls: list, name: str, deps=()) -> Step:
    def fn(out):
        calls.append(name)
        return {"made": name}
    return Step(name=name, fn=fn, deps=list(deps), hash_attrs={"n": 1})


def plan_row(step: Step, prefix: str, selected=None):
    rows = {r.asset_key: r for r in plan([step], selected or {step.name}, prefix, SETTINGS)}
    return rows[step.name]


@pytest.mark.parametrize("state", ["missing", "success", "failed", "stale"])
def test_the_plan_says_what_the_materialization_then_does(prefix, state):
    calls: list = []
    step = counting(calls, "d/agree")
    out = step.output_path_under(prefix)
    if state == "success":
        materialize_step(step, prefix=prefix, settings=SETTINGS)
        calls.clear()
    elif state == "failed":
        put_status(out, StatusRecord(Status.FAILED, "h:1:x", "t", time.time(), error="RuntimeError: boom"))
    elif state == "stale":
        put_status(out, StatusRecord(Status.RUNNING, "h:1:x", "t", time.time() - 10 * SETTINGS.stale_timeout))

    row = plan_row(step, prefix)
    outcome = materialize_step(step, prefix=prefix, settings=SETTINGS)

    assert row.action == (Action.REUSE.value if state == "success" else Action.RUN.value)
    assert outcome.cached is (row.action == Action.REUSE.value)
    assert calls == ([] if outcome.cached else ["d/agree"])
    if state in ("failed", "stale"):  # the run replaced what the plan said it would, for the plan's reason
        assert outcome.took_over is not None
        assert outcome.took_over.split(",")[0].split(" (")[0] == row.reason.split(",")[0].split(" (")[0]
    assert read_status(out).status is Status.SUCCESS


def test_a_live_holder_is_waited_for_by_the_plan_the_lease_and_a_dependent(prefix):
    calls: list = []
    upstream = counting(calls, "d/up")
    downstream = counting(calls, "d/down", deps=[upstream])
    out = upstream.output_path_under(prefix)
    lease = acquire(status_store(out), SETTINGS)  # a real holder, heartbeating
    assert isinstance(lease, Lease)
    lease.start_heartbeat()

    assert plan_row(upstream, prefix).action == Action.WAIT.value
    assert plan_row(downstream, prefix).action == Action.RUN.value  # runs after its dependency
    with pytest.raises(TimeoutError, match="still held by"):
        acquire(status_store(out), SETTINGS, deadline=time.time() + 0.3)

    # The holder finishes while the dependent waits: the dependent then runs on its output.
    said = Said()
    dependent_log = logging.getLogger("test_decision.dependent")
    dependent_log.addHandler(said)
    dependent_log.setLevel(logging.INFO)

    def finish_later():
        wait_for(lambda: any("waiting for dependency d/up" in m for m in said.messages), "the dependent waiting")
        # held until the heartbeats have carried the lease well past the stale timeout while the dependent
        # waits: only they keep it live
        taken = lease.record.heartbeat
        wait_for(lambda: read_status(out).heartbeat >= taken + 4 * SETTINGS.stale_timeout,
                 "the heartbeats to renew the lease past four stale timeouts")
        compute_and_commit(upstream, out, prefix, lease, run_in_process, None, logging.getLogger(), False)

    holder = threading.Thread(target=finish_later, daemon=True)
    holder.start()
    try:
        outcome = materialize_step(downstream, prefix=prefix, settings=SETTINGS, log=dependent_log)
    finally:
        dependent_log.removeHandler(said)
    holder.join()
    assert not outcome.cached
    assert calls == ["d/up", "d/down"]


class Said(logging.Handler):
    """The messages a logger gave."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("state", ["missing", "failed", "stale"])
def test_a_dependency_the_plan_calls_blocking_stops_the_run_with_the_same_cause(prefix, state):
    calls: list = []
    upstream = counting(calls, "d/dep")
    downstream = counting(calls, "d/user", deps=[upstream])
    out = upstream.output_path_under(prefix)
    if state == "failed":
        put_status(out, StatusRecord(Status.FAILED, "h:1:x", "t", time.time(), error="RuntimeError: boom"))
    elif state == "stale":
        put_status(out, StatusRecord(Status.RUNNING, "h:1:x", "t", time.time() - 10 * SETTINGS.stale_timeout))

    row = plan_row(downstream, prefix, selected={"d/user"})
    assert row.action == "blocked" and "d/dep" in row.reason
    with pytest.raises(DependencyNotReadyError) as error:
        materialize_step(downstream, prefix=prefix, settings=SETTINGS)
    said = {"missing": "not materialized", "failed": "previous attempt FAILED (RuntimeError: boom)",
            "stale": "its holder is gone"}[state]
    assert said in str(error.value) and "d/dep" in str(error.value)
    assert calls == [] and read_status(downstream.output_path_under(prefix)) is None
