"""Sweeps: one factory call expands a grid into train (and eval) steps sharing tokenized caches."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from marin_assets.core.step import Step
from marin_assets.pipeline.evaluate import evaluate_step
from marin_assets.pipeline.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.train import train_step


def _label(value: float) -> str:
    return f"{value:g}".replace("-", "m").replace("+", "")


def lr_model_sweep(prefix: str, train: dict[str, Step], models: dict[str, ModelSpec], learning_rates: Sequence[float],
                   trainer: TrainerSpec = TrainerSpec(), optimizer: OptimizerSpec = OptimizerSpec(),
                   validation: dict[str, Step] | None = None, evaluate: bool = True) -> list[Step]:
    """`checkpoints/{prefix}-{model}-lr{lr}` for every model × learning rate, plus `evals/…` for each."""
    steps: list[Step] = []
    for (label, model), lr in itertools.product(models.items(), learning_rates):
        run = f"{prefix}-{label}-lr{_label(lr)}"
        trained = train_step(f"checkpoints/{run}", train, model, dataclasses.replace(optimizer, learning_rate=lr),
                             trainer, validation=validation)
        steps.append(trained)
        if evaluate:
            steps.append(evaluate_step(f"evals/{run}", trained, {**train, **(validation or {})}))
    return steps
