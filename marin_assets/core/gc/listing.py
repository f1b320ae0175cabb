"""Listing: which outputs under a prefix no definition references, and whether gc may delete each.

An output is the folder `{prefix}/{name}_{hash}`; it is *referenced* when a current step (or a step of a
family, such as the per-checkpoint evaluations) has exactly that name and hash. `find_garbage` lists every
unreferenced output with its size, age and status, and decides for each whether it may go: a `SUCCESS` of an
old identity may; a live lease never; a partial output (`FAILED`, stale `RUNNING`, no status) only when it
is older than `older_than_s` (someone may still be looking at a fresh failure). It also lists referenced
partial outputs older than that, which are kept: materializing their step replaces them. Each entry keeps
the status generation it saw, from which deletion compare-and-swaps (`deletion.py`).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from marin_assets.core.decision import State, decide
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.paths import join_path, normalize_prefix
from marin_assets.core.status import LOCK_FILE, STATUS_FILE, StatusRecord
from marin_assets.core.step import Step, StepDefinitionError, validate_name
from marin_assets.core.stores import Generation, status_store
from marin_assets.core.stores.local import RENAMED_AWAY

GC_RUN_ID = "marin-assets-gc"
"""The run id of the lease gc holds while deleting: waiters see who holds the output, and a materialization
taking over an interrupted deletion starts from an empty folder."""

DELETE = "delete"
KEEP = "keep"
_CONTENT_ADDRESSED = re.compile(r"^(?P<stem>.+)_(?P<hash>[0-9a-f]{8})$")
LEFTOVER = re.compile(rf"^\.(?P<output>.+_[0-9a-f]{{8}}){re.escape(RENAMED_AWAY)}[0-9a-f]{{32}}$")
"""A local output renamed away to delete it (`.{name}_{hash}.gc-{token}`, by `LocalStatusStore.delete_if`),
left by a gc that died before removing it."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_Read = tuple[StatusRecord | None, Generation | None, str | None]
"""A status read while listing: the object, its generation, and why it could not be read (or None)."""


@dataclass(frozen=True)
class StepFamily:
    """Steps made on demand, one per key (a partitioned asset: one evaluation per checkpoint).

    gc cannot list every member, so it asks by output name: `step_named(name)` returns the member with that
    name, or None if the family has none.
    """

    name: str
    """The family's name; its members are named `{name}/…`."""
    step_named: Callable[[str], Step | None] = field(repr=False)


@dataclass(frozen=True)
class GcEntry:
    """One output folder under the prefix: what it is, and whether gc may delete it."""

    path: str
    """Full path or URL of the output folder."""
    relative: str
    """The folder relative to the prefix (`t/numbers_1a2b3c4d`)."""
    name: str | None
    """The step name its folder encodes; None for a folder that is not `{name}_{hash}`."""
    hash: str | None
    status: str | None
    """`SUCCESS`, `FAILED`, `RUNNING`, or None when there is no status object."""
    state: str
    """`success`, `failed`, `live`, `stale` (a `RUNNING` holder that stopped renewing), `missing` (no status),
    `unreadable` (a corrupt status object), `leftover` (renamed away by a gc that died before removing it)."""
    size_bytes: int
    files: int
    modified: float
    """Epoch seconds of the newest file in it."""
    age_s: float
    """Seconds since `modified`, when listed."""
    referenced_by: str | None
    """The step that references it, if any (such outputs are never deleted)."""
    action: str
    """`delete` or `keep`."""
    reason: str
    """Why, in one line."""
    holder: str | None = None
    """The lease holder named in the status object."""
    generation: Generation | None = field(default=None, repr=False, compare=False)
    """The status object's generation when listed: deletion compare-and-swaps from it."""
    record: StatusRecord | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (not the status generation)."""
        out = asdict(self)
        del out["generation"], out["record"]
        return out


@dataclass(frozen=True)
class GcReport:
    """What `find_garbage` found under a prefix."""

    prefix: str
    older_than_s: float
    listed_at: float
    """Epoch seconds of the listing."""
    entries: tuple[GcEntry, ...]
    scanned_files: int

    @property
    def to_delete(self) -> tuple[GcEntry, ...]:
        """The entries gc would delete."""
        return tuple(e for e in self.entries if e.action == DELETE)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the entries and totals."""
        doomed = self.to_delete
        return {"prefix": self.prefix, "older_than_s": self.older_than_s, "listed_at": self.listed_at,
                "scanned_files": self.scanned_files, "outputs": [e.to_dict() for e in self.entries],
                "to_delete": {"outputs": len(doomed), "bytes": sum(e.size_bytes for e in doomed)}}



