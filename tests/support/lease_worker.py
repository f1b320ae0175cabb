"""A separate process materializing one shared step, for the cross-process lease tests.

usage: lease_worker.py PREFIX EVENTS_FILE MODE SLEEP HEARTBEAT STALE
MODE: ok | fail. Appends `start PID` / `done PID` to EVENTS_FILE (and `lost PID` when the lease was
lost); prints the outcome as JSON. SLEEP: the seconds the step's work takes, or `until:EVENT`: it
works until another process has noted EVENT (`start`, `done`, `lost`), or `until:success` until
another process has marked the output SUCCESS (each waited for at most `UNTIL_LIMIT_S`).
"""

import json
import os
import sys
import time

import fsspec

from marin_assets.core.lease import LeaseLostError, LeaseSettings
from marin_assets.core.materialize import materialize_step
from marin_assets.core.paths import join_path
from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status

prefix, events, mode, sleep, heartbeat, stale = sys.argv[1:7]
UNTIL_LIMIT_S = 120.0
"""How long an `until:` wait lasts at most: far past any ordering it waits for, even on a loaded machine."""


def note(what: str) -> None:
    with open(events, "a") as f:
        f.write(f"{what} {os.getpid()}\n")


def work(output_path: str) -> dict:
    note("start")
    with fsspec.open(join_path(output_path, f"part-{os.getpid()}.txt"), "w") as f:  # local or gs://
        f.write("partial")
    if sleep.startswith("until:"):
        wait_until(sleep.removeprefix("until:"), output_path)
    else:
        time.sleep(float(sleep))
    if mode == "fail":
        raise RuntimeError("boom from the step function")
    note("done")
    return {"pid": os.getpid()}


def wait_until(what: str, output_path: str) -> None:
    def happened() -> bool:
        if what == "success":
            return read_status(output_path).status is Status.SUCCESS
        if not os.path.exists(events):
            return False
        noted = open(events).read().split()
        return any(w == what and int(pid) != os.getpid() for w, pid in zip(noted[0::2], noted[1::2], strict=False))

    deadline = time.monotonic() + UNTIL_LIMIT_S
    while not happened() and time.monotonic() < deadline:
        time.sleep(0.05)


step = Step(name="race/shared", fn=work, hash_attrs={"version": 1})
settings = LeaseSettings(heartbeat_interval=float(heartbeat), stale_timeout=float(stale), poll_interval=0.05)
try:
    outcome = materialize_step(step, prefix=prefix, settings=settings, run_id=f"pid-{os.getpid()}")
except LeaseLostError as e:
    note("lost")
    print(json.dumps({"error": "LeaseLostError", "message": str(e)}))
    sys.exit(3)
print(json.dumps({"cached": outcome.cached, "output_path": outcome.output_path,
                  "result_pid": outcome.record.result["pid"], "took_over": outcome.took_over}))
