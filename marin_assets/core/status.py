"""Status and lease of one output, kept in one small object next to it: `.status.json`.

Status (`RUNNING`, `SUCCESS`, `FAILED`) and lease (holder, token, heartbeat) share one object
so that every transition is a single compare-and-swap: a holder can mark `SUCCESS` only if
the object is still the one it last wrote. A holder that lost its lease (someone took over
after its heartbeat went stale) therefore cannot write a second success mark (Marin #8107).

This module is what the object holds. Where it is kept and how it is swapped — a local disk,
GCS, S3, or best effort on other fsspec stores — is `core/stores/`, one module per backend.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Any

STATUS_FILE = ".status.json"
LOCK_FILE = ".status.lock"
"""Beside the status object on a local disk only: the file `flock` holds while swapping it."""


class Status(str, enum.Enum):
    """The three states of an output: being computed, complete, or failed."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


@dataclass(frozen=True)
class StatusRecord:
    """The content of `.status.json`."""

    status: Status
    holder: str
    """`host:pid:id` of the process that wrote it."""
    token: str
    """Unique per lease acquisition; the holder's proof of ownership."""
    heartbeat: float
    """Wall-clock time (epoch seconds) of the holder's last renewal."""
    run_id: str | None = None
    error: str | None = None

    def is_live(self, stale_timeout: float, now: float | None = None) -> bool:
        """A RUNNING holder that renewed within `stale_timeout` seconds."""
        now = time.time() if now is None else now
        return self.status is Status.RUNNING and now - self.heartbeat < stale_timeout

    def to_bytes(self) -> bytes:
        data = asdict(self)
        data["status"] = self.status.value
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> StatusRecord:
        data = json.loads(raw)
        data["status"] = Status(data["status"])
        return cls(**data)

    def renewed(self, **changes: Any) -> StatusRecord:
        return replace(self, heartbeat=time.time(), **changes)


def new_holder_id() -> str:
    """A lease holder's name: `host:pid:random`, unique per acquisition attempt."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine: it exists and has not exited (a zombie, ended but not yet
    reaped by its parent, has not). Another user's process counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): it exists