def parse_duration(text: str) -> float:
    """Seconds in `7d`, `12h`, `30m`, `45s`, `2w` (or a bare number of seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not match:
        raise ValueError(f"invalid duration {text!r}: expected a number and a unit s, m, h, d or w (e.g. 7d, 12h)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def find_garbage(prefix: str, steps: Sequence[Step], *, families: Sequence[StepFamily] = (),
                 older_than_s: float, settings: LeaseSettings = LeaseSettings(),
                 now: float | None = None) -> GcReport:
    """Every output under `prefix` that `steps` (and everything they depend on) and `families` do not
    reference, plus referenced partial outputs older than `older_than_s`; each with what gc would do.

    Nothing is written. Folders that are not outputs (files beside them, hidden folders, anything
    reached through a symbolic link) are ignored; outputs nested in an output are part of it.
    """
    root = normalize_prefix(prefix)
    now = time.time() if now is None else now
    referenced, defined = _references(root, steps)
    files, dirs = _scan(root)
    roots = _output_roots(files, dirs)
    owned: dict[str, list[tuple[int, float]]] = {r: [] for r in roots}
    for rel, info in files.items():
        owner = _owner(rel, roots)
        if owner is not None:
            owned[owner].append(info)
    statuses = _read_statuses(root, [r for r in roots if f"{r}/{STATUS_FILE}" in files])
    holding = {a: r for r in referenced for a in _ancestors(r)}  # folder → a referenced output inside it
    entries = []
    for rel in sorted(roots):
        infos = owned[rel]
        modified = max([m for _, m in infos] + [dirs.get(rel, 0.0)])
        entry = _entry(root, rel, infos, modified, now, statuses.get(rel, (None, None, None)), referenced, defined,
                       holding, families, older_than_s, settings)
        if entry is not None:
            entries.append(entry)
    return GcReport(root, older_than_s, now, tuple(entries), len(files))


# --- what the definitions reference ---------------------------------------------------------------


def _references(root: str, steps: Sequence[Step]) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Output folder (relative) → the step referencing it; step name → its defined hashes."""
    referenced: dict[str, str] = {}
    defined: dict[str, set[str]] = {}
    seen: set[int] = set()
    stack = list(steps)
    while stack:  # like `walk`, but two sources may define one name with different hashes: both are kept
        step = stack.pop()
        if id(step) in seen:
            continue
        seen.add(id(step))
        stack.extend(step.deps)
        defined.setdefault(step.name, set()).add(step.hash)
        out = step.output_path_under(root)
        if out.startswith(root + "/"):
            referenced[out[len(root) + 1:]] = step.name
    return referenced, defined


def _family_member(families: Sequence[StepFamily], root: str, rel: str, name: str | None) -> str | None:
    """The family member whose output is `rel`, if any."""
    if name is None:
        return None
    for family in families:
        if name.startswith(family.name + "/"):
            step = family.step_named(name)
            if step is not None and step.output_path_under(root) == join_path(root, rel):
                return step.name
    return None


# --- listing ---------------------------------------------------------------------------------------


def _scan(root: str) -> tuple[dict[str, tuple[int, float]], dict[str, float]]:
    """Files under `root` (relative path → size, mtime) and, on a local disk, folders (→ mtime).

    A local scan never follows symbolic links: a link is a file of its own size, its target is not read.
    """
    fs, path = fsspec.core.url_to_fs(root)
    files: dict[str, tuple[int, float]] = {}
    dirs: dict[str, float] = {}
    if isinstance(fs, LocalFileSystem):
        if not os.path.isdir(path):
            return files, dirs
        stack = [(path, "")]
        while stack:
            here, rel = stack.pop()
            with os.scandir(here) as it:
                for e in it:
                    sub = f"{rel}/{e.name}" if rel else e.name
                    st = e.stat(follow_symlinks=False)
                    if e.is_dir(follow_symlinks=False):
                        dirs[sub] = st.st_mtime
                        stack.append((e.path, sub))
                    else:
                        files[sub] = (st.st_size, st.st_mtime)
        return files, dirs
    fs.invalidate_cache()
    base = path.rstrip("/")
    for p, info in fs.find(base, detail=True).items():
        if p.startswith(base + "/") and info.get("type") != "directory":
            files[p[len(base) + 1:]] = (int(info.get("size") or 0), _mtime(info))
    return files, dirs


