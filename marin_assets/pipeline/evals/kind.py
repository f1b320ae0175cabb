"""The evaluation-kind seam: what an evaluation computes on one checkpoint, written once.

A kind (`loss.LossEval`: loss and bits per byte on validation caches; `harness.HarnessEval`: lm-eval
tasks) says what it needs, how it enters identity and how to show its numbers. The generic steps in
`evals/steps.py` turn any kind into a final-checkpoint step (`eval_step`) and a per-checkpoint family
(`CheckpointEvals`, one partition per checkpoint, added by the checkpoint sensor as each lands); reports
find every evaluation by its type (`steps.EvalStep`), whatever its kind. A new kind (per-token log-probs,
a perplexity gap) is one class beside these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from marin_assets.core.checks import Check
from marin_assets.core.step import Step
from marin_assets.pipeline.training.specs import ModelSpec


@dataclass(frozen=True)
class Checkpoint:
    """The weights one evaluation reads, and what reading them needs."""

    path: str
    """A Levanter checkpoint (`…/step-N`) or a Hugging Face model folder."""
    model: ModelSpec
    tokenizer_path: str
    vocab_size: int | None
    """Rows of the model's embedding (None: as a fresh training run sizes it)."""
    platform: str | None = None
    """The JAX platform to evaluate on (`cuda`, `tpu`; None: JAX's choice)."""


class EvalKind(Protocol):
    """What an evaluation computes on one checkpoint; the same kind serves a final step and partitions."""

    def identity(self) -> dict[str, Any]:
        """What enters the identity of every evaluation of this kind (besides the run and the checkpoint)."""
        ...

    @property
    def deps(self) -> Sequence[Step]:
        """Steps the evaluation reads besides the training run (validation caches; none for task files)."""
        ...

    @property
    def tags(self) -> Sequence[str]:
        """The asset's kind tags besides `eval` (`levanter`, `jax`, `lm-eval`)."""
        ...

    @property
    def function(self) -> Callable[..., Any]:
        """The library function that computes it (its docstring describes the asset)."""
        ...

    @property
    def spans_hosts(self) -> bool:
        """It can run on several hosts as one JAX program (`eval_step(hosts=N)`): its function joins them and only
        host 0 writes. A kind whose function does not is refused more than one host when its step is defined."""
        ...

    def summary(self) -> str:
        """What it computes, in a few words (`loss and bits per byte on docs`), for descriptions."""
        ...

    def evaluate(self, output_path: str, checkpoint: Checkpoint) -> Any:
        """Evaluate `checkpoint`, writing under `output_path`; the typed result (run time)."""
        ...

    def checks(self) -> list[Check]:
        """Checks on every evaluation's result."""
        ...

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """A partition's numbers, plotted by Dagster across partitions."""
        ...

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """A checkpoint's row of the all-checkpoints table (after `step`)."""
        ...

    def columns(self) -> list[str]:
        """The all-checkpoints table's columns (after `step`)."""
        ...

    def summary_columns(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """What an experiment summary shows of one evaluation, beside its run's row."""
        ...
