"""Status objects on fsspec stores with no conditional requests: write, wait, read back.

The fallback for every URL scheme the registry does not name. Two writers racing within `settle`
seconds can both believe they won: the documented price of a store with neither generations nor
`If-Match`.
"""

from __future__ import annotations

import time

import fsspec

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.status import STATUS_FILE, StatusRecord
from marin_assets.core.stores.base import Generation


class BestEffortStatusStore:
    """Compare, write, wait `settle` seconds, read back: exact only when writers do not overlap."""

    def __init__(self, output_path: str, settle: float = 0.1):
        self.location = output_path
        self.url = join_path(output_path, STATUS_FILE)
        self.settle = settle

    def read(self) -> tuple[StatusRecord | None, Generation | None]:
        raw = read_bytes(self.url)
        return (None if raw is None else StatusRecord.from_bytes(raw)), raw

    def write_if(self, expected: Generation | None, new: StatusRecord) -> Generation | None:
        if self.read()[1] != expected:
            return None
        payload = new.to_bytes()
        atomic_write(self.url, payload)
        time.sleep(self.settle)
        return payload if self.read()[1] == payload else None

    def delete_if(self, expected: Generation) -> bool:
        if self.read()[1] != expected:
            return False
        fs, path = fsspec.core.url_to_fs(self.url)
        fs.rm(path)
        return True
