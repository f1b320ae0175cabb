"""Preemption: SIGTERM — how TPU and spot VMs announce that they are going away — asks a running training to save
its state and stop, so that its retry resumes instead of starting over.

A process that runs steps wraps them in `sigterm_preempts()`, from its main thread (only the main thread may set
signal handlers; elsewhere it does nothing and whoever runs the main thread decides). While a step that can stop
cleanly runs inside `preemptible()`, SIGTERM only sets `requested`: the step saves what it needs at its next
chance and raises `Preempted`, and fails with that reason, so no SUCCESS is written and its retry resumes. With
no such step running, or at a second SIGTERM, the handler that was there before runs: the process ends as it would
have without us.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

requested = threading.Event()
"""Set by SIGTERM while a preemptible step runs: save and stop at the next chance."""
_state: dict[str, Any] = {"active": 0, "previous": None, "received_at": None}
_lock = threading.Lock()


class Preempted(RuntimeError):
    """A step stopped on SIGTERM after saving its state: its retry resumes from what it saved."""


def received_at() -> float | None:
    """When SIGTERM set `requested` (`time.time()`), or None."""
    at = _state["received_at"]
    return None if at is None else float(at)


def _handle(signum: int, frame: Any) -> None:
    with _lock:
        active, previous = _state["active"], _state["previous"]
        if active and not requested.is_set():
            _state["received_at"] = time.time()
            requested.set()
            return
    if callable(previous):
        previous(signum, frame)
    elif previous in (signal.SIG_DFL, None):  # what SIGTERM did before: end the process
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def sigterm_preempts() -> Iterator[None]:
    """Within the block, SIGTERM preempts a `preemptible()` step instead of ending the process at once (from the
    main thread; anywhere else, or when already installed, the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is _handle:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _handle)
    with _lock:
        _state["previous"] = previous
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        with _lock:
            _state["previous"] = None


@contextlib.contextmanager
def preemptible() -> Iterator[None]:
    """Mark a step that stops cleanly on `requested` as running in this process."""
    with _lock:
        _state["active"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["active"] -= 1
