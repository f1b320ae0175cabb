"""A separate process materializing one shared step, for the cross-process lease tests.

usage: lease_worker.py PREFIX EVENTS_FILE MODE SLEEP HEARTBEAT STALE
MODE: ok | fail. Appends `start PID` / `done PID` to EVENTS_FILE; prints the outcome as JSON.
"""

import json
import os
import sys
import time

import fsspec

from marin_assets.core.lease import LeaseLostError, LeaseSettings
from marin_assets.core.materialize import materialize_step
from marin_assets.core.paths import join_path
from marin_assets.core.step import Step

prefix, events, mode, sleep, heartbeat, stale = sys.argv[1:7]


def note(what: str) -> None:
    with open(events, "a") as f:
        f.write(f"{what} {os.getpid()}\n")


def work(output_path: str) -> dict:
    note("start")
    with fsspec.open(join_path(output_path, f"part-{os.getpid()}.txt"), "w") as f:  # local or gs://
        f.write("partial")
    time.sleep(float(sleep))
    if mode == "fail":
        raise RuntimeError("boom from the step function")
    note("done")
    return {"pid": os.getpid()}


step = Step(name="race/shared", fn=work, hash_attrs={"version": 1})
settings = LeaseSettings(heartbeat_interval=float(heartbeat), stale_timeout=float(stale), poll_interval=0.05)
try:
    outcome = materialize_step(step, prefix=prefix, settings=settings, run_id=f"pid-{os.getpid()}")
except LeaseLostError as e:
    print(json.dumps({"error": "LeaseLostError", "message": str(e)}))
    sys.exit(3)
print(json.dumps({"cached": outcome.cached, "output_path": outcome.output_path,
                  "result_pid": outcome.record.result["pid"], "took_over": outcome.took_over}))
