"""The project's `Definitions` from its experiments (`pipeline.experiment.Experiment`): every module's steps,
per-checkpoint evaluations, automation and schedule, merged — nothing concatenated or listed by hand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from marin_assets.core.step import walk
from marin_assets.dagster.checkpoint_evals import checkpoint_evals_asset, checkpoint_sensor
from marin_assets.dagster.conditions import automate, automation_sensor
from marin_assets.dagster.definitions import build_definitions
from marin_assets.dagster.naming import asset_key
from marin_assets.dagster.schedules import unsynced_schedule
from marin_assets.dagster.source_sensor import source_sensor, watched_sources
from marin_assets.pipeline.experiment import Experiment


def scheduled_selection(experiments: Sequence[Experiment]) -> dg.AssetSelection:
    """The assets the refresh schedule keeps up to date: the scheduled experiments' steps, what they read, and
    their per-checkpoint families."""
    chosen = [e for e in experiments if e.scheduled]
    names = {s.name for s in walk([s for e in chosen for s in e.steps])}
    names |= {f.name for e in chosen for f in e.per_checkpoint}
    return dg.AssetSelection.assets(*(asset_key(n) for n in sorted(names)))


def experiment_definitions(experiments: Sequence[Experiment], resources: Mapping[str, Any] | None = None, *,
                           refresh_cron: str = "0 3 * * *", describe_drift: bool = False) -> dg.Definitions:
    """`Definitions` serving `experiments`: one asset per step, one partitioned asset per per-checkpoint family
    (one checkpoint sensor for all), automation for the steps that ask for it (and its sensor), the source
    sensor when a source can change, and the refresh schedule over the scheduled experiments."""
    steps = [s for e in experiments for s in e.steps]
    families = [f for e in experiments for f in e.per_checkpoint]
    automated = [s for e in experiments for s in e.automated]
    sensors: list[dg.SensorDefinition] = []
    if families:
        sensors.append(checkpoint_sensor(families))
    if automated:
        sensors.append(automation_sensor(automated))
    if watched_sources(steps):
        sensors.append(source_sensor(steps))
    schedules = [unsynced_schedule(scheduled_selection(experiments), refresh_cron)] if any(
        e.scheduled for e in experiments) else []
    return build_definitions(steps, resources, describe_drift=describe_drift,
                             automation=automate(automated) if automated else None,
                             extra_assets=[checkpoint_evals_asset(f) for f in families],
                             sensors=sensors, schedules=schedules)
