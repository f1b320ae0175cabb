"""marin-assets: content-addressed pipeline steps served as Dagster assets.

The public API a user writes experiments with: the protocol here, the step factories and specs in
`marin_assets.steps` (the front door). The protocol names (`Step`, `load_result`, `materialize_step`, …)
import nothing heavy; `Experiment` (what an experiment module serves) and the Dagster ones
(`build_definitions`, `experiment_definitions`, …) are imported on first use, so `import marin_assets`
works where Dagster is not installed — on a Ray worker, say.
"""

from typing import TYPE_CHECKING, Any

from marin_assets.core.lease import LeaseSettings
from marin_assets.core.light import light
from marin_assets.core.materialize import materialize_step
from marin_assets.core.record import load_result, read_record
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by

_DAGSTER_NAMES = {"FORCE_TAG", "automate", "automation_sensor", "build_assets", "build_definitions",
                  "experiment_definitions", "step_asset"}

if TYPE_CHECKING:
    from marin_assets.dagster import (
        FORCE_TAG,
        automate,
        automation_sensor,
        build_assets,
        build_definitions,
        experiment_definitions,
        step_asset,
    )
    from marin_assets.pipeline.experiment import Experiment


def __getattr__(name: str) -> Any:
    if name in _DAGSTER_NAMES:
        import marin_assets.dagster as serving

        return getattr(serving, name)
    if name == "Experiment":  # on first use: the pipeline imports the protocol, which imports this package
        from marin_assets.pipeline.experiment import Experiment

        return Experiment
    raise AttributeError(f"module 'marin_assets' has no attribute {name!r}")


__all__ = [
    "FORCE_TAG",
    "Experiment",
    "LeaseSettings",
    "Resources",
    "Step",
    "StepDefinitionError",
    "automate",
    "automation_sensor",
    "build_assets",
    "build_definitions",
    "experiment_definitions",
    "light",
    "load_result",
    "made_by",
    "materialize_step",
    "read_record",
    "step_asset",
]
