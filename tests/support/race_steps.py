"""Step functions for the racing-runs tests, importable by Ray workers (the repository root is
on their path). Each call appends `name pid` to $RACE_EVENTS, so calls are counted across processes."""

import os
import time


def counted(name: str, seconds: float, output_path: str) -> dict:
    with open(os.environ["RACE_EVENTS"], "a") as f:
        f.write(f"{name} {os.getpid()}\n")
    time.sleep(seconds)
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "made-by.txt"), "w") as f:
        f.write(str(os.getpid()))
    return {"pid": os.getpid()}
