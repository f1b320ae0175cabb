"""Status objects on a local disk (or a shared POSIX file system): compare-and-replace under `flock`.

Every change takes an exclusive `fcntl.flock` on `.status.lock` beside the status object, compares
the bytes on disk with the expected ones (the generation is the bytes last seen), and replaces the
file by an atomic rename, so readers never see a half-written status.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.status import LOCK_FILE, STATUS_FILE, StatusRecord
from marin_assets.core.stores.base import Generation

RENAMED_AWAY = ".gc-"
"""`delete_if` renames an output folder to `.{name}{RENAMED_AWAY}{32 hex}` beside it before removing
it; `gc` finishes removing one left by a process that died in between."""


class LocalStatusStore:
    """Compare-and-replace under `fcntl.flock`; readers never see a half-written file."""

    def __init__(self, output_path: str):
        self.location = output_path.removeprefix("file://")
        self.path = os.path.join(self.location, STATUS_FILE)
        self.lock_path = os.path.join(self.location, LOCK_FILE)

    def read(self) -> tuple[StatusRecord | None, Generation | None]:
        raw = read_bytes(self.path)
        return (None if raw is None else StatusRecord.from_bytes(raw)), raw

    def write_if(self, expected: Generation | None, new: StatusRecord) -> Generation | None:
        os.makedirs(self.location, exist_ok=True)
        payload = new.to_bytes()
        with self._locked():
            if read_bytes(self.path) != expected:
                return None
            atomic_write(self.path, payload)
            return payload

    def delete_if(self, expected: Generation) -> bool:
        """Rename the whole output folder away under the lock, so that status, lock and folder vanish
        at once, then remove it. `gc` calls this once the folder holds nothing else: a materialization
        waiting on the old lock then writes into a fresh folder that nothing is removing."""
        parent, base = os.path.split(self.location)
        renamed = os.path.join(parent, f".{base}{RENAMED_AWAY}{uuid.uuid4().hex}")
        try:
            with self._locked():
                if read_bytes(self.path) != expected:
                    return False
                os.rename(self.location, renamed)
        except FileNotFoundError:  # no folder, so no status object either
            return False
        shutil.rmtree(renamed)
        return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
