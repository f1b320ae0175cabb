"""A step stops when it loses its lease or its driver dies, wherever it runs.

- Lost lease, in process: another process takes the lease over while the function runs in the holder's
  process (a light step, `materialize_step` with no Ray): the function is stopped within one heartbeat
  (`core/interrupt.py`), raises `LeaseLostError`, and nothing is committed.
- Lost lease, on Ray: the driver cancels the task and the worker (`driver_watch`) ends on its own too.
- Driver death: `dagster asset materialize` killed with its process group in the middle of a training on
  the embedded Ray: the step's Ray worker (its own process group) ends at once and writes nothing more
  into the output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

from marin_assets import materialize_step
from marin_assets.core.lease import LeaseLostError, LeaseSettings
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.step import walk
from marin_assets.core.stores import read_status, status_store
from marin_assets.execution.ray_runner import ray_runner
from marin_assets.pipeline.training.checkpoints import list_checkpoints, run_dir_of
from resources import RayResource
from tests.support import lost_lease_steps as steps
from tests.support.helpers import BIN, ROOT, subprocess_env, wait_for

BOUND_S = 30.0
"""A step that lost its lease (or its driver) must have stopped within this long."""
FAST = LeaseSettings(heartbeat_interval=0.5, stale_timeout=60.0, poll_interval=0.1)


def ticks(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def take_over(out: str) -> StatusRecord:
    """Another process takes the lease of `out` (as a holder that found it stale would)."""
    store = status_store(out)
    current, generation = store.read()
    assert current is not None and current.status is Status.RUNNING
    thief = StatusRecord(Status.RUNNING, holder="elsewhere:1:thief", token="thief", heartbeat=time.time())
    assert store.write_if(generation, thief) is not None
    return thief


def materialize_in_thread(step, prefix, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        try:
            box["outcome"] = materialize_step(step, prefix=prefix, settings=FAST, **kwargs)
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def assert_stopped_and_uncommitted(thread, box, out, thief, what):
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"{what}: still running {BOUND_S:.0f} s after losing its lease"
    assert isinstance(box.get("error"), LeaseLostError), box
    status = read_status(out)
    assert status is not None and status.token == thief.token  # the new holder's status, untouched
    assert not os.path.exists(f"{out}/.artifact.json")


def test_a_step_in_the_holders_process_stops_when_its_lease_is_taken_over(prefix, tmp_path):
    tick_file = tmp_path / "ticks"
    step = steps.writer_step("lost/in-process", str(tick_file))
    out = step.output_path_under(prefix)
    thread, box = materialize_in_thread(step, prefix)
    wait_for(lambda: len(ticks(tick_file)) > 5, "the step to start writing")
    thief = take_over(out)
    assert_stopped_and_uncommitted(thread, box, out, thief, "an in-process step")
    written = len(ticks(tick_file))
    assert written < 120 / 0.02 / 2  # it stopped long before its two minutes were up
    assert len(ticks(tick_file)) == written  # the function no longer runs: its thread raised


def test_a_step_on_ray_stops_when_its_lease_is_taken_over(prefix, tmp_path, local_ray):
    tick_file = tmp_path / "ticks"
    step = steps.writer_step("lost/on-ray", str(tick_file))
    out = step.output_path_under(prefix)
    runner = ray_runner(RayResource(light_steps_in_process=False), log=__import__("logging").getLogger("test"))
    thread, box = materialize_in_thread(step, prefix, run_fn=runner)
    wait_for(lambda: len(ticks(tick_file)) > 5, "the Ray task to start writing", timeout=120)
    pid = int(ticks(tick_file)[0].split()[1])
    thief = take_over(out)
    assert_stopped_and_uncommitted(thread, box, out, thief, "a step on Ray")
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
             "the Ray worker to end", timeout=BOUND_S)
    written = len(ticks(tick_file))
    assert len(ticks(tick_file)) == written  # its worker is gone: nothing can write any more


def outputs_of(folder: str) -> dict[str, float]:
    """Every file under `folder` and its modification time."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            try:
                found[os.path.relpath(path, folder)] = os.stat(path).st_mtime
            except FileNotFoundError:
                pass
    return found


def ray_workers_of(step) -> list[psutil.Process]:
    title = f"ray::{step.name_with_hash.replace('/', '.')}"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if cmdline.startswith(title):
            found.append(proc)
    return found


def test_killing_the_driver_mid_training_ends_its_ray_worker_before_it_writes_more(prefix, dagster_home):
    for step in walk([steps.long_train.deps[0]]):
        materialize_step(step, prefix=prefix)
    out = steps.long_train.output_path_under(prefix)
    run_dir = run_dir_of(out)
    driver = subprocess.Popen([str(BIN / "dagster"), "asset", "materialize", "-f",
                               str(ROOT / "tests" / "support" / "lost_lease_steps.py"),
                               "--select", steps.long_train.name],
                              cwd=ROOT, env=subprocess_env(MARIN_PREFIX=prefix, DAGSTER_HOME=str(dagster_home)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: list_checkpoints(run_dir), "the first checkpoint", timeout=300, interval=0.02)
        workers = ray_workers_of(steps.long_train)
        os.killpg(driver.pid, signal.SIGKILL)
        killed_at = time.time()
        at_kill = list_checkpoints(run_dir)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert workers, "the training's Ray worker was not found"
    assert len(at_kill) < 600 // 20, "the training ended before the kill: nothing was tested"
    wait_for(lambda: all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE for w in workers),
             "the Ray worker to end after its driver", timeout=BOUND_S)
    late = {path: t for path, t in outputs_of(out).items() if t > killed_at + 0.5}
    assert not late, f"written after the kill: {sorted(late)[:10]}"
    assert len(list_checkpoints(run_dir)) <= len(at_kill) + 1  # at most the one being written at the kill
    status = read_status(out)
    assert status is not None and status.status is Status.RUNNING  # never marked finished by anyone
