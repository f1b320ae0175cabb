"""Identity: the hash of exactly what produces a step's output.

`hash = sha256(canonical_json({name, attrs, sorted dep name_with_hash}))[:8]`. The canonical
encoding is strict on purpose: a value without a stable encoding (a callable, an object whose
only encoding is its memory address) would make the hash differ between processes, so it is
an error at definition time instead of a silent `str()`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import json
import math
import pathlib
from collections.abc import Mapping, Sequence, Set
from typing import Any

HASH_LENGTH = 8


class UnhashableAttrError(TypeError):
    """A hash_attrs value has no stable canonical encoding."""


def canonical(value: Any, where: str = "hash_attrs") -> Any:
    """Return a plain-JSON form of `value` that is the same in every process.

    `where` names the attribute being encoded (e.g. `hash_attrs['model'].hidden`) so that
    errors point at the offending field.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):  # before int: IntEnum is an int
        return canonical(value.value, f"{where}.value")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnhashableAttrError(f"{where} is {value!r}, which has no JSON encoding")
        return float(value)
    if isinstance(value, pathlib.PurePath):
        return value.as_posix()
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: canonical(getattr(value, f.name), f"{where}.{f.name}")
            for f in dataclasses.fields(value)
        }
    if is_pydantic_model(value):
        return {
            name: canonical(getattr(value, name), f"{where}.{name}")
            for name in type(value).model_fields
        }
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if isinstance(key, enum.Enum):
                key = key.value
            if not isinstance(key, str):
                raise UnhashableAttrError(
                    f"{where} has a key {key!r} of type {type(key).__name__}; keys must be strings"
                )
            out[key] = canonical(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, Set):
        items = [canonical(item, f"{where}{{…}}") for item in value]
        return sorted(items, key=_dumps)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [canonical(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if callable(value):
        raise UnhashableAttrError(
            f"{where} is a callable ({_describe(value)}); put the values that configure it in"
            " hash_attrs instead"
        )
    raise UnhashableAttrError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__} with no stable"
        " encoding (use a dataclass, pydantic model, enum, path or plain container)"
    )


def canonical_json(value: Any, where: str = "hash_attrs") -> str:
    """Strict canonical JSON: sorted keys, no whitespace, no NaN."""
    return _dumps(canonical(value, where))


def identity_hash(name: str, attrs: Mapping[str, Any], dep_names_with_hash: Sequence[str]) -> str:
    """The first 8 hex chars of sha256 over the canonical JSON of name, attrs and deps."""
    payload = {"name": name, "attrs": canonical(attrs), "deps": sorted(dep_names_with_hash)}
    return hashlib.sha256(_dumps(payload).encode()).hexdigest()[:HASH_LENGTH]


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def is_pydantic_model(value: Any) -> bool:
    """A pydantic model instance (not the class), recognised without importing pydantic."""
    return hasattr(type(value), "model_fields") and hasattr(value, "model_dump") and not isinstance(value, type)


def _describe(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{getattr(value, '__module__', '?')}.{name}"
