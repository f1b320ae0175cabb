"""Drift: how a step differs from what the Dagster instance last materialized for its asset.

The same field-level diff as `marin-assets plan`, read once for all assets when the
definitions load, so an asset whose identity hash changed says which hash_attrs (or
dependencies) did in its description and definition metadata — where the UI shows it as
unsynced.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from marin_assets.core.plan import PreviousMaterialization, attrs_diff
from marin_assets.core.step import Step


@dataclass(frozen=True)
class Drift:
    old_hash: str
    new_hash: str
    changes: list[dict[str, Any]]
    """`{"field", "old", "new"}` per changed hash_attr (dotted path) or `deps[name]`."""

    def markdown(self) -> str:
        fields = "; ".join(f"`{c['field']}`: {c['old']!r} → {c['new']!r}" for c in self.changes) or "unknown fields"
        return (f"**Changed since the last materialization** (hash `{self.old_hash}` → `{self.new_hash}`):"
                f" {fields}.")

    def to_json(self) -> dict[str, Any]:
        return {"old_hash": self.old_hash, "new_hash": self.new_hash, "changes": self.changes}


def previous_materializations(names: Iterable[str], instance: dg.DagsterInstance | None = None
                              ) -> dict[str, PreviousMaterialization]:
    """What the instance (default: the one at $DAGSTER_HOME, if set) last recorded per asset."""
    if instance is None:
        if not os.environ.get("DAGSTER_HOME"):
            return {}
        with dg.DagsterInstance.get() as own:  # disposed after the one query
            return previous_materializations(names, own)
    keys = {dg.AssetKey(name.split("/")): name for name in names}
    out = {}
    for key, event in instance.get_latest_materialization_events(list(keys)).items():
        if event is None or event.asset_materialization is None:
            continue
        md: dict[str, Any] = {k: v.value for k, v in event.asset_materialization.metadata.items()}
        out[keys[key]] = PreviousMaterialization(hash=md.get("hash"), output_path=md.get("output_path"),
                                                 hash_attrs=md.get("hash_attrs"), deps=md.get("deps"))
    return out


def drifts_from_instance(steps: Iterable[Step], instance: dg.DagsterInstance | None = None) -> dict[str, Drift]:
    """Step name → drift, for steps whose last materialization had another hash."""
    steps = list(steps)
    try:
        previous = previous_materializations([s.name for s in steps], instance)
    except Exception:  # no reachable instance: the definitions still load, without drift
        return {}
    out = {}
    for step in steps:
        prev = previous.get(step.name)
        if prev is not None and prev.hash and prev.hash != step.hash:
            out[step.name] = Drift(prev.hash, step.hash, attrs_diff(step, prev))
    return out
