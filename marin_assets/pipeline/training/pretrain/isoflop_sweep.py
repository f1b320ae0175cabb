"""An IsoFLOP sweep: the candidates of an IsoFLOP ladder (`isoflop.py`) as training steps, one per candidate, all
reading the same tokenized caches — every run a normal `train_step` (cached, resumable, costed, evaluable).

Each run trains its candidate's model for its steps at its batch and learning rate; everything else is the
sweep's recipe, the same for every run: the optimizer's schedule and weight decay, the seed, the precision,
and an evaluation only at the end, on the *whole* validation split (`max_eval_batches=None` by default:
runs of one ladder have different batch sizes, and a cap in batches would score them on different text).
The candidates a budget rejects are kept on the sweep (`ladder.rejected`, with the reason), for the analysis
to record. Building a sweep imports no Levanter: the ladder's FLOPs and parameters are counted in plain Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.training.pretrain.isoflop import (
    IsoFlopCandidate,
    IsoFlopError,
    IsoFlopLadder,
    IsoFlopScale,
    budget_label,
    isoflop_ladder,
)
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import OptimizerSpec, SpecError, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainStep


@dataclass(frozen=True)
class IsoFlopRecipe:
    """What every run of a sweep shares: all but the model, the steps, the batch and the learning rate, which
    come from its candidate."""

    optimizer: OptimizerSpec = OptimizerSpec()
    """Schedule, warmup and weight decay; its `learning_rate` is replaced by each candidate's."""
    seed: int = 0
    max_eval_batches: int | None = None
    """None: every run is evaluated on the whole validation split (see the module docstring)."""
    mixed_precision: str = "f32"

    def trainer_for(self, run: IsoFlopCandidate) -> TrainerSpec:
        """The run's trainer: its steps and batch, one checkpoint and one evaluation, both at the end. Levanter
        runs every hook once more when training ends, so an evaluation period of the run's length would evaluate
        the last step twice: the period is one step longer, and only the final evaluation runs."""
        return TrainerSpec(num_train_steps=run.num_train_steps, train_batch_size=run.batch_size, seed=self.seed,
                           checkpoint_every=run.num_train_steps, steps_per_eval=run.num_train_steps + 1,
                           max_eval_batches=self.max_eval_batches, mixed_precision=self.mixed_precision)

    def optimizer_for(self, run: IsoFlopCandidate) -> OptimizerSpec:
        return dataclasses.replace(self.optimizer, learning_rate=run.learning_rate)


@dataclass(frozen=True, eq=False)
class IsoFlopSweep:
    """The training steps of an IsoFLOP ladder, the caches they share, and how each was made from its candidate."""

    prefix: str
    """Runs are `checkpoints/{prefix}-isoflop-{budget}-d{hidden}`."""
    ladder: IsoFlopLadder
    """Budgets, candidates kept and rejected (with reasons), the scale and the vocabulary they were computed for."""
    runs: tuple[Step, ...]
    """One training step per `ladder.candidates`, in that order (smallest budget first, then smallest model)."""
    train: Mapping[str, Step]
    """The components every run trains on."""
    validation: Mapping[str, Step] = field(default_factory=dict)
    """Validation-only components every run is evaluated on (beside the train components' validation splits)."""
    recipe: IsoFlopRecipe = IsoFlopRecipe()
    train_options: Mapping[str, Any] = field(default_factory=dict)
    """More `train_step` arguments of every run (`gpu`, `tracking`, …)."""

    def __post_init__(self) -> None:
        if len(self.runs) != len(self.ladder.candidates):
            raise StepDefinitionError(f"IsoFLOP sweep {self.prefix!r}: {len(self.runs)} runs for"
                                      f" {len(self.ladder.candidates)} candidates")

    @property
    def budgets(self) -> tuple[float, ...]:
        return self.ladder.budgets

    def candidate_of(self, run: Step) -> IsoFlopCandidate:
        """The candidate a run of this sweep trains."""
        for step, candidate in zip(self.runs, self.ladder.candidates, strict=True):
            if step == run:
                return candidate
        raise KeyError(f"{run.name!r} is not a run of IsoFLOP sweep {self.prefix!r}")

    def by_budget(self) -> dict[float, list[Step]]:
        """Budget → its runs, smallest budget first."""
        grouped: dict[float, list[Step]] = {b: [] for b in self.budgets}
        for step, candidate in zip(self.runs, self.ladder.candidates, strict=True):
            grouped[candidate.budget].append(step)
        return grouped

    def definition(self) -> dict[str, Any]:
        """What determines the sweep's runs beyond their caches (the analysis and optimal run's identity)."""
        return {"budgets": list(self.budgets), "vocab_size": self.ladder.vocab_size, "scale": self.ladder.scale,
                "recipe": self.recipe}

    def run_step(self, name: str, run: IsoFlopCandidate, train: Mapping[str, Step] | None = None,
                 validation: Mapping[str, Step] | None = None) -> TrainStep:
        """The training step of a candidate under this sweep's recipe (a run planned later at another budget);
        `train` / `validation` default to the sweep's caches."""
        return candidate_step(name, run, self.train if train is None else train,
                              self.validation if validation is None else validation, self.recipe,
                              **self.train_options)


