"""Fan-outs on a 1-CPU Ray of its own, for tests/test_fanout.py; prints one JSON line.

usage: python -c 'from tests.support.fanout_worker import main; main()' ROOT SCENARIO...
SCENARIO: step (a step task holding the only CPU fans out) | many (two steps hold all the CPU, both
fan out) | infeasible (per-task requests no node offers) | killed (a task dies mid-item); run in
order on one Ray, each reported under its name (or as `{"failed": …}`).
Started through `main` so every function here pickles by reference (`tests.support.fanout_worker`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import time

from marin_assets.core.lease import LeaseSettings
from marin_assets.core.step import Resources, Step
from marin_assets.execution.fanout import fan_out
from marin_assets.execution.ray_runner import run_on_ray
from marin_assets.execution.requests import RayRequest

SETTINGS = LeaseSettings(heartbeat_interval=0.2, stale_timeout=10.0, poll_interval=0.1)
"""Claims where no task dies: a stalled heartbeat (a busy machine) gets a wide margin."""
FAST = LeaseSettings(heartbeat_interval=0.2, stale_timeout=2.0, poll_interval=0.1)
"""Claims of a dead task go stale in 2 s."""


def note(events: str, what: str, item: int) -> None:
    with open(events, "a") as f:
        f.write(f"{what} {item} {os.getpid()}\n")


def events_of(events: str) -> list[list]:
    if not os.path.exists(events):
        return []
    with open(events) as f:
        return [[w, int(i), int(p)] for w, i, p in (line.split() for line in f)]


def work(events: str, item: int) -> dict:
    note(events, "start", item)
    time.sleep(0.2)
    note(events, "done", item)
    return {"item": item, "pid": os.getpid()}


def step_fan_out(root: str, tag: str, items: int, workers: int, output_path: str) -> dict:
    """A step's function (its output path unused): fan out `items` items over `workers`, itself included."""
    events = os.path.join(root, f"{tag}.events")
    results = fan_out(list(range(items)), functools.partial(work, events), workers=workers, settings=SETTINGS,
                      claim_path_of=lambda i: os.path.join(root, tag, f"claim-{i}"), name=tag)
    return {"results": results, "pid": os.getpid()}


def infeasible(root: str, request: RayRequest) -> dict:
    events = os.path.join(root, "infeasible.events")
    try:
        fan_out([0, 1, 2], functools.partial(work, events), workers=3, request=request, settings=SETTINGS,
                claim_path_of=lambda i: os.path.join(root, "infeasible", f"claim-{i}"), name="too-big")
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e), "ran": events_of(events)}
    return {"error": None, "ran": events_of(events)}


def dies_once(events: str, markers: str, caller: int, item: int) -> dict:
    """Item 0's first attempt in a Ray worker kills that worker mid-item; item 1 (the caller's) waits
    until that attempt has begun, so the task surely holds item 0's claim when it dies."""
    note(events, "start", item)
    first = os.path.join(markers, f"attempt-{item}")
    if item == 0 and os.getpid() != caller and not os.path.exists(first):
        open(first, "w").close()
        os._exit(1)
    if item == 1:
        deadline = time.time() + 240  # a loaded machine starts a Ray worker slowly
        while not os.path.exists(os.path.join(markers, "attempt-0")) and time.time() < deadline:
            time.sleep(0.05)
    note(events, "done", item)
    return {"item": item, "pid": os.getpid()}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class LocalRay:
    """The `RayConnection` of this process's Ray."""

    fail_fast = True

    def connect(self) -> None:
        pass

    def worker_env(self) -> dict[str, str]:
        return {}


def run_steps(root: str, cpu: float, fan_outs: list[tuple[str, int, int]]) -> list[dict]:
    """Steps (`cpu` each) whose functions fan out (tag, items, workers), run at once as the Dagster layer
    runs steps (`run_on_ray`: a streaming task, the function in a thread); each given up after 90 s."""
    steps = [Step(name=f"fanout/{f[0]}", resources=Resources(cpu=cpu), fn=functools.partial(step_fan_out, root, *f))
             for f in fan_outs]
    results: dict[str, dict] = {}
    stop = threading.Event()
    timer = threading.Timer(90, stop.set)
    timer.start()

    def run(step: Step) -> None:
        try:
            results[step.name] = run_on_ray(step, os.path.join(root, step.name), root, stop, LocalRay(),
                                            logging.getLogger("steps"))
        except Exception as e:
            results[step.name] = {"failed": f"{type(e).__name__}: {e}"}

    threads = [threading.Thread(target=run, args=(s,)) for s in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    timer.cancel()
    return [results[s.name] for s in steps]


def step(root: str) -> dict:
    """(a) A step task holds the only CPU and fans out 4 items over 4 workers."""
    [found] = run_steps(root, 1, [("step", 4, 4)])
    return {"step": found, "events": events_of(os.path.join(root, "step.events"))}


def many(root: str) -> dict:
    """(b) Two steps hold all the CPU between them, and both fan out at once."""
    return {"steps": run_steps(root, 0.5, [("many0", 3, 3), ("many1", 3, 3)]),
            "events": [events_of(os.path.join(root, f"many{k}.events")) for k in range(2)]}


def too_big(root: str) -> dict:
    """(c) Per-task requests no node offers (memory, a custom resource), from a step task."""
    requests = [RayRequest(num_cpus=1, memory=2**50), RayRequest(num_cpus=1, resources={"TPU": 4})]
    return {"outcomes": ray_get([ray_remote(infeasible).options(num_cpus=1).remote(root, r) for r in requests])}


def killed(root: str) -> dict:
    """(e) The task of item 0 dies mid-item (the driver holds no CPU, so the task runs)."""
    logger = logging.getLogger("fanout-test")
    lines = Lines()
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    events, markers = os.path.join(root, "killed.events"), os.path.join(root, "markers")
    os.makedirs(markers, exist_ok=True)
    results = fan_out([0, 1], functools.partial(dies_once, events, markers, os.getpid()), workers=2,
                      claim_path_of=lambda i: os.path.join(root, "killed", f"claim-{i}"), settings=FAST,
                      name="killed", log=logger)
    return {"results": results, "events": events_of(events), "log": lines.lines}


SCENARIOS = {"step": step, "many": many, "infeasible": too_big, "killed": killed}


def ray_remote(fn):
    import ray

    return ray.remote(max_retries=0)(fn)


def ray_get(refs):
    import ray

    return ray.get(refs, timeout=90)  # a hang fails the scenario instead of the whole run


def main() -> None:
    """Run the named scenarios in order on one 1-CPU Ray; each one's outcome (or error) under its name."""
    import ray

    root, names = sys.argv[1], sys.argv[2:]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 2**20)
    out: dict = {"driver": os.getpid()}
    try:
        for name in names:
            folder = os.path.join(root, name)
            os.makedirs(folder)
            try:
                out[name] = SCENARIOS[name](folder)
            except Exception as e:
                out[name] = {"failed": f"{type(e).__name__}: {e}"}
    finally:
        ray.shutdown()
    print(json.dumps(out))
