"""The Dagster serving layer: steps as software-defined assets, with their metadata, checks,
drift, sensors, schedules and automation conditions.

The public surface is what an experiment's `definitions.py` needs; everything else in this
package is how it is done. It uses the protocol (`marin_assets.core`) and the execution
layer; neither knows it.
"""

from marin_assets.dagster.assets import FORCE_TAG, Partitioned, build_assets, step_asset
from marin_assets.dagster.checkpoint_evals import checkpoint_evals_asset, checkpoint_sensor
from marin_assets.dagster.conditions import automate, automation_sensor, identity_changed
from marin_assets.dagster.definitions import build_definitions, steps_of
from marin_assets.dagster.experiments import experiment_definitions
from marin_assets.dagster.schedules import unsynced_keys, unsynced_schedule
from marin_assets.dagster.source_sensor import source_sensor, watched_sources

__all__ = [
    "FORCE_TAG", "Partitioned", "automate", "automation_sensor", "build_assets", "build_definitions",
    "checkpoint_evals_asset", "checkpoint_sensor", "experiment_definitions", "identity_changed", "source_sensor",
    "step_asset", "steps_of", "unsynced_keys", "unsynced_schedule", "watched_sources",
]
