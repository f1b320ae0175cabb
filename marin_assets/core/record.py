"""Artifact record: `.artifact.json`, what a successful step produced and how.

Written after the data and before `SUCCESS`; served only when the status is `SUCCESS`, so
a record of an unfinished or failed step is never read as real (Marin #6836). Downstream
steps load a dependency's typed result with `load_result(dep)`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import RecordTypeError, declared_type, registered_type
from marin_assets.core.results import from_jsonable, type_label
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.stores import read_status

RECORD_FILE = ".artifact.json"
T = TypeVar("T")


class RecordNotAvailableError(RuntimeError):
    """No servable record: the step has not succeeded at that path."""


@dataclass(frozen=True)
class Provenance:
    """Who made an output, where, when, from which commit and command line."""

    run_id: str | None
    """Dagster run id, when materialized by Dagster."""
    user: str
    host: str
    git_commit: str | None
    created_at: str
    """ISO-8601 UTC time the record was written."""
    command_line: list[str]
    """The process's argv, with secret-looking values redacted."""


@dataclass(frozen=True)
class ArtifactRecord:
    """The content of `.artifact.json`: identity, dependencies, the typed result and provenance."""

    name: str
    hash: str
    hash_attrs: dict[str, Any]
    """The canonical encoding of the step's hash_attrs."""
    deps: list[str]
    """`name_with_hash` of each dependency."""
    output_path: str
    result: Any
    """The step function's return value, as JSON."""
    result_type: str | None
    """The result type's declared storage name (`train_result`: `core/record_types.py`), or `module:qualname` for
    a type that declares none (and in records made before storage names), for `load_result` without a type."""
    provenance: Provenance
    duration_s: float = 0.0
    """Wall seconds of the step's own work: its function, from call to return."""
    format: int = field(default=1)
    """The layout of this record (1 so far), stored under the key `version` that existing records hold."""
    content_version: str | None = None
    """What the output was made from beyond its identity: the source version a changing
    source reported, or a digest of the inputs' content versions; None for pure outputs."""
    input_versions: dict[str, str] = field(default_factory=dict)
    """`name_with_hash` → content version of each dependency that had one, when this was made."""
    startup_s: float = 0.0
    """Wall seconds spent making a place for the function to run before it started (starting or
    joining Ray), not counted in `duration_s`; 0 when none was needed (Ray was up, or a light step)."""
    prediction: dict[str, Any] | None = None
    """What was predicted before the function ran (work, wall time, device-hours, cost and their basis) beside
    what it measured, and the relative errors (`core/pricing.py`: `predicted_vs_actual`); None in records made
    before predictions were recorded, or when no prediction could be made."""

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data[_FORMAT_KEY] = data.pop("format")
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ArtifactRecord:
        data = json.loads(text)
        data["provenance"] = Provenance(**data["provenance"])
        if _FORMAT_KEY in data:
            data["format"] = data.pop(_FORMAT_KEY)
        return cls(**data)


_FORMAT_KEY = "version"
"""The JSON key of `ArtifactRecord.format`: the name it was written under before "version" came to mean
only content versions (`core/versions.py`); kept so that every record ever written still reads."""


def record_path(output_path: str) -> str:
    """Where the record of the output at `output_path` lives."""
    return join_path(output_path, RECORD_FILE)


def write_record(output_path: str, record: ArtifactRecord) -> None:
    """Whole-file write: a local temp file renamed into place, one object on a store."""
    atomic_write(record_path(output_path), record.to_json().encode())


def read_record(output_path: str, status: StatusRecord | None = None) -> ArtifactRecord:
    """The record of a step that succeeded at `output_path`; error otherwise.

    `status`: the status object just read by the caller, to save reading it again.
    """
    status = status or read_status(output_path)
    if status is None or status.status is not Status.SUCCESS:
        state = "no status" if status is None else status.status.value
        raise RecordNotAvailableError(f"no successful output at {output_path} ({state})")
    raw = read_bytes(record_path(output_path))
    if raw is None:
        raise RecordNotAvailableError(f"{output_path} is marked SUCCESS but has no {RECORD_FILE}")
    return ArtifactRecord.from_json(raw.decode())


def resolve_type(name: str) -> Any:
    """The type a record names: a declared storage name (`train_result`, `core/record_types.py`), or the
    `module:qualname` that records made before storage names hold. A path an imported type declared as its old
    name is that type; else the path is imported, and if its module is gone (or no longer holds the type) it is
    looked up among all the types' declared old names, then in the `MOVED_TYPES` table
    (`{old name: new name}`) of a package above its old module, so records written before a move still load."""
    if ":" not in name:
        return registered_type(name)
    declared = declared_type(name)  # where a type already imported lived before it moved: no import needed
    if declared is not None:
        return declared
    module, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ModuleNotFoundError, AttributeError):
        try:
            return registered_type(name)
        except RecordTypeError:
            pass
        moved = _moved_to(name)
        if moved is None:
            raise
        return resolve_type(moved)
    return obj


def _moved_to(name: str) -> str | None:
    parts = name.partition(":")[0].split(".")
    for end in range(len(parts) - 1, 0, -1):
        try:
            package = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        moved: dict[str, str] = getattr(package, "MOVED_TYPES", {})
        if name in moved:
            return moved[name]
    return None


def load_result(step_or_path: Any, result_type: type[T] | None = None) -> T:
    """The typed result a step returned, read from its record.

    `step_or_path` is a `Step` (its output under the current prefix) or an output path.
    Without `result_type`, the type recorded at write time is imported.
    """
    path = step_or_path if isinstance(step_or_path, str) else step_or_path.output_path
    record = read_record(path)
    if result_type is None:
        if record.result_type is None:
            return typing.cast(T, record.result)
        try:
            result_type = resolve_type(record.result_type)
        except (RecordTypeError, ImportError, AttributeError) as e:
            raise RecordTypeError(f"the record at {record_path(path)} names its result type"
                                  f" {record.result_type!r}, which does not load: {e}") from e
    try:
        return typing.cast(T, from_jsonable(record.result, result_type))
    except (TypeError, ValueError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(f"the result recorded at {path} does not load as {type_label(result_type)}: {e}") from None
