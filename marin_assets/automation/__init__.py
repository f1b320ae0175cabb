"""Automation: sensors, schedules and automation conditions over step assets."""

from marin_assets.automation.checkpoints import CheckpointEvals, checkpoint_evals_asset, checkpoint_sensor
from marin_assets.automation.conditions import automate, automation_sensor, identity_changed
from marin_assets.automation.schedules import unsynced_keys, unsynced_schedule
from marin_assets.automation.sources import source_sensor, watched_sources

__all__ = [
    "CheckpointEvals", "automate", "automation_sensor", "checkpoint_evals_asset", "checkpoint_sensor",
    "identity_changed", "source_sensor", "unsynced_keys", "unsynced_schedule", "watched_sources",
]
