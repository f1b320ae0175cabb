"""What one experiment module serves: its steps, its per-checkpoint evaluations, and how it is kept fresh.

Each module of `marin_assets.experiments` exports one `Experiment`; the project's definitions merge them
(`marin_assets.dagster.experiment_definitions`): the assets, the per-checkpoint partitioned assets and their
sensor, the automation of the steps that materialize themselves, the source sensor, and the refresh
schedule over the experiments that ask for it. Plain data: experiments never import Dagster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marin_assets.core.step import Step
from marin_assets.pipeline.evals.steps import CheckpointEvals


@dataclass(frozen=True)
class Experiment:
    """One experiment's part of the project's definitions."""

    name: str
    """Which experiment (`python-docs`), for messages."""
    steps: Sequence[Step]
    """The steps to serve; what they read is served with them."""
    per_checkpoint: Sequence[CheckpointEvals] = ()
    """Evaluation families run on every checkpoint as it lands (one partitioned asset each)."""
    automated: Sequence[Step] = ()
    """Steps (and what they read) that materialize themselves when missing or when their identity changes."""
    scheduled: bool = True
    """Whether the refresh schedule brings this experiment's unsynced assets up to date."""
