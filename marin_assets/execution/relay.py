"""Run a step's function in a thread and relay what it prints and logs, line by line.

Used on a Ray worker (`ray_runner`): the worker's stdout/stderr and root logger are captured
into a queue and streamed back as batches of lines while the function runs, so the Dagster
run log shows the step's progress live. A light step run in the Dagster process itself
(`call_relaying`) has what its own thread prints and logs passed on line by line, as it comes.
Carriage-return progress lines (tqdm) are thinned to one per `PROGRESS_EVERY_S`. No Ray import.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from marin_assets.core.paths import using_prefix
from marin_assets.core.preemption import sigterm_preempts
from marin_assets.core.step import Step
from marin_assets.execution.driver_watch import watching_driver

PROGRESS_EVERY_S = 5.0
"""Carriage-return progress lines (tqdm) are relayed at most this often."""

@dataclass(frozen=True)
class StepCall:
    """What a worker needs to run one step: its name (for logs) and its function.

    The function is sent on its own because a pickled `Step` is only a reference to its place
    in the graph (`Step.__reduce__`): the steps the function reads arrive without functions.
    """

    name: str
    fn: Callable[[str], Any]

    @classmethod
    def of(cls, step: Step) -> StepCall:
        return cls(step.name, step.fn)


_DONE = object()


class _LineRelay(io.TextIOBase):
    """A text stream that passes lines to a queue (and on to the original stream).

    `only`: relay only what this thread writes (and nothing while `only.quiet` is set); other
    threads' text just goes to the original stream."""

    def __init__(self, lines: Any, original: Any, only: _Caller | None = None):
        self.lines, self.original, self.only = lines, original, only
        self.buffer = ""
        self.last_progress = 0.0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.original.write(text)
        if self.only is not None and not self.only.relays():
            return len(text)
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            line = line.rsplit("\r", 1)[-1].rstrip()
            if line:
                self.lines.put(line)
        if "\r" in self.buffer:
            *done, self.buffer = self.buffer.split("\r")
            latest = next((s.strip() for s in reversed(done) if s.strip()), "")
            if latest and time.monotonic() - self.last_progress >= PROGRESS_EVERY_S:
                self.last_progress = time.monotonic()
                self.lines.put(latest)
        return len(text)

    def flush(self) -> None:
        self.original.flush()


class _QueueHandler(logging.Handler):
    def __init__(self, lines: Any, only: _Caller | None = None):
        super().__init__(logging.INFO)
        self.lines, self.only = lines, only
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.only is not None and not self.only.relays():
            return
        self.lines.put(self.format(record))


class _Caller:
    """The calling thread of `call_relaying`: lines it writes go straight to `emit`, except while
    `emit` itself runs (Dagster's log may print or log in turn: that must not come back)."""

    def __init__(self, emit: Callable[[list[str]], None]):
        self.emit, self.thread, self.quiet = emit, threading.get_ident(), False

    def relays(self) -> bool:
        return not self.quiet and threading.get_ident() == self.thread

    def put(self, line: str) -> None:
        self.quiet = True
        try:
            self.emit([line])
        finally:
            self.quiet = False


@contextlib.contextmanager
def _relaying(lines: Any, only: _Caller | None = None) -> Iterator[None]:
    root = logging.getLogger()
    handler, level = _QueueHandler(lines, only), root.level
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _LineRelay(lines, sys.stdout, only), _LineRelay(lines, sys.stderr, only)
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        sys.stdout, sys.stderr = saved


def _follow_hub_settings() -> None:
    """Make this step's HF_ENDPOINT / HF_HUB_OFFLINE / HF_HUB_DISABLE_XET take effect in a warm worker.

    `huggingface_hub` (1.x) reads them once, into `huggingface_hub.constants`, when first imported (by
    an earlier step on this worker, e.g. through transformers): without this a step sent to a local
    hub, or online, would still go to the old endpoint, or be refused as offline. Nothing else needs
    resetting: its one shared httpx client checks `constants.HF_HUB_OFFLINE` on every request and
    binds no endpoint, and the token (HF_TOKEN) is read on every call.
    """
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is None:
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    truthy = {"1", "ON", "YES", "TRUE"}
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in truthy
    no_xet = os.environ.get("HF_HUB_DISABLE_XET", "").upper() in truthy
    settings = {"ENDPOINT": endpoint, "HF_HUB_OFFLINE": offline, "HF_HUB_DISABLE_XET": no_xet,
                "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}"}
    for name, value in settings.items():
        setattr(constants, name, value)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _follow_hub_settings()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _follow_hub_settings()  # the process goes on (a warm worker, the Dagster process) with its own settings


def run_relaying(call: StepCall, output_path: str, prefix: str, env: dict[str, str],
                 host: int = 0) -> Iterator[tuple[str, int, Any]]:
    """Run the function in a thread — ended with its worker if the process holding the output's lease dies or
    loses it (`driver_watch`): yield ("started", host, None) at once, ("log", host, [lines]) as it
    prints, ("work", host, seconds) — the function's own wall time — when it ends, then ("result", host, value).
    What comes before "started" reaches the caller (a worker process to spawn) is start-up, not work."""
    lines: queue.Queue = queue.Queue()
    box: dict[str, Any] = {}
    yield ("started", host, None)

    def target() -> None:
        started = time.monotonic()
        try:
            with using_prefix(prefix):  # the steps it reads resolve their paths under this prefix
                box["value"] = call.fn(output_path)
        except BaseException as e:  # re-raised below, in the task's own thread
            box["error"] = e
        finally:
            box["work_s"] = time.monotonic() - started
            lines.put(_DONE)

    # ends the worker if the driver dies; SIGTERM (a preempted node) lets a training save a checkpoint first
    with _environment(env), _relaying(lines), watching_driver(output_path), sigterm_preempts():
        thread = threading.Thread(target=target, name=f"marin-step-{call.name}", daemon=True)
        thread.start()
        done = False
        while not done:
            batch = [lines.get()]
            deadline = time.monotonic() + 0.2
            while batch[-1] is not _DONE and time.monotonic() < deadline:
                try:
                    batch.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            done = batch[-1] is _DONE
            text = [b for b in batch if b is not _DONE]
            if text:
                yield ("log", host, text)
    if "error" in box:
        raise box["error"]
    yield ("work", host, box["work_s"])
    yield ("result", host, box.get("value"))


def call_relaying(call: StepCall, output_path: str, prefix: str, env: dict[str, str],
                  emit: Callable[[list[str]], None]) -> Any:
    """Run the function in this thread with `env` and the prefix in effect; pass each line it prints or
    logs from this thread to `emit` as it comes; return its result (its exception propagates as is).

    For a light step in the Dagster process: an interrupt (terminating the run) raises in the
    function itself, so it stops where it is. Lines written by threads the function starts go to
    the process's own output only.
    """
    caller = _Caller(emit)
    with _environment(env), _relaying(caller, only=caller):
        try:
            with using_prefix(prefix):
                return call.fn(output_path)
        finally:
            for stream in (sys.stdout, sys.stderr):  # a last line without its newline
                if isinstance(stream, _LineRelay) and stream.buffer.strip() and caller.relays():
                    caller.put(stream.buffer.rsplit("\r", 1)[-1].strip())
                    stream.buffer = ""
