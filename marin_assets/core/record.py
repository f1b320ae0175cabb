"""Artifact record: `.artifact.json`, what a successful step produced and how.

Written after the data and before `SUCCESS`; served only when the status is `SUCCESS`, so
a record of an unfinished or failed step is never read as real (Marin #6836). Downstream
steps load a dependency's typed result with `load_result(dep)`.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import pathlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.status import Status, StatusRecord, read_status

RECORD_FILE = ".artifact.json"
T = TypeVar("T")


class RecordNotAvailableError(RuntimeError):
    """No servable record: the step has not succeeded at that path."""


class StepResultError(TypeError):
    """The step function returned a value that cannot be recorded (or would not load back equal)."""


@dataclass(frozen=True)
class Provenance:
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
    """`module:qualname` of the result's type, for `load_result` without a type."""
    provenance: Provenance
    duration_s: float = 0.0
    version: int = field(default=1)
    """Format version of this record."""
    content_version: str | None = None
    """What the output was made from beyond its identity: the source version a changing
    source reported, or a digest of the inputs' content versions; None for pure outputs."""
    input_versions: dict[str, str] = field(default_factory=dict)
    """`name_with_hash` → content version of each dependency that had one, when this was made."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ArtifactRecord:
        data = json.loads(text)
        data["provenance"] = Provenance(**data["provenance"])
        return cls(**data)


def record_path(output_path: str) -> str:
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


def load_result(step_or_path: Any, result_type: type[T] | None = None) -> T:
    """The typed result a step returned, read from its record.

    `step_or_path` is a `Step` (its output under the current prefix) or an output path.
    Without `result_type`, the type recorded at write time is imported.
    """
    path = step_or_path if isinstance(step_or_path, str) else step_or_path.output_path
    record = read_record(path)
    if result_type is None:
        if record.result_type is None:
            return record.result
        module, _, qualname = record.result_type.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        result_type = obj
    return from_jsonable(record.result, result_type)


def encode_result(step_name: str, result: Any) -> Any:
    """The JSON form of a step's result, or `StepResultError` naming the step."""
    try:
        return to_jsonable(result)
    except TypeError as e:
        raise StepResultError(f"step {step_name!r}: {e}; return a dataclass, pydantic model"
                              " or plain JSON value") from None


def to_jsonable(value: Any) -> Any:
    """A JSON form of a step's result: dataclasses, pydantic, enums, paths, containers."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / jax scalars
        return value.item()
    raise TypeError(f"cannot record a result of type {type(value).__qualname__}")


def type_name(value: Any) -> str | None:
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return None
    tp = type(value)
    return f"{tp.__module__}:{tp.__qualname__}"


def from_jsonable(data: Any, tp: Any) -> Any:
    """Rebuild a value of type `tp` from `to_jsonable`'s output."""
    if tp is Any or tp is None or data is None:
        return data
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            try:
                return from_jsonable(data, arg)
            except (TypeError, ValueError, KeyError):
                continue
        return data
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        container = origin or tp
        if container is tuple and args and args[-1] is not Ellipsis:
            return tuple(from_jsonable(v, a) for v, a in zip(data, args))
        item = args[0] if args else Any
        return container(from_jsonable(v, item) for v in data)
    if origin is dict or tp is dict:
        key_t, val_t = args if args else (Any, Any)
        return {from_jsonable(k, key_t): from_jsonable(v, val_t) for k, v in data.items()}
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            kwargs = {f.name: from_jsonable(data[f.name], hints.get(f.name, Any))
                      for f in dataclasses.fields(tp) if f.init and f.name in data}
            return tp(**kwargs)
        if hasattr(tp, "model_validate"):
            return tp.model_validate(data)
        if issubclass(tp, (enum.Enum, pathlib.PurePath)):
            return tp(data)
    return data
