"""On a Ray worker: stop the step the moment the process that holds its lease is gone.

A step's Ray worker is its own process: when the Dagster process holding the step's lease (the driver) is
killed, Ray notices only when its own processes die with it, and meanwhile the worker goes on writing into
an output nobody will mark finished (seen: 7 training iterations and two checkpoints in the ~2 s after a
kill). The worker learns its driver from the output's status object — `RUNNING` by `host:pid:id`, written
before the task was submitted — and watches it:

- a driver on this machine is watched through a pidfd (Linux; else a poll every 50 ms): its death ends the
  worker at once, with SIGKILL, before the step can write another byte;
- whatever the machine, the status object is read every `check_s` seconds: a different lease token (the
  lease was taken over) or a status that is no longer `RUNNING` ends the worker too.

No Ray import: `relay.run_relaying` starts it around the step's function.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

from marin_assets.core.status import Status, StatusRecord, process_alive
from marin_assets.core.stores import read_status

CHECK_S = 5.0
"""Seconds between reads of the status object."""


def _driver_of(output_path: str) -> StatusRecord | None:
    """The RUNNING status the driver wrote before it submitted the task (None: nothing to watch)."""
    try:
        status = read_status(output_path)
    except Exception:
        return None
    return status if status is not None and status.status is Status.RUNNING else None


def _local_pid(holder: str) -> int | None:
    """The holder's pid when it runs on this machine and can be seen from here."""
    host, _, rest = holder.partition(":")
    pid_text = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    if not process_alive(pid):
        return None  # not visible from here (another pid namespace): the status check covers it
    return pid if pid != os.getpid() else None


def _end_worker(why: str) -> None:
    try:
        stream = sys.__stderr__
        if stream is not None:
            stream.write(f"marin-assets: {why}: ending this worker now, so that nothing more is written\n")
            stream.flush()
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_exit(pid: int, timeout: float) -> bool:
    """Whether process `pid` ended within `timeout` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process_alive(pid):
                return True
            time.sleep(0.05)
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(fd)


@contextlib.contextmanager
def watching_driver(output_path: str, check_s: float = CHECK_S) -> Iterator[StatusRecord | None]:
    """Watch the lease holder of `output_path` while the block runs; end this process if it dies or loses
    the lease. Yields the holder's status (None: no RUNNING status to watch, e.g. a test calling directly)."""
    driver = _driver_of(output_path)
    if driver is None:
        yield None
        return
    finished = threading.Event()
    pid = _local_pid(driver.holder)

    def watch() -> None:
        next_check = time.monotonic() + check_s
        while not finished.is_set():
            wait = max(0.0, next_check - time.monotonic())
            if pid is not None:
                if _wait_for_exit(pid, min(wait, 1.0)) and not finished.is_set():
                    _end_worker(f"the process holding the lease ({driver.holder}) is gone")
            elif finished.wait(min(wait, 1.0)):
                return
            if time.monotonic() < next_check or finished.is_set():
                continue
            next_check = time.monotonic() + check_s
            try:
                now = read_status(output_path)
            except Exception:
                continue  # a transient storage error: look again next time
            if now is None or now.token != driver.token or now.status is not Status.RUNNING:
                if not finished.is_set():
                    state = "deleted" if now is None else f"{now.status.value} by {now.holder}"
                    _end_worker(f"the lease on {output_path} is no longer this step's (status: {state})")

    thread = threading.Thread(target=watch, name="marin-driver-watch", daemon=True)
    thread.start()
    try:
        yield driver
    finally:
        finished.set()