def _mtime(info: dict[str, Any]) -> float:
    """Modification time of an fsspec listing entry (local, GCS, S3), as epoch seconds."""
    for key in ("mtime", "LastModified", "updated", "last_modified"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, dt.datetime):
            return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
        if isinstance(value, str):
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def _ancestors(rel: str) -> Iterable[str]:
    """`a`, `a/b` for `a/b/c`: proper ancestors, shallowest first."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def is_step_folder(rel: str) -> bool:
    """A folder a step could own: every segment valid in a step name (no hidden folders)."""
    try:
        validate_name(rel)
    except StepDefinitionError:
        return False
    return True


def _output_roots(files: dict[str, tuple[int, float]], dirs: dict[str, float]) -> set[str]:
    """Output folders: holding a status object or lock, or named `{name}_{hash}` with no output under them;
    the outermost of nested ones."""
    with_status = {rel.rpartition("/")[0] for rel in files if rel.rpartition("/")[2] in (STATUS_FILE, LOCK_FILE)}
    holds_status = {a for s in with_status for a in _ancestors(s)}
    all_dirs = set(dirs) | {a for rel in files for a in _ancestors(rel)}
    named = {d for d in all_dirs if _CONTENT_ADDRESSED.match(d.rpartition("/")[2]) and d not in holds_status}
    candidates = {d for d in (with_status | named) if d and is_step_folder(d)}
    outer = {c for c in candidates if not any(a in candidates for a in _ancestors(c))}
    leftovers = {d for d in all_dirs if LEFTOVER.match(d.rpartition("/")[2])
                 and is_step_folder(d.rpartition("/")[0] or "x") and not any(a in outer for a in _ancestors(d))}
    return outer | leftovers


def _owner(rel: str, roots: set[str]) -> str | None:
    """The output a file belongs to, if any."""
    for a in _ancestors(rel):
        if a in roots:
            return a
    return None


def _read_statuses(root: str, rels: Sequence[str]) -> dict[str, _Read]:
    """Status object, generation and read error of each output (in parallel on object stores)."""
    def one(rel: str) -> _Read:
        path = join_path(root, rel)
        try:
            record, generation = status_store(path).read()
        except (ValueError, TypeError, KeyError) as e:  # not JSON, or not a status object
            return None, None, f"unreadable {join_path(path, STATUS_FILE)}: {type(e).__name__}: {e}"
        return record, generation, None

    if "://" not in root:
        return {rel: one(rel) for rel in rels}
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return dict(zip(rels, pool.map(one, rels), strict=True))


def _entry(root: str, rel: str, infos: list[tuple[int, float]], modified: float, now: float,
           status: _Read, referenced: dict[str, str],
           defined: dict[str, set[str]], holding: dict[str, str], families: Sequence[StepFamily], older_than_s: float,
           settings: LeaseSettings) -> GcEntry | None:
    """The entry for one output folder, or None when it is referenced and complete (nothing to say)."""
    record, generation, unreadable = status
    if LEFTOVER.match(rel.rpartition("/")[2]):
        return GcEntry(path=join_path(root, rel), relative=rel, name=None, hash=None, status=None, state="leftover",
                       size_bytes=sum(s for s, _ in infos), files=len(infos), modified=modified,
                       age_s=round(max(0.0, now - modified), 3), referenced_by=None, action=DELETE,
                       reason="renamed away by a marin-assets gc that did not finish removing it")
    match = _CONTENT_ADDRESSED.match(rel.rpartition("/")[2])
    name, digest = (rel[:-9], match.group("hash")) if match else (None, None)
    decision = decide(record, settings.stale_timeout, now=now)
    state = "unreadable" if unreadable else decision.state.value
    age = max(0.0, now - modified)
    partial = decision.state in (State.FAILED, State.STALE, State.MISSING)
    by_gc = record is not None and record.run_id == GC_RUN_ID and decision.state in (State.FAILED, State.STALE)
    referenced_by = referenced.get(rel) or _family_member(families, root, rel, name)
    inside = holding.get(rel)
    described = "no status object" if record is None else decision.reason
    if unreadable:
        action, reason = KEEP, f"{unreadable}; fix or remove it by hand"
    elif referenced_by is not None:
        if not (partial and age >= older_than_s):
            return None
        action, reason = KEEP, (f"referenced by {referenced_by}; partial output ({described}), "
                                f"older than {_age(older_than_s)}: materializing it replaces it")
    elif inside is not None:
        action, reason = KEEP, f"holds {inside}, which {referenced[inside]} references"
    elif name is None:
        action, reason = KEEP, "not a content-addressed output ({name}_{hash}); gc never deletes it"
    elif decision.state is State.LIVE:
        action, reason = KEEP, f"live lease: {decision.reason}"
    elif by_gc:
        action, reason = DELETE, f"a deletion by marin-assets gc was interrupted ({described}); finishing it"
    else:
        hashes = sorted(defined.get(name, ()))
        why = (f"unreferenced: {name} is now {', '.join(hashes)}" if hashes
               else f"unreferenced: no definition named {name}")
        if not partial:
            action, reason = DELETE, f"{why}; SUCCESS"
        elif age >= older_than_s:
            action, reason = DELETE, f"{why}; partial output ({described}), older than {_age(older_than_s)}"
        else:
            action, reason = KEEP, (f"{why}; partial output ({described}), {_age(age)} old: younger than"
                                    f" --older-than {_age(older_than_s)}")
    return GcEntry(path=join_path(root, rel), relative=rel, name=name, hash=digest,
                   status=record.status.value if record else None, state=state,
                   size_bytes=sum(s for s, _ in infos), files=len(infos), modified=modified, age_s=round(age, 3),
                   referenced_by=referenced_by, action=action, reason=reason,
                   holder=record.holder if record else None, generation=generation, record=record)


def _age(seconds: float) -> str:
    """`7d`, `12h`, `5m`, `30s`: the largest whole unit."""
    for unit, size in (("d", _UNITS["d"]), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}" if seconds % size == 0 else f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
