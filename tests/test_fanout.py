"""`execution.fanout.fan_out`: a fan-out that never hangs, on a 1-CPU Ray of its own (in a subprocess),
on the suite's 2-CPU Ray, and in process."""

from __future__ import annotations

import collections
import functools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from marin_assets.core.lease import LeaseSettings
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.stores import LocalStatusStore, read_status
from marin_assets.execution.fanout import fan_out
from marin_assets.execution.ray_runner import RemoteTraceback
from tests.support.helpers import ROOT, subprocess_env

SETTINGS = LeaseSettings(heartbeat_interval=0.2, stale_timeout=10.0, poll_interval=0.1)
"""Claims: no task dies in these tests, so a stalled heartbeat (a busy machine) gets a wide margin."""


# --- on a 1-CPU Ray of its own -------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_cpu_ray(tmp_path_factory):
    """All four scenarios of `fanout_worker`, in order, on one 1-CPU Ray started in a subprocess."""
    root = tmp_path_factory.mktemp("fanout")
    proc = subprocess.run([sys.executable, "-c", "from tests.support.fanout_worker import main; main()", str(root),
                           "step", "many", "infeasible", "killed"], cwd=ROOT,
                          env=subprocess_env(MARIN_PREFIX=str(root / "outputs")),
                          capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def scenario(found: dict, name: str) -> dict:
    outcome = found[name]
    assert "failed" not in outcome, outcome
    return outcome


def completions(events: list) -> collections.Counter:
    return collections.Counter(item for what, item, _ in events if what == "done")


def test_a_step_task_holding_the_only_cpu_fans_out_and_finishes(one_cpu_ray):
    found = scenario(one_cpu_ray, "step")  # a hang would be a "failed" outcome: the worker stops a step at 90 s
    assert "failed" not in found["step"], found["step"]
    assert [r["item"] for r in found["step"]["results"]] == [0, 1, 2, 3]
    assert completions(found["events"]) == {0: 1, 1: 1, 2: 1, 3: 1}, found["events"]


def test_many_fan_outs_on_a_ray_whose_cpu_they_hold_all_finish(one_cpu_ray):
    found = scenario(one_cpu_ray, "many")
    for step, events in zip(found["steps"], found["events"], strict=True):
        assert "failed" not in step, step
        assert [r["item"] for r in step["results"]] == [0, 1, 2]
        assert completions(events) == {0: 1, 1: 1, 2: 1}, events


def test_an_infeasible_task_request_fails_at_once_naming_request_and_offer(one_cpu_ray):
    memory, tpu = scenario(one_cpu_ray, "infeasible")["outcomes"]
    for outcome, needs in ((memory, "needs {CPU=1, memory=1048576.0GiB} on one node"), (tpu, "needs {CPU=1, TPU=4}")):
        assert outcome["error"] == "InfeasibleRequestError", outcome
        assert outcome["message"].startswith("too-big: each task ") and needs in outcome["message"]
        assert "Nodes offer: {CPU=1, memory=" in outcome["message"]
        assert outcome["ran"] == []  # refused before any item ran (the caller itself would have run items)


def test_an_item_whose_task_died_is_finished_by_the_caller_once_its_claim_is_stale(one_cpu_ray):
    found = scenario(one_cpu_ray, "killed")
    driver = one_cpu_ray["driver"]
    assert found["results"] == [{"item": 0, "pid": driver}, {"item": 1, "pid": driver}]
    starts = [pid for what, item, pid in found["events"] if what == "start" and item == 0]
    assert len(starts) == 2 and starts[0] != driver and starts[1] == driver, found["events"]  # died, then here
    assert completions(found["events"]) == {0: 1, 1: 1}
    # Ray's report of the death or the claim's (its process exited), whichever this process saw first
    assert any("the Ray task of item 0 (0) died" in line for line in found["log"]), found["log"]
    assert "1 tasks died" in found["log"][-1], found["log"]
    assert any("taking over item 0 (0): stale RUNNING" in line for line in found["log"]), found["log"]


# --- on the suite's 2-CPU Ray ---------------------------------------------------------------------

def wait_for(*paths: Path, seconds: float = 60) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if all(p.exists() for p in paths):
            return True
        time.sleep(0.05)
    return False


def meet(folder: str, item: int) -> dict:
    """Items 0 and 1 (the tasks') each wait to see the other started: they run at the same time.
    The caller's first item (3) waits for both, so it cannot take them first."""
    d = Path(folder)
    (d / f"started-{item}").write_text(str(os.getpid()))
    met = None
    if item in (0, 1):
        met = wait_for(d / f"started-{1 - item}")
    elif item == 3:
        wait_for(d / "started-0", d / "started-1")
    return {"item": item, "pid": os.getpid(), "met": met}


def test_with_free_cpus_items_run_in_parallel_in_ray_workers_and_come_back_in_order(local_ray, tmp_path):
    results = fan_out(range(5), functools.partial(meet, str(tmp_path)), workers=3, settings=SETTINGS,
                      claim_path_of=lambda i: str(tmp_path / "claims" / str(i)))
    assert [r["item"] for r in results] == [0, 1, 2, 3, 4]
    first, second = results[0], results[1]
    assert first["met"] and second["met"], "items 0 and 1 did not run at the same time"
    assert len({first["pid"], second["pid"], os.getpid()}) == 3
    assert results[3]["pid"] == results[4]["pid"] == os.getpid()
    assert all(read_status(str(tmp_path / "claims" / str(i))).status is Status.SUCCESS for i in range(5))


def waits_for_the_others(folder: str, last: int, item: int) -> int:
    """The caller's first item (the last) finishes only after the tasks did every other item."""
    d = Path(folder)
    if item == last:
        wait_for(*(d / f"done-{i}" for i in range(last)))
    (d / f"done-{item}").write_text(str(os.getpid()))
    return os.getpid()


def test_while_the_caller_works_on_an_item_finished_tasks_are_replaced(local_ray, tmp_path):
    """One task slot, four items: the caller's long item 3 waits for items 0, 1 and 2, which one task
    after another must do meanwhile (the window refills while the caller's own item runs)."""
    pids = fan_out(range(4), functools.partial(waits_for_the_others, str(tmp_path), 3), workers=2, settings=SETTINGS,
                   claim_path_of=lambda i: str(tmp_path / "claims" / str(i)))
    assert pids[3] == os.getpid() and os.getpid() not in pids[:3]


def fails_remotely(folder: str, item: int) -> int:
    """Item 0 fails in a Ray task: the caller's item (1) waits until item 0 started elsewhere."""
    if item == 0:
        Path(folder, "started-0").write_text(str(os.getpid()))
        raise ValueError("no good")
    wait_for(Path(folder, "started-0"))
    return item


def test_an_error_in_a_task_keeps_its_type_and_names_the_item(local_ray, tmp_path):
    with pytest.raises(ValueError, match="no good") as e:
        fan_out([0, 1], functools.partial(fails_remotely, str(tmp_path)), workers=2, settings=SETTINGS,
                claim_path_of=lambda i: str(tmp_path / "claims" / str(i)))
    assert any("item 0 (0) failed in a Ray task" in note for note in e.value.__notes__)
    assert isinstance(e.value.__cause__, RemoteTraceback)
    assert read_status(str(tmp_path / "claims" / "0")).status is Status.FAILED


# --- in process -------------------------------------------------------------------------------------

def test_without_a_running_ray_it_runs_in_process_and_never_imports_ray(tmp_path):
    script = f"""
import json, os, sys
from marin_assets.execution.fanout import fan_out
out = fan_out(["a", "b", "c"], lambda x: (x.upper(), os.getpid()), workers=4,
              claim_path_of=lambda x: os.path.join({str(tmp_path)!r}, x))
print(json.dumps({{"out": out, "pid": os.getpid(), "ray": "ray" in sys.modules}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["out"] == [[x, found["pid"]] for x in "ABC"] and found["ray"] is False


def test_an_error_in_process_keeps_its_type_names_the_item_and_stops(tmp_path):
    ran = []

    def fn(x: int) -> int:
        ran.append(x)
        if x == 1:
            raise KeyError("missing")
        return x

    with pytest.raises(KeyError) as e:
        fan_out([0, 1, 2], fn, workers=1, settings=SETTINGS, claim_path_of=lambda i: str(tmp_path / str(i)))
    assert ran == [0, 1]
    assert any("item 1 (1) failed in the calling process" in note for note in e.value.__notes__)
    assert not os.listdir(tmp_path)  # in process: a plain loop, no claims written
    with pytest.raises(ValueError, match="its own path"):
        fan_out([0, 1], str, workers=1, claim_path_of=lambda i: str(tmp_path))


def after_release(folder: str, item: int) -> tuple[int, bool]:
    """The item doubled, and whether item 0's earlier holder had let go when it was called."""
    return item * 2, Path(folder, "released").exists()


def test_claims_of_other_holders_live_stale_and_finished(local_ray, tmp_path):
    """A live claim is waited for (not run over), a stale one taken over, another fan-out's SUCCESS
    redone (fn is resumable; its result is not stored): by the tasks or by the caller."""
    def claim(i: int, status: Status = Status.RUNNING, age: float = 0.0) -> LocalStatusStore:
        store = LocalStatusStore(str(tmp_path / "claims" / str(i)))
        assert store.write_if(None, StatusRecord(status, holder="elsewhere:1:x", token="t",
                                                 heartbeat=time.time() - age, run_id="earlier"))
        return store

    live = claim(0)
    claim(1, age=100)  # stale: its holder died
    claim(2, Status.SUCCESS)  # done by an earlier fan-out

    def release() -> None:  # a live holder: heartbeats for a second, then marks SUCCESS
        for _ in range(5):
            time.sleep(0.2)
            current, version = live.read()
            assert live.write_if(version, current.renewed())
        (tmp_path / "released").touch()
        current, version = live.read()
        assert live.write_if(version, current.renewed(status=Status.SUCCESS))

    threading.Thread(target=release, daemon=True).start()
    out = fan_out([0, 1, 2], functools.partial(after_release, str(tmp_path)), workers=2, settings=SETTINGS,
                  claim_path_of=lambda i: str(tmp_path / "claims" / str(i)))
    assert out == [(0, True), (2, False), (4, False)]  # item 0 only after its holder let go
    assert all(read_status(str(tmp_path / "claims" / str(i))).run_id.startswith("fan-out-") for i in range(3))
