"""The lease across real processes: exactly once, stale takeover, FAILED rerun, lease loss."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from tests.support.helpers import ROOT, subprocess_env

WORKER = str(ROOT / "tests" / "support" / "lease_worker.py")


def start(prefix, events, mode="ok", sleep=0.0, heartbeat=0.2, stale=1.5):
    return subprocess.Popen(
        [sys.executable, WORKER, prefix, str(events), mode, str(sleep), str(heartbeat), str(stale)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, (json.loads(out.strip().splitlines()[-1]) if out.strip() else None), err


def events_of(path):
    return path.read_text().split()[0::2] if path.exists() else []


def wait_for(predicate, timeout=120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def output_dir(prefix):
    (name,) = os.listdir(os.path.join(prefix, "race"))
    return os.path.join(prefix, "race", name)


def test_racing_processes_compute_once_and_all_see_success(tmp_path):
    prefix, events = str(tmp_path / "out"), tmp_path / "events"
    # The function outlives the stale timeout: only heartbeats keep the waiters waiting.
    procs = [start(prefix, events, sleep=2.5, heartbeat=0.2, stale=1.0) for _ in range(6)]
    results = [finish(p) for p in procs]
    assert [rc for rc, _, _ in results] == [0] * 6, [err for _, _, err in results]
    assert events_of(events) == ["start", "done"]
    outcomes = [o for _, o, _ in results]
    assert len({o["output_path"] for o in outcomes}) == 1
    assert len({o["result_pid"] for o in outcomes}) == 1
    assert sorted(o["cached"] for o in outcomes) == [False] + [True] * 5
    assert read_status(outcomes[0]["output_path"]).status is Status.SUCCESS


def test_stale_lease_of_killed_holder_is_taken_over(tmp_path):
    prefix, events = str(tmp_path / "out"), tmp_path / "events"
    holder = start(prefix, events, sleep=60)
    wait_for(lambda: events_of(events) == ["start"])
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    out = output_dir(prefix)
    assert read_status(out).status is Status.RUNNING  # a dead holder leaves no success mark
    with pytest.raises(RecordNotAvailableError):
        read_record(out)

    rc, outcome, err = finish(start(prefix, events, sleep=0, stale=1.0))
    assert rc == 0, err
    assert outcome["cached"] is False
    assert outcome["took_over"].startswith("stale RUNNING by")
    assert events_of(events) == ["start", "start", "done"]
    assert read_status(out).status is Status.SUCCESS
    assert read_record(out).result["pid"] == outcome["result_pid"]


def test_failed_step_is_run_again(tmp_path):
    prefix, events = str(tmp_path / "out"), tmp_path / "events"
    rc, _, err = finish(start(prefix, events, mode="fail"))
    assert rc != 0 and "boom from the step function" in err
    out = output_dir(prefix)
    status = read_status(out)
    assert status.status is Status.FAILED and "boom" in status.error
    with pytest.raises(RecordNotAvailableError):
        read_record(out)

    rc, outcome, err = finish(start(prefix, events))
    assert rc == 0, err
    assert outcome["took_over"].startswith("previous attempt FAILED")
    assert events_of(events) == ["start", "start", "done"]


def test_waiter_runs_when_the_live_holder_fails(tmp_path):
    prefix, events = str(tmp_path / "out"), tmp_path / "events"
    failing = start(prefix, events, mode="fail", sleep=1.5)
    wait_for(lambda: events_of(events) == ["start"])
    waiter = start(prefix, events)
    rc_fail, _, _ = finish(failing)
    rc, outcome, err = finish(waiter)
    assert rc_fail != 0
    assert rc == 0, err
    assert outcome["cached"] is False
    assert events_of(events) == ["start", "start", "done"]


@pytest.mark.parametrize("old_holder_finishes_first", [False, True])
def test_holder_that_lost_its_lease_never_marks_success(tmp_path, old_holder_finishes_first):
    """Marin #8107: the old holder keeps working after losing its lease; it must not commit."""
    prefix, events = str(tmp_path / "out"), tmp_path / "events"
    # The old holder never heartbeats while it works: to others it looks dead after 1 s. Each works until
    # the other has done its part (orderings, not durations a loaded machine could stretch): the old one
    # until the new one has taken over and started (or even marked SUCCESS), the new one until then, or
    # until the old one has found its lease lost.
    old = start(prefix, events, sleep="until:start" if old_holder_finishes_first else "until:success",
                heartbeat=100, stale=200)
    wait_for(lambda: events_of(events) == ["start"])
    new = start(prefix, events, sleep="until:lost" if old_holder_finishes_first else 0.2, stale=1.0)

    rc_old, out_old, _ = finish(old, timeout=300)
    rc_new, out_new, err_new = finish(new, timeout=300)
    assert rc_old == 3 and out_old["error"] == "LeaseLostError"
    noted = events.read_text().split()
    expected = [("start", old.pid), ("start", new.pid), ("done", old.pid), ("lost", old.pid), ("done", new.pid)]
    if not old_holder_finishes_first:
        expected[2:] = [("done", new.pid), ("done", old.pid), ("lost", old.pid)]
    assert list(zip(noted[0::2], map(int, noted[1::2]), strict=True)) == expected
    assert rc_new == 0, err_new
    assert out_new["took_over"].startswith("stale RUNNING by")
    out = output_dir(prefix)
    status = read_status(out)
    assert status.status is Status.SUCCESS
    assert status.run_id == f"pid-{out_new['result_pid']}"
    record = read_record(out)
    assert record.result["pid"] == out_new["result_pid"]
    assert record.provenance.run_id == f"pid-{out_new['result_pid']}"
