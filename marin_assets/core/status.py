"""Status and lease of one output, kept in one small object next to it: `.status.json`.

Status (`RUNNING`, `SUCCESS`, `FAILED`) and lease (holder, token, heartbeat) share one object
so that every transition is a single compare-and-swap: a holder can mark `SUCCESS` only if
the object is still the one it last wrote. A holder that lost its lease (someone took over
after its heartbeat went stale) therefore cannot write a second success mark (Marin #8107).

Stores implement `read()` and `write_if(expected_version, new)`: on a local disk with
`fcntl.flock` around compare-and-replace; on GCS with generation preconditions
(`ifGenerationMatch`), exact across machines; on other fsspec stores best-effort (write,
then read back), documented as such.
"""

from __future__ import annotations

import enum
import fcntl
import functools
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path

STATUS_FILE = ".status.json"
LOCK_FILE = ".status.lock"


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


# An opaque version: the bytes last seen (local), or a generation number (object stores).
Version = Any


class StatusStore(Protocol):
    """Reads and compare-and-swaps the status object of one output (local disk, GCS, best effort)."""

    def read(self) -> tuple[StatusRecord | None, Version]: ...

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        """Replace the status if its version is still `expected` (None: must not exist).

        Returns the new version, or None when the precondition failed.
        """
        ...


class LocalStatusStore:
    """Compare-and-replace under `fcntl.flock`; readers never see a half-written file."""

    def __init__(self, output_path: str):
        self.dir = output_path
        self.path = os.path.join(output_path, STATUS_FILE)
        self.lock_path = os.path.join(output_path, LOCK_FILE)

    def read(self) -> tuple[StatusRecord | None, Version]:
        raw = read_bytes(self.path)
        return (None if raw is None else StatusRecord.from_bytes(raw)), raw

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        os.makedirs(self.dir, exist_ok=True)
        payload = new.to_bytes()
        with open(self.lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if read_bytes(self.path) != expected:
                    return None
                atomic_write(self.path, payload)
                return payload
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class BestEffortStatusStore:
    """For fsspec stores without conditional writes: write, wait, read back.

    Two writers racing within `settle` seconds can both believe they won; the documented
    price of a store with neither generations nor `If-Match`.
    """

    def __init__(self, output_path: str, settle: float = 0.1):
        self.dir = output_path
        self.url = join_path(output_path, STATUS_FILE)
        self.settle = settle

    def read(self) -> tuple[StatusRecord | None, Version]:
        raw = read_bytes(self.url)
        return (None if raw is None else StatusRecord.from_bytes(raw)), raw

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        if self.read()[1] != expected:
            return None
        payload = new.to_bytes()
        atomic_write(self.url, payload)
        time.sleep(self.settle)
        return payload if self.read()[1] == payload else None


class GCSStatusStore:
    """Compare-and-swap by GCS generation preconditions: a write names the generation it
    replaces (0: the object must not exist) and GCS refuses it (412) if another landed first.

    Credentials come from the standard Google chain (application default credentials, the
    metadata server, `GOOGLE_APPLICATION_CREDENTIALS`); `STORAGE_EMULATOR_HOST` points it at an
    emulator. The object is small, so each write is one request that is applied whole or not.
    """

    def __init__(self, output_path: str):
        bucket, _, key = output_path.split("://", 1)[1].partition("/")
        self.bucket = bucket
        self.name = f"{key.strip('/')}/{STATUS_FILE}" if key.strip("/") else STATUS_FILE

    def _blob(self) -> Any:
        return _gcs_client().bucket(self.bucket).blob(self.name)

    def read(self) -> tuple[StatusRecord | None, Version]:
        from google.api_core.exceptions import NotFound

        blob = self._blob()
        try:
            raw = blob.download_as_bytes()
        except NotFound:
            return None, None
        return StatusRecord.from_bytes(raw), blob.generation

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._blob()
        payload = new.to_bytes()
        try:
            blob.upload_from_string(payload, content_type="application/json", if_generation_match=expected or 0)
        except PreconditionFailed:
            # A retried request whose first attempt landed also gets 412: then the object is ours.
            found, generation = self.read()
            return generation if found is not None and found.to_bytes() == payload else None
        return blob.generation


@functools.cache
def _gcs_client() -> Any:
    from google.cloud import storage

    return storage.Client()


def status_store(output_path: str) -> StatusStore:
    """The store for an output path: local disk, GCS, or best effort for other URLs."""
    protocol = output_path.split("://", 1)[0] if "://" in output_path else "file"
    if protocol in ("file", "local"):
        return LocalStatusStore(output_path.removeprefix("file://"))
    if protocol in ("gs", "gcs"):
        return GCSStatusStore(output_path)
    return BestEffortStatusStore(output_path)


def read_status(output_path: str) -> StatusRecord | None:
    """The status object of the output at `output_path`, or None if there is none."""
    return status_store(output_path).read()[0]