def candidate_step(name: str, run: IsoFlopCandidate, train: Mapping[str, Step], validation: Mapping[str, Step],
                   recipe: IsoFlopRecipe, **train_options: Any) -> TrainStep:
    """The `train_step` of one candidate: its model, steps, batch and learning rate, the rest from `recipe`."""
    return train_step(name, dict(train), run.model, recipe.optimizer_for(run), recipe.trainer_for(run),
                      validation=dict(validation) or None, **train_options)


def run_name(prefix: str, run: IsoFlopCandidate) -> str:
    """`checkpoints/{prefix}-isoflop-{budget}-d{hidden}`: a width is tried once per budget, so names are unique."""
    return f"checkpoints/{prefix}-isoflop-{budget_label(run.budget)}-d{run.model.hidden_dim}"


def isoflop_sweep(prefix: str, budgets: Sequence[float], train: Mapping[str, Step], vocab_size: int,
                  scale: IsoFlopScale | None = None, *, validation: Mapping[str, Step] | None = None,
                  recipe: IsoFlopRecipe = IsoFlopRecipe(), **train_options: Any) -> IsoFlopSweep:
    """One `train_step` per candidate the ladder of `budgets` keeps at `scale`, all on the caches `train` (and
    `validation`), named `checkpoints/{prefix}-isoflop-{budget}-d{hidden}`.

    `scale`: the ladder's widths, context, batch and learning-rate rules (default `IsoFlopScale()`, a CPU scale);
    `vocab_size`: the models' vocabulary — the tokenizer's largest id + 1 rounded up to `ModelSpec.vocab_multiple`
    (128), what the runner counts FLOPs with; a ladder computed for another one misses its budgets, which the
    analysis refuses. `train_options` go to every `train_step` (`gpu`, `tracking`; not `budget`, `weights` or
    `init_from`: an IsoFLOP run trains a fresh model on its own token count).
    """
    refused = sorted(set(train_options) & {"budget", "weights", "init_from", "model", "optimizer", "trainer"})
    if refused:
        raise StepDefinitionError(f"IsoFLOP sweep {prefix!r}: {refused} cannot be set for an IsoFLOP run (its"
                                  " candidate sets the model, steps, batch and learning rate; it trains from scratch"
                                  " on its mixture)")
    if not train:
        raise StepDefinitionError(f"IsoFLOP sweep {prefix!r}: no training data (train is empty)")
    try:
        ladder = isoflop_ladder(budgets, vocab_size, scale or IsoFlopScale())
    except (IsoFlopError, SpecError) as e:
        raise StepDefinitionError(f"IsoFLOP sweep {prefix!r}: {e}") from None
    runs = tuple(candidate_step(run_name(prefix, c), c, train, validation or {}, recipe, **train_options)
                 for c in ladder.candidates)
    return IsoFlopSweep(prefix=prefix, ladder=ladder, runs=runs, train=dict(train), validation=dict(validation or {}),
                        recipe=recipe, train_options=dict(train_options))


__all__ = ["IsoFlopRecipe", "IsoFlopSweep", "candidate_step", "isoflop_sweep", "run_name"]
