"""Stop a function running in this process when its lease is lost.

A step computed in the process holding its lease (a light step, `materialize_step` without Ray) cannot be
cancelled from outside the way a Ray task is. `stopping_on` watches the lease's `lost` event from a thread
and, when it is set, raises `LeaseLostError` inside the thread running the function, at its next Python
instruction: a loop that reads, computes and writes stops within one iteration of the heartbeat that found the
lease gone. (Code waiting inside a C call — a sleep, a read — sees it when the call returns.)
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator

from marin_assets.core.lease import LeaseLostError

WATCH_INTERVAL_S = 0.2
"""How often the watcher looks at the event while the function runs."""


class LeaseLostInStep(LeaseLostError):
    """Raised inside a step's function running in this process: another process took its lease over."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> bool:
    """Make `exc` raise in thread `thread_id` at its next instruction; None clears one not yet raised."""
    arg = None if exc is None else ctypes.py_object(exc)  # None: a NULL pointer
    changed = int(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), arg))
    if changed > 1:  # cannot happen for one id; undo as CPython's documentation says
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
        return False
    return changed == 1


@contextlib.contextmanager
def stopping_on(lost: threading.Event | None) -> Iterator[None]:
    """Run the block in this thread; if `lost` is set before it ends, raise `LeaseLostInStep` in it."""
    if lost is None:
        yield
        return
    target = threading.get_ident()
    finished = threading.Event()
    fired = threading.Event()
    guard = threading.Lock()

    def watch() -> None:
        while not finished.wait(WATCH_INTERVAL_S):
            if lost.is_set():
                with guard:
                    if not finished.is_set() and _raise_in(target, LeaseLostInStep):
                        fired.set()
                return

    watcher = threading.Thread(target=watch, name="marin-lease-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with guard:
            finished.set()
        watcher.join()
        if fired.is_set():  # an exception sent but not yet delivered must not escape later, elsewhere
            _raise_in(target, None)
