"""Dagster's names for a step: asset key, op name, input name, group — and their collisions.

Dagster turns an asset key into an op name by joining its path with `__` and replacing `-`
and `.` with `_`, and names a dependency's input by joining with `_`. Two step names that
differ only there (`a-b` and `a_b`, `a/b_c` and `a_b/c`) would become one op or one input:
a code location that fails to load naming neither, or a dependency silently dropped. They
are refused when the definitions are built, naming both steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import dagster as dg

from marin_assets.core.step import Step, StepDefinitionError


def asset_key(name: str) -> dg.AssetKey:
    """`raw/tinystories` → `AssetKey(["raw", "tinystories"])`."""
    return dg.AssetKey(name.split("/"))


def op_name(key: dg.AssetKey) -> str:
    """The op that materializes the asset (Dagster's own naming)."""
    return key.to_python_identifier()


def input_name(name: str) -> str:
    """The op input standing for a dependency on step `name` (Dagster's own naming for `deps`)."""
    return re.sub(r"[-.]", "_", "_".join(name.split("/")))


def group_name(name: str) -> str:
    """The stage: the name's first segment (`raw/x` → `raw`); single-segment names → `default`."""
    if "/" not in name:
        return "default"
    return re.sub(r"[^A-Za-z0-9_]", "_", name.split("/", 1)[0])


def check_unique_names(steps: Iterable[Step], other_names: Iterable[str] = ()) -> None:
    """`StepDefinitionError` if two of these names would be one op or one input name to Dagster."""
    ops: dict[str, str] = {}
    inputs: dict[str, str] = {}
    for name in [*(s.name for s in steps), *other_names]:
        for kind, seen, derived in (("op", ops, op_name(asset_key(name))), ("input", inputs, input_name(name))):
            first = seen.setdefault(derived, name)
            if first != name:
                raise StepDefinitionError(
                    f"steps {first!r} and {name!r} would both be the Dagster {kind} name {derived!r}: names that"
                    " differ only in '-', '_', '.' or where '/' falls are one name to Dagster; rename one of them")
