"""Deletion: remove a listed output through the lease protocol, so that a materialization racing it
either wins or runs after it — never on half of it.

1. **Take the lease** by one compare-and-swap from the status generation seen when listing to a `RUNNING`
   lease whose run id is `GC_RUN_ID`. If anything changed the status since (a materialization took the
   lease, finished, failed), the swap fails and the output is kept. A materialization arriving now sees a
   live holder and waits; one already holding a live lease was never swapped (live leases are kept).
2. **Delete the data**, heartbeating like any holder, and stop if the lease is lost.
3. **Remove the status object** only if it is still ours: the store's `delete_if` (on a local disk it
   renames the folder away under the status lock, so status, lock and folder vanish at once; on GCS a
   generation precondition; on S3 `If-Match`). A waiting materialization now finds no status and computes
   from scratch into a folder gc no longer touches.

So a racing materialization ends with a complete `SUCCESS` output or with none; a holder whose lease gc
took over (it was stale) cannot mark `SUCCESS`, since its final compare-and-swap fails. An interrupted gc
leaves its lease `FAILED` (or stale, if killed); a materialization that takes it over starts from an empty
folder (`materialize_step` clears it), and the next gc finishes the deletion.

Limits, documented rather than hidden: a reader that saw `SUCCESS` before gc took the lease may still be
reading files being deleted (gc deletes only what no known definition reads; pass the others with `also`);
on a local disk, a process that read "no status" before gc took the lease and then stalled through the
whole deletion could lock the renamed lock file while another locks a new one (both then compete; one
learns it lost at its next heartbeat, before marking anything), and removing an emptied parent folder can
make a materialization starting in it at that very instant fail (loudly; a retry succeeds); stores without
conditional writes are best effort.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import fsspec

from marin_assets.core.gc.listing import DELETE, GC_RUN_ID, LEFTOVER, GcEntry, GcReport, is_step_folder
from marin_assets.core.lease import Lease, LeaseLostError, LeaseSettings
from marin_assets.core.paths import join_path, normalize_prefix
from marin_assets.core.status import LOCK_FILE, STATUS_FILE, Status, StatusRecord, new_holder_id
from marin_assets.core.stores import status_store


@dataclass(frozen=True)
class Deletion:
    """What happened to one output gc set out to delete."""

    path: str
    relative: str
    deleted: bool
    freed_bytes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)



def delete_garbage(report: GcReport, settings: LeaseSettings = LeaseSettings(),
                   on_done: Callable[[Deletion], None] | None = None, workers: int = 8) -> tuple[Deletion, ...]:
    """Delete every entry of `report` marked `delete` (see `delete_output`), `workers` outputs at a time
    (object stores spend most of a deletion waiting on requests); `on_done` hears of each as it ends."""
    def one(entry: GcEntry) -> Deletion:
        deletion = delete_output(entry, report.prefix, settings)
        if on_done is not None:
            on_done(deletion)
        return deletion

    pool = concurrent.futures.ThreadPoolExecutor(max(1, workers))
    try:
        return tuple(pool.map(one, report.to_delete))
    finally:  # interrupted: deletions under way finish (each is safe to stop), none new starts
        pool.shutdown(wait=True, cancel_futures=True)


def delete_output(entry: GcEntry, prefix: str, settings: LeaseSettings = LeaseSettings()) -> Deletion:
    """Delete one listed output under the lease protocol (module docstring); keep it if its status changed.

    Refuses (ValueError) an entry not marked `delete`, not content-addressed, or not inside `prefix`.
    """
    root = normalize_prefix(prefix)
    _check_deletable(entry, root)
    if entry.state == "leftover":  # no one uses this name: no lease to take
        shutil.rmtree(entry.path, ignore_errors=True)
        return Deletion(entry.path, entry.relative, not os.path.exists(entry.path), entry.size_bytes, "deleted")
    store = status_store(entry.path)
    mine = StatusRecord(Status.RUNNING, holder=new_holder_id(), token=uuid.uuid4().hex, heartbeat=time.time(),
                        run_id=GC_RUN_ID)
    generation = store.write_if(entry.generation, mine)
    if generation is None:
        now = store.read()[0]
        found = f"{now.status.value} by {now.holder} (run {now.run_id})" if now else "no status"
        return Deletion(entry.path, entry.relative, False, 0,
                        f"kept: its status changed since it was listed (now {found})")
    lease = Lease(store, mine, generation, settings, took_over=entry.record, waited_s=0.0, reason="marin-assets gc")
    lease.start_heartbeat()
    try:
        _delete_contents(entry.path, root, lease)
        lease.stop_heartbeat()
        if not store.delete_if(lease.generation):
            raise LeaseLostError(f"lease on {entry.path} lost before its status object was removed")
    except LeaseLostError as e:
        lease.stop_heartbeat()
        return Deletion(entry.path, entry.relative, False, 0, f"stopped: {e}; a new holder starts it afresh")
    except BaseException as e:
        lease.stop_heartbeat()
        try:  # FAILED by gc: a materialization takes it over from an empty folder, the next gc finishes it
            lease.finish(Status.FAILED, error=f"deletion by marin-assets gc interrupted: {type(e).__name__}: {e}")
        except Exception:
            pass
        if isinstance(e, Exception):
            e.add_note(f"(while marin-assets gc was deleting {entry.path})")
        raise
    _remove_empty_parents(entry.path, root)
    return Deletion(entry.path, entry.relative, True, entry.size_bytes, "deleted")


def _check_deletable(entry: GcEntry, root: str) -> None:
    """Only a listed, unreferenced, content-addressed output strictly inside the prefix; never a link."""
    problem = None
    if entry.action != DELETE or entry.referenced_by is not None:
        problem = f"it is not marked for deletion ({entry.action}: {entry.reason})"
    elif entry.path != join_path(root, entry.relative) or not (
            entry.state == "leftover" and "://" not in root and LEFTOVER.match(entry.relative.rpartition("/")[2])
            or entry.name is not None and is_step_folder(entry.relative)):
        problem = f"it is not a content-addressed output inside the storage prefix {root}"
    elif "://" not in root:
        real_root = os.path.realpath(root)
        if os.path.islink(entry.path) or not os.path.realpath(entry.path).startswith(real_root + os.sep):
            problem = f"it resolves outside the storage prefix {root}"
    if problem:
        raise ValueError(f"marin-assets gc: refusing to delete {entry.path}: {problem}")


def _delete_contents(path: str, root: str, lease: Lease) -> None:
    """Everything in the output folder but its status object and lock, stopping if the lease is lost."""
    def check() -> None:
        if lease.lost.is_set():
            raise LeaseLostError(f"lease on {path} lost while deleting")

    if "://" not in root:
        if not os.path.isdir(path):
            return
        with os.scandir(path) as it:
            entries = [e for e in it if e.name not in (STATUS_FILE, LOCK_FILE)]
        for e in entries:
            check()
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)  # never follows links: a link inside is removed, not its target
            else:
                os.unlink(e.path)
        return
    fs, base = fsspec.core.url_to_fs(path)
    base = base.rstrip("/")
    fs.invalidate_cache()
    doomed = [p for p in fs.find(base) if p.startswith(base + "/") and p != f"{base}/{STATUS_FILE}"]
    for i in range(0, len(doomed), 500):
        check()
        fs.rm(doomed[i:i + 500])


def _remove_empty_parents(path: str, root: str) -> None:
    """On a local disk, the empty folders above a deleted output, up to (not including) the prefix."""
    if "://" in root:
        return
    here = os.path.dirname(path)
    while here.startswith(root + "/"):
        try:
            os.rmdir(here)
        except OSError:
            if os.path.isdir(here):
                return
        here = os.path.dirname(here)
