"""Steps for tests/test_lost_lease.py: a function that keeps writing while it runs, and a training long enough
to be killed in the middle (`python -m tests.support.lost_lease_steps` is not used: the definitions are
loaded by `dagster asset materialize -f`)."""

import dataclasses
import os
import time
from functools import partial

from marin_assets import Step, build_definitions
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import OptimizerSpec
from tests.support import automation_pipeline as auto


def keep_writing(output_path: str, ticks: str, seconds: float) -> int:
    """Append a line to `ticks` (the first holds this process's pid) every 20 ms for `seconds`."""
    with open(ticks, "a") as f:
        f.write(f"pid {os.getpid()}\n")
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        with open(ticks, "a") as f:
            f.write(f"tick {n}\n")
        n += 1
        time.sleep(0.02)
    return n


def writer_step(name: str, ticks: str, seconds: float = 120.0) -> Step:
    return Step(name=name, fn=partial(keep_writing, ticks=ticks, seconds=seconds),
                hash_attrs={"ticks": ticks, "seconds": seconds})


LONG = dataclasses.replace(auto.SHORT, num_train_steps=600, checkpoint_every=20, steps_per_eval=1000)
long_train = train_step("checkpoints/driver-death", {"stories": auto.pipeline["tokenized"]}, auto.TINY,
                        OptimizerSpec(learning_rate=1e-2), LONG)
defs = build_definitions([long_train])
