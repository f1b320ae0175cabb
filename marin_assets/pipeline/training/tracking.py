"""Where a training run's metrics go besides its JSON metrics file: Weights & Biases and TensorBoard.

Tracking is how a run is watched, not what it makes: it is never part of a step's identity, so turning
W&B on (or changing its project or tags) reuses the same checkpoints. The JSON metrics file stays the
source of the record's curves and the UI's plots. W&B reads its own settings (`WANDB_MODE`, `WANDB_API_KEY`)
from the environment; the key is never written into a record, metadata or log by us.
"""

from __future__ import annotations

from dataclasses import dataclass

WANDB_DIR = "wandb"
"""Folder W&B makes under a run's output for its local run files (`offline-run-…`: the whole run, offline)."""
TENSORBOARD_DIR = "tensorboard"
"""Folder under a run's output that holds TensorBoard event files."""


@dataclass(frozen=True)
class Tracking:
    """Which trackers a training run logs to, beside its JSON metrics: W&B when `wandb_project` is set
    (entity and tags as given; online or offline as `WANDB_MODE` says), TensorBoard when `tensorboard`."""

    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_tags: tuple[str, ...] = ()
    tensorboard: bool = False

    @property
    def wandb(self) -> bool:
        """Whether the run logs to W&B."""
        return self.wandb_project is not None


@dataclass(frozen=True)
class TrackingResult:
    """Where a run's tracked metrics went: the W&B run's URL (online) or its offline run folder, and the
    TensorBoard log folder; None for a tracker the run did not use."""

    wandb_url: str | None = None
    wandb_dir: str | None = None
    tensorboard_dir: str | None = None
