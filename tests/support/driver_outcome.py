"""How the multi-host tests' drivers report: one JSON line the test reads, the error's when the body fails."""

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def reported(ray: Any) -> Iterator[float]:
    """Run a driver's body (given its start time): a failure is printed as `{"ok": false, …}` and ends the process
    with 1; the Ray connection (`ray`, None: none) is closed either way."""
    started = time.monotonic()
    try:
        yield started
    except BaseException as e:  # reported to the test, which asserts on it
        print(json.dumps({"ok": False, "seconds": time.monotonic() - started, "error": f"{type(e).__name__}: {e}"}),
              flush=True)
        sys.exit(1)
    finally:
        if ray is not None:
            ray.shutdown()
