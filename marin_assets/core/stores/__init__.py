"""Where status objects are kept: one module per storage backend behind one interface.

- `base.py`: the interface the lease and `gc` use (`StatusStore`: read, `write_if`, `delete_if`,
  `location`) and what a *generation* is.
- `local.py` (a local disk, `flock`), `gcs.py` (generation preconditions), `s3.py` (conditional
  requests, probed before use), `best_effort.py` (any other fsspec store: write and read back).
- `registry.py`: URL scheme → backend (`status_store(path)`), and `read_status(path)`.

A new backend is one module implementing `StatusStore` and its schemes added to `registry.STORES`;
`tests/test_status_stores.py` drives every backend through the same assertions.
"""

from marin_assets.core.stores.base import Generation, StatusStore
from marin_assets.core.stores.best_effort import BestEffortStatusStore
from marin_assets.core.stores.gcs import GCSStatusStore
from marin_assets.core.stores.local import LocalStatusStore
from marin_assets.core.stores.registry import read_status, status_store
from marin_assets.core.stores.s3 import ConditionalWritesUnsupportedError, S3StatusStore

__all__ = [
    "BestEffortStatusStore",
    "ConditionalWritesUnsupportedError",
    "GCSStatusStore",
    "Generation",
    "LocalStatusStore",
    "S3StatusStore",
    "StatusStore",
    "read_status",
    "status_store",
]
