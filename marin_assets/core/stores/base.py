"""The status-store interface: what the lease and `gc` need from wherever a status object is kept.

A store reads the status object of one output and changes it only by compare-and-swap, naming the
*generation* it last saw: create it if absent, replace it, or delete it, each only if no other
writer got there first. That is all the exactly-once protocol asks of storage (`core/lease.py`,
`core/gc/`), so a new backend is one module implementing `StatusStore`, registered by URL scheme in
`registry.py`.

Words: a *generation* is the compare-and-swap token of the status object — whatever the backend
checks a conditional request against (the bytes last seen on a local disk, the GCS object
generation, the S3 ETag). It is opaque: compared for equality and handed back to the store that
gave it, never parsed. "Version" is kept for what an output's content was made from
(`core/versions.py`).
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

from marin_assets.core.status import StatusRecord

Generation: TypeAlias = bytes | int | str
"""A status object's compare-and-swap token: bytes (local disk, best effort), a GCS generation
number, or an S3 ETag. Opaque to everyone but the store that handed it out."""


class StatusStore(Protocol):
    """Reads and compare-and-swaps the status object of one output."""

    @property
    def location(self) -> str:
        """The output folder (path or URL) whose status this store keeps, for messages."""
        ...

    def read(self) -> tuple[StatusRecord | None, Generation | None]:
        """The status object and its generation; `(None, None)` when there is none."""
        ...

    def write_if(self, expected: Generation | None, new: StatusRecord) -> Generation | None:
        """Write `new` if the status object's generation is still `expected` (None: it must not exist).

        Returns the new generation, or None when another writer got there first.
        """
        ...

    def delete_if(self, expected: Generation) -> bool:
        """Remove the status object if its generation is still `expected`; True if removed.

        `gc` calls it last, once the output's data is gone, to hand the name back: a waiting
        materialization then finds no status and starts from scratch.
        """
        ...
