"""Automation conditions: assets that materialize themselves when their identity changes.

An experiment opts in with `automate(steps)` (passed to `build_definitions(automation=...)`)
and `automation_sensor(steps)`, the Dagster sensor that evaluates the conditions. The
condition is Dagster's `eager()` plus `code_version_changed()`: the code version of a step
asset is its identity hash, so a changed hash_attr, dependency or name (which gives the
asset a new output path) is a reason to materialize.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from marin_assets.core.step import Step, walk
from marin_assets.dagster.naming import asset_key

AC = dg.AutomationCondition


def identity_changed() -> dg.AutomationCondition:
    """Materialize when the identity hash changed, when newly missing, or when a dependency's data
    version changed — never while a run of it or of a dependency is in progress, nor with a
    dependency missing.

    A dependency re-materialized as a cache hit keeps its data version, so it does not set off
    its children (Dagster's `any_deps_updated` would).
    """
    return (
        (AC.code_version_changed() | AC.newly_missing() | AC.any_deps_match(AC.data_version_changed()))
        .since_last_handled()  # type: ignore[misc]  # Dagster's generics: AssetKey vs AssetKey | AssetCheckKey
        & ~AC.any_deps_missing()
        & ~AC.any_deps_in_progress()
        & ~AC.in_progress()
    ).with_label("identity changed, newly missing, or a dependency's data changed")


def automate(steps: Sequence[Step],
             condition: dg.AutomationCondition | None = None) -> dict[Step, dg.AutomationCondition]:
    """`steps` and what they depend on → their condition, for `build_definitions(automation=...)`."""
    condition = condition or identity_changed()
    return {step: condition for step in walk(steps)}


def automation_sensor(
    steps: Sequence[Step],
    *,
    name: str = "marin_automation",
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.AutomationConditionSensorDefinition:
    """The sensor evaluating the conditions of `steps`' assets (off until switched on)."""
    return dg.AutomationConditionSensorDefinition(
        name,
        target=dg.AssetSelection.assets(*[asset_key(s.name) for s in walk(steps)]),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Materializes these assets when their identity hash changes or a dependency's data changes.",
    )
