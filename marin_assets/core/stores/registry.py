"""Which store keeps an output's status: chosen by the URL scheme of its path, in one table.

A path without a scheme is a local path. A scheme the table does not name gets the best-effort store
(fsspec, no conditional requests), so any fsspec URL works, exactly-once only where a backend makes it so.
"""

from __future__ import annotations

from collections.abc import Callable

from marin_assets.core.status import StatusRecord
from marin_assets.core.stores.base import StatusStore
from marin_assets.core.stores.best_effort import BestEffortStatusStore
from marin_assets.core.stores.gcs import GCSStatusStore
from marin_assets.core.stores.local import LocalStatusStore
from marin_assets.core.stores.s3 import S3StatusStore

STORES: dict[str, Callable[[str], StatusStore]] = {
    "file": LocalStatusStore,
    "local": LocalStatusStore,
    "gs": GCSStatusStore,
    "gcs": GCSStatusStore,
    "s3": S3StatusStore,
    "s3a": S3StatusStore,
}
"""URL scheme → the store for an output path with it (a new backend adds its schemes here)."""

FALLBACK: Callable[[str], StatusStore] = BestEffortStatusStore
"""The store for a scheme `STORES` does not name."""


def scheme_of(output_path: str) -> str:
    """`gs` for `gs://bucket/x`; `file` for a path with no scheme."""
    return output_path.split("://", 1)[0] if "://" in output_path else "file"


def status_store(output_path: str) -> StatusStore:
    """The store that keeps the status of the output at `output_path` (a local path or URL)."""
    return STORES.get(scheme_of(output_path), FALLBACK)(output_path)


def read_status(output_path: str) -> StatusRecord | None:
    """The status object of the output at `output_path`, or None if there is none."""
    return status_store(output_path).read()[0]
