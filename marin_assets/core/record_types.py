"""Record type names: a result type declares the stable name its records know it by.

A record (`.artifact.json`) names its result's type so that `load_result(step)` can rebuild it without
being told the type. Naming it by `module:qualname` tied every record to a file path: moving a module broke
the records already written (hence `marin_assets.pipeline.MOVED_TYPES`). Instead, as Dagster's serdes does
(`storage_name`, `old_storage_names`), a result type declares a name that outlives moves and renames:

    @record_type("train_result")
    @dataclass(frozen=True)
    class TrainResult: ...

New records store that name; a type that declares none is still recorded by `module:qualname`.
`old_names` keeps records written under earlier names loading: a former storage name, or a
`module:qualname` path the type was recorded under before it moved.

Finding a type whose module has not been imported yet: registration happens when the declaring module is
imported, so on a miss the registry imports `REGISTERING_MODULES` — the front door, `marin_assets.steps`, which
imports every step factory and so every type a shipped step returns — and looks again. One table of names
would have to repeat each type's module (and be kept right on every move); importing what defines the steps
keeps the declaration beside the class, the only place a move carries along. This module imports nothing of
the pipeline statically (the protocol layer sits below it); the import is by name, once, only on a miss.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import TypeVar

C = TypeVar("C", bound=type)

REGISTERING_MODULES = ("marin_assets.steps",)
"""Imported on a lookup miss: between them they declare every result type a shipped step returns."""

_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
"""A storage name: short snake_case, never containing ':', so it can never be mistaken for a module path."""
_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""A `module:qualname` path, allowed only as an old name."""

_types: dict[str, type] = {}
"""Every declared name, current and old → the type."""
_names: dict[type, str] = {}
"""Type → its current storage name."""
_imported = False


class RecordTypeError(LookupError):
    """A record type name that is badly formed, taken by another type, or known to no type."""


def record_type(name: str, *, old_names: tuple[str, ...] = ()) -> Callable[[C], C]:
    """Declare `name` as the stable name records give the decorated result type; `old_names` still load as it.

    Put it above `@dataclass` (a slotted dataclass is a new class). A name another class holds is an error
    naming both: two types under one name would load each other's records.
    """
    if not _NAME.fullmatch(name):
        raise RecordTypeError(f"record type name {name!r} is not short snake_case (as `train_result`)")
    for old in old_names:
        if not (_NAME.fullmatch(old) or _PATH.fullmatch(old)):
            raise RecordTypeError(f"old record type name {old!r} is neither snake_case nor `module:qualname`")

    def register(cls: C) -> C:
        current = _names.get(cls)
        if current is not None and current != name:
            raise RecordTypeError(f"{_label(cls)} is already recorded as {current!r}; it cannot also be {name!r}")
        for taken in (name, *old_names):
            holder = _types.get(taken)
            if holder is not None and holder is not cls and not _same_definition(holder, cls):
                raise RecordTypeError(f"record type name {taken!r} is declared by both {_label(holder)} and"
                                      f" {_label(cls)}; give one of them another name")
        for taken in (name, *old_names):
            _types[taken] = cls
        _names[cls] = name
        return cls

    return register


def storage_name(tp: type) -> str | None:
    """The name records give `tp`, or None when it declares none (its record names `module:qualname`).

    The type itself must be registered: a subclass of a registered type is another type and declares its own.
    """
    return _names.get(tp)


def declared_type(name: str) -> type | None:
    """The type declared under `name` (current or old) among those imported so far; None if none is (no import)."""
    return _types.get(name)


def registered_type(name: str) -> type:
    """The type declared under `name` (current or old), importing `REGISTERING_MODULES` once on a miss."""
    global _imported
    found = _types.get(name)
    if found is None and not _imported:
        for module in REGISTERING_MODULES:
            importlib.import_module(module)
        _imported = True
        found = _types.get(name)
    if found is None:
        raise RecordTypeError(f"no result type is declared as {name!r} (looked after importing"
                              f" {', '.join(REGISTERING_MODULES)}); import the module that declares it with"
                              " `@record_type`")
    return found


def registered_names() -> dict[str, type]:
    """Every declared current name → its type (old names left out), as registered so far."""
    return {name: tp for tp, name in _names.items()}


def _same_definition(a: type, b: type) -> bool:
    """One class defined again (its module imported twice, or reloaded): it keeps its name."""
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _label(tp: type) -> str:
    return f"{tp.__module__}:{tp.__qualname__}"
