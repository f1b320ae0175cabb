"""marin-assets: content-addressed pipeline steps served as Dagster assets.

The public API a user writes experiments with. The protocol names (`Step`, `load_result`,
`materialize_step`, …) import nothing heavy; the Dagster ones (`build_definitions`, …) are
imported on first use, so `import marin_assets` works where Dagster is not installed — on a
Ray worker, say.
"""

from typing import TYPE_CHECKING, Any

from marin_assets.core.lease import LeaseSettings
from marin_assets.core.materialize import materialize_step
from marin_assets.core.record import load_result, read_record
from marin_assets.core.step import Resources, Step, StepDefinitionError

_DAGSTER_NAMES = {"FORCE_TAG", "build_assets", "build_definitions", "step_asset"}

if TYPE_CHECKING:
    from marin_assets.dagster import FORCE_TAG, build_assets, build_definitions, step_asset


def __getattr__(name: str) -> Any:
    if name in _DAGSTER_NAMES:
        import marin_assets.dagster as serving

        return getattr(serving, name)
    raise AttributeError(f"module 'marin_assets' has no attribute {name!r}")


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
