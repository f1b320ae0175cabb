"""Garbage collection: find the outputs under a prefix that no definition references, and delete them safely.

`listing.py` finds them and says, for each, whether it may go and why (`find_garbage`); `deletion.py`
deletes through the lease protocol, so a materialization racing it either wins or runs after it, never on
half of it (`delete_garbage`, `delete_output`). The `marin-assets gc` command calls both.
"""

from marin_assets.core.gc.deletion import Deletion, delete_garbage, delete_output
from marin_assets.core.gc.listing import (
    DELETE,
    GC_RUN_ID,
    KEEP,
    GcEntry,
    GcReport,
    StepFamily,
    find_garbage,
    parse_duration,
)

__all__ = [
    "DELETE",
    "GC_RUN_ID",
    "KEEP",
    "Deletion",
    "GcEntry",
    "GcReport",
    "StepFamily",
    "delete_garbage",
    "delete_output",
    "find_garbage",
    "parse_duration",
]
