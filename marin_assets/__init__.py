"""marin-assets: content-addressed pipeline steps served as Dagster assets.

The public API a user writes experiments with.
"""

from marin_assets.core.adapter import (
    FORCE_TAG,
    build_assets,
    build_definitions,
    step_asset,
)
from marin_assets.core.execute import materialize_step
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.record import load_result, read_record
from marin_assets.core.step import Resources, Step, StepDefinitionError

__all__ = [
    "FORCE_TAG",
    "LeaseSettings",
    "Resources",
    "Step",
    "StepDefinitionError",
    "build_assets",
    "build_definitions",
    "load_result",
    "materialize_step",
    "read_record",
    "step_asset",
]
