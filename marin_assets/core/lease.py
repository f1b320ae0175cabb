"""The lease protocol: who computes an output, exactly once, across processes and machines.

`acquire` loops on the status object of one output and does what `decision.decide` says:
reuse a `SUCCESS` (unless a recompute was asked for), wait for a live holder and decide again,
or take the lease (compare-and-swap) from nothing, a stale holder, `FAILED`, or the `SUCCESS`
being recomputed.

A `Lease` renews its heartbeat in a thread; every renewal and the final `SUCCESS`/`FAILED`
are compare-and-swaps against the generation the holder last wrote (`core/stores/`), so a
holder that lost its lease learns it and never marks success.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from marin_assets.core.decision import Action, decide
from marin_assets.core.status import Status, StatusRecord, new_holder_id
from marin_assets.core.stores import Generation, StatusStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    """How a lease behaves: heartbeat, when a silent holder counts as dead, how often to look."""

    heartbeat_interval: float = 30.0
    """Seconds between heartbeats of a holder."""
    stale_timeout: float = 90.0
    """A holder silent for this long is presumed dead and its lease may be taken over."""
    poll_interval: float = 5.0
    """Seconds between checks while waiting for another holder."""

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval < self.stale_timeout:
            raise ValueError(
                f"need 0 < heartbeat_interval ({self.heartbeat_interval}) < stale_timeout"
                f" ({self.stale_timeout})"
            )
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {self.poll_interval}")


class LeaseLostError(RuntimeError):
    """Another process took over this output; this holder's work must not be committed."""


@dataclass(frozen=True)
class Cached:
    """The output is already complete."""

    status: StatusRecord
    waited_s: float


class Lease:
    """The right to compute one output, held until `finish`."""

    def __init__(self, store: StatusStore, record: StatusRecord, generation: Generation,
                 settings: LeaseSettings, took_over: StatusRecord | None, waited_s: float, reason: str = ""):
        self.store = store
        self.record = record
        self.generation = generation
        """The generation of the status object this holder last wrote: every swap starts from it."""
        self.settings = settings
        self.took_over = took_over
        """The previous status object when this lease replaced a stale/failed/recomputed one."""
        self.reason = reason
        """Why the lease was taken (`decision.decide`'s reason): `no output yet`, `stale RUNNING by …`."""
        self.waited_s = waited_s
        self.lost = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _swap(self, new: StatusRecord) -> None:
        with self._lock:
            if self.lost.is_set():
                raise LeaseLostError(self._lost_message())
            generation = self.store.write_if(self.generation, new)
            if generation is None:
                self.lost.set()
                raise LeaseLostError(self._lost_message())
            self.record, self.generation = new, generation

    def _lost_message(self) -> str:
        current = self.store.read()[0]
        now = f"{current.status.value} by {current.holder}" if current else "deleted"
        return f"lease on {self.store.location} lost: status is now {now}"

    def renew(self) -> None:
        """Heartbeat now; raises `LeaseLostError` if someone else holds the output."""
        self._swap(self.record.renewed())

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.settings.heartbeat_interval):
                try:
                    self.renew()
                except LeaseLostError as e:
                    logger.error("%s", e)
                    return
                except Exception:  # a transient storage error: try again next beat
                    logger.exception("heartbeat failed")

        self._thread = threading.Thread(target=beat, name="marin-lease-heartbeat", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def finish(self, status: Status, error: str | None = None) -> None:
        """Write the final status; raises `LeaseLostError` if the lease is no longer ours."""
        self.stop_heartbeat()
        self._swap(self.record.renewed(status=status, error=error))


def acquire(
    store: StatusStore,
    settings: LeaseSettings,
    *,
    run_id: str | None = None,
    recompute: str | None = None,
    on_wait: Callable[[StatusRecord], None] | None = None,
    deadline: float | None = None,
) -> Lease | Cached:
    """Return a `Lease` to compute the output, or `Cached` when it is already complete.

    `recompute` (why) takes over a `SUCCESS` found on first look; if instead we wait for a
    live holder, its result is accepted (it is at least as new as our request).
    `deadline` (epoch seconds) bounds the wait; `TimeoutError` after it.
    """
    holder = new_holder_id()
    started = time.monotonic()
    last_wait_log = 0.0
    while True:
        current, generation = store.read()
        decision = decide(current, settings.stale_timeout, recompute=recompute)
        if decision.action is Action.REUSE:
            assert current is not None
            return Cached(current, time.monotonic() - started)
        if decision.action is Action.WAIT:
            assert current is not None
            recompute = None
            if on_wait is not None and time.monotonic() - last_wait_log >= max(settings.poll_interval, 30):
                on_wait(current)
                last_wait_log = time.monotonic()
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"still held by {current.holder} after waiting")
            time.sleep(settings.poll_interval)
            continue
        mine = StatusRecord(Status.RUNNING, holder=holder, token=uuid.uuid4().hex,
                            heartbeat=time.time(), run_id=run_id)
        new_generation = store.write_if(generation, mine)
        if new_generation is not None:
            return Lease(store, mine, new_generation, settings, took_over=current,
                         waited_s=time.monotonic() - started, reason=decision.reason)
        time.sleep(min(settings.poll_interval, 0.2))  # lost a race: look again
