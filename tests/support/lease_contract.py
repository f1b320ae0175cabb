"""The exactly-once contract every object-store status store keeps, written once and run against each
store (`tests/test_gcs_storage.py`, `tests/test_s3_storage.py`): racing processes compute once, writers
released together create one status, a stale lease is taken over, a stale writer is refused and a
robbed holder cannot mark SUCCESS."""

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from marin_assets import materialize_step
from marin_assets.core.decision import Action, decide
from marin_assets.core.lease import Lease, LeaseLostError, LeaseSettings, acquire
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status, status_store
from tests.support.helpers import FAST, ROOT, wait_for


def start_worker(prefix, events, sleep, env):
    """A `lease_worker.py` process materializing the shared step `race/shared` under `prefix`."""
    worker = str(ROOT / "tests" / "support" / "lease_worker.py")
    return subprocess.Popen([sys.executable, worker, prefix, str(events), "ok", str(sleep), "0.2", "1.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def racing_processes_compute_once(prefix, events, env, processes=5):
    """`processes` workers race on one step: exactly one computes, the others reuse its result."""
    procs = [start_worker(prefix, events, 2.0, env) for _ in range(processes)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert events.read_text().split()[0::2] == ["start", "done"]  # one computation
    assert len({r["result_pid"] for r in results}) == 1
    assert sorted(r["cached"] for r in results) == [False] + [True] * (processes - 1)
    assert read_status(results[0]["output_path"]).status is Status.SUCCESS


def stale_lease_is_taken_over(prefix, store_type):
    """A RUNNING status whose holder stopped renewing a minute ago is taken over and completed."""
    step = Step(name="objects/stale", fn=lambda out: "fresh", hash_attrs={"n": 1})
    out = step.output_path_under(prefix)
    store = status_store(out)
    assert isinstance(store, store_type)
    dead = StatusRecord(Status.RUNNING, holder="gone:1:x", token="t", heartbeat=time.time() - 60)
    assert store.write_if(None, dead) is not None
    outcome = materialize_step(step, prefix=prefix, settings=FAST)
    assert not outcome.cached and "stale RUNNING by gone:1:x" in outcome.took_over
    assert read_status(out).status is Status.SUCCESS and outcome.record.result == "fresh"


def stale_writer_refused_and_robbed_holder_cannot_succeed(prefix, store_type):
    """Create-if-absent and replace-if-unchanged hold; a holder whose lease was taken writes nothing."""
    store = store_type(f"{prefix}/objects/robbed_abc")
    first = StatusRecord(Status.RUNNING, holder="a", token="1", heartbeat=time.time())
    version = store.write_if(None, first)
    assert version is not None
    other = StatusRecord(Status.RUNNING, holder="c", token="3", heartbeat=time.time())
    assert store.write_if(None, other) is None  # create-if-absent: it exists now
    second = StatusRecord(Status.RUNNING, holder="b", token="2", heartbeat=time.time())
    assert store.write_if(version, second) is not None
    assert store.write_if(version, other) is None  # a stale version is refused
    assert store.read()[0] == second

    victim_path = f"{prefix}/objects/victim_abc"
    settings = LeaseSettings(heartbeat_interval=0.2, stale_timeout=0.5, poll_interval=0.05)
    victim = acquire(store_type(victim_path), settings, run_id="victim")
    assert isinstance(victim, Lease)
    # no heartbeat thread started: its heartbeat goes stale, and another process takes over
    wait_for(lambda: decide(store_type(victim_path).read()[0], settings.stale_timeout).action is Action.RUN,
             "the victim's lease going stale")
    thief = acquire(store_type(victim_path), settings, run_id="thief")
    assert isinstance(thief, Lease) and thief.took_over is not None
    with pytest.raises(LeaseLostError):
        victim.finish(Status.SUCCESS)
    now = read_status(victim_path)
    assert now.status is Status.RUNNING and now.run_id == "thief"  # the robbed holder wrote nothing
    thief.finish(Status.SUCCESS)
    assert read_status(victim_path).status is Status.SUCCESS


def simultaneous_creates_have_one_winner(prefix, store_type, writers=8):
    """`writers` threads released together each try to create the same status: exactly one succeeds
    (a store that let them all write would hand out `writers` leases)."""
    barrier = threading.Barrier(writers)
    store = store_type(f"{prefix}/objects/contested_abc")

    def create(i):
        barrier.wait()
        return store.write_if(None, StatusRecord(Status.RUNNING, holder=f"w{i}", token=str(i), heartbeat=time.time()))

    with ThreadPoolExecutor(writers) as pool:
        versions = list(pool.map(create, range(writers)))
    winners = [i for i, v in enumerate(versions) if v is not None]
    assert len(winners) == 1
    found, version = store.read()
    assert found.holder == f"w{winners[0]}" and version == versions[winners[0]]
