"""A training run as the rest of the library sees it: the step (what reading its checkpoints needs, known
at definition time) and its record (what it made). Evaluations and reports find training runs by
these types, whatever method trained them.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.record_types import record_type
from marin_assets.core.renames import REMOVED_IN
from marin_assets.core.step import Step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache
from marin_assets.pipeline.training.checkpoints import run_dir_of
from marin_assets.pipeline.training.cost import RunCost
from marin_assets.pipeline.training.dpo.metrics import DpoMetrics
from marin_assets.pipeline.training.rl.metrics import RlMetrics
from marin_assets.pipeline.training.specs import (
    ModelSpec,
)
from marin_assets.pipeline.training.tracking import TrackingResult


class WeightsSource(Protocol):
    """Where a run's first weights come from, as the run's step needs it (`sources.InitFrom` is one)."""

    def describe(self) -> str:
        """The source in words, for messages."""
        ...

    def vocab_size(self) -> int:
        """Rows of the source's embedding (run time: reads the source's record or folder)."""
        ...


@record_type("train_result", old_names=("marin_assets.pipeline.training.run:TrainResult",))
@dataclass(frozen=True)
class TrainResult:
    """What a training run made: its checkpoints, losses, throughput, and what reads them needs."""

    run_id: str
    steps: int
    final_train_loss: float | None
    final_eval_loss: float | None
    eval_losses: dict[str, float]
    """Final eval loss per validation set."""
    tokens_per_second: float | None
    checkpoint_steps: list[int]
    checkpoint_dir: str
    hf_dir: str | None
    parameter_count: int | None = None
    train_seconds: float = 0.0
    loss_curve: list[list[float]] = field(default_factory=list)
    """[step, train loss] pairs."""
    eval_curve: list[list[float]] = field(default_factory=list)
    """[step, eval loss] pairs."""
    model: ModelSpec | None = None
    """The model trained: what export and evaluation load the checkpoints as (None in records
    made before it was recorded)."""
    tokenizer: str | None = None
    """The tokenizer folder the training data was tokenized with."""
    vocab_size: int | None = None
    """Rows of the model's embedding (None in records made before it was recorded: the tokenizer's size)."""
    train_tokens: int | None = None
    """Tokens the run trains on: steps × train_batch_size × seq_len."""
    initialized_from: str | None = None
    """The Hugging Face folder or Levanter checkpoint the first weights came from; None: random."""
    final_eval_bpb: float | None = None
    """Bits per byte over the validation sets at the last evaluation, as Levanter logged it."""
    cost: RunCost | None = None
    """Parameters, FLOPs, tokens/s, MFU and device-hours (None in records made before it was recorded)."""
    tracking: TrackingResult | None = None
    """Where W&B and TensorBoard logged the run (None: only the JSON metrics file)."""
    hosts: int = 1
    """Hosts (JAX processes) the run trained on, joined as one program."""
    device_mesh: dict[str, int] | None = None
    """How its devices were split, Levanter's mesh axes → sizes (`data`: FSDP, `replica`: pure data parallel,
    `model`: tensor parallel); None in records made before it was recorded."""
    method: str | None = None
    """The training method that made it (`train_lm`, `sft`, `dpo`, `rl`; None in records made before it was
    recorded)."""
    method_metrics: DpoMetrics | RlMetrics | None = None
    """What the method measures beyond the runner's losses, filled by the method that made the run: DPO's preference
    accuracy, rewards and margins on training batches and held-out pairs; RL's reward, held-out pass rate, KL,
    completion lengths and completions with their rewards. None for methods that measure nothing more (`train_lm`,
    `sft`). A new method's metrics type joins the union; nothing else here changes."""

    __renamed_fields__: ClassVar[dict[str, str]] = {"dpo": "method_metrics", "rl": "method_metrics"}
    """Records before 0.2.0 kept each method's metrics in a field of its own."""

    @property
    def dpo(self) -> DpoMetrics | None:
        """Deprecated (0.2.0; gone in 0.3.0): `method_metrics` of a DPO run."""
        _warn_renamed("dpo")
        return self.method_metrics if isinstance(self.method_metrics, DpoMetrics) else None

    @property
    def rl(self) -> RlMetrics | None:
        """Deprecated (0.2.0; gone in 0.3.0): `method_metrics` of an RL run."""
        _warn_renamed("rl")
        return self.method_metrics if isinstance(self.method_metrics, RlMetrics) else None

    def model_and_tokenizer(self) -> tuple[ModelSpec, str]:
        """The model spec and tokenizer folder, or an error saying the record predates them."""
        if self.model is None or self.tokenizer is None:
            raise ValueError(f"the training record of {self.run_id} has no model/tokenizer (made by an older"
                             " marin-assets); re-materialize the training step with force to record them")
        return self.model, self.tokenizer

    def checkpoint_path(self, step: int | None = None) -> str:
        """The checkpoint of `step` (default: the last)."""
        chosen = self.checkpoint_steps[-1] if step is None else step
        if chosen not in self.checkpoint_steps:
            raise ValueError(f"no checkpoint at step {chosen}; have {self.checkpoint_steps}")
        return os.path.join(self.checkpoint_dir, f"step-{chosen}")


def _warn_renamed(field_name: str) -> None:
    warnings.warn(f"TrainResult.{field_name} is now TrainResult.method_metrics; the old name goes in marin-assets"
                  f" {REMOVED_IN}", DeprecationWarning, stacklevel=3)


def loss_fell(output_path: str, result: dict) -> CheckOutcome:
    """Every logged training loss is finite and the last is below the first."""
    curve = result.get("loss_curve") or []
    losses = [loss for _, loss in curve]
    if len(losses) < 2:
        return CheckOutcome(False, f"only {len(losses)} training loss value(s) logged")
    bad = [step for step, loss in curve if not math.isfinite(loss)]
    if bad:
        return CheckOutcome(False, f"non-finite loss at steps {bad[:10]}", {"non_finite": len(bad)})
    fell = losses[-1] < losses[0]
    return CheckOutcome(fell, f"loss {losses[0]:.4g} → {losses[-1]:.4g}" + ("" if fell else " (did not fall)"),
                        {"first_loss": losses[0], "last_loss": losses[-1]})


LOSS_FELL = Check("loss_finite_and_fell", loss_fell, "Training loss is finite at every logged step and fell.")


@dataclass(frozen=True, eq=False)
class TrainStep(Step):
    """A training step that says, at definition time, what reading its checkpoints needs — so
    per-checkpoint evaluation can start while training runs, before its record exists."""

    model: ModelSpec = field(kw_only=True)
    """The model being trained."""
    data: tuple[Step, ...] = field(default=(), kw_only=True)
    """The caches it trains and validates on (one tokenizer for all)."""
    init_from: WeightsSource | None = field(default=None, kw_only=True)
    """Where its first weights come from; None: random."""

    def tokenizer_path(self) -> str:
        """The tokenizer folder of its caches (read from the first cache's record; they share one)."""
        return load_result(self.data[0], TokenizedCache).tokenizer

    def vocab_size(self) -> int:
        """Rows of its model's embedding: the source's when it starts from other weights, else the tokenizer's
        largest id + 1 rounded up to `model.vocab_multiple` (run time: reads records)."""
        from marin_assets.pipeline.tokens.tokenizer import model_vocab_size

        if self.init_from is not None:
            return self.init_from.vocab_size()
        return model_vocab_size(self.tokenizer_path(), self.model.vocab_multiple)

    def checkpoint_path(self, step: int) -> str:
        """The folder of checkpoint `step` under the current prefix."""
        return join_path(run_dir_of(self.output_path), f"step-{step}")
