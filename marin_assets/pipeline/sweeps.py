"""Sweeps: one factory call expands a grid into train (and eval) steps sharing tokenized caches.

A tool experiments are built with, outside the wings: it reads training (`train_step`) and evaluation
(`loss_eval_step`), so it sits above both, as the experiments do (`reports/sweep.py` before 0.2.0: a sweep makes
runs, a report reads them). The IsoFLOP ladder's builder is training's own (`training/pretrain/isoflop_sweep.py`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.evals.loss import loss_eval_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec


def lr_label(value: float) -> str:
    """A learning rate as it appears in a run name: `3e-4` → `0.0003`, `1e-05` → `1em05`."""
    return f"{value:g}".replace("-", "m").replace("+", "")


def lr_model_sweep(prefix: str, train: dict[str, Step], models: dict[str, ModelSpec], learning_rates: Sequence[float],
                   trainer: TrainerSpec = TrainerSpec(), optimizer: OptimizerSpec = OptimizerSpec(),
                   validation: dict[str, Step] | None = None, evaluate: bool = True,
                   **train_options: Any) -> list[Step]:
    """`checkpoints/{prefix}-{model}-lr{lr}` for every model × learning rate, plus `evals/…` for each.

    `train_options` go to every `train_step` (`weights`, `budget`, `init_from`, `gpu`, …); the evaluations run
    on the same GPUs.

    A grid point given twice (the same learning rate twice, or two labels for one model) and
    two points whose run names come out the same (learning rates that print alike) are
    definition errors: each would silently train once where two runs were meant, or twice
    where one was.

    Identity: each step's, as `train_step` and `loss_eval_step` make it from `train`, `validation`, one of `models`,
    one of `learning_rates`, `trainer`, `optimizer` and `train_options`.
    """
    runs: dict[str, tuple[str, float]] = {}
    points: dict[tuple[ModelSpec, float], tuple[str, float]] = {}
    for (label, model), lr in itertools.product(models.items(), learning_rates):
        run = f"{prefix}-{label}-lr{lr_label(lr)}"
        if (model, lr) in points:
            other = points[(model, lr)]
            raise StepDefinitionError(f"sweep {prefix!r}: the grid point model {label!r} × learning rate {lr!r} is"
                                      f" also model {other[0]!r} × learning rate {other[1]!r}: the same training"
                                      " twice; remove the duplicate")
        if run in runs:
            other = runs[run]
            raise StepDefinitionError(f"sweep {prefix!r}: model {label!r} × learning rate {lr!r} and model"
                                      f" {other[0]!r} × learning rate {other[1]!r} both get the run name {run!r};"
                                      " give learning rates that differ in their first 6 significant digits, or"
                                      " distinct model labels")
        points[(model, lr)] = runs[run] = (label, lr)
    steps: list[Step] = []
    for run, (label, lr) in runs.items():
        tuned = dataclasses.replace(optimizer, learning_rate=lr)
        trained = train_step(f"checkpoints/{run}", train, models[label], tuned, trainer, validation=validation,
                             **train_options)
        steps.append(trained)
        if evaluate:
            steps.append(loss_eval_step(f"evals/{run}", trained, {**train, **(validation or {})},
                                        gpu=train_options.get("gpu", 0), gpu_type=train_options.get("gpu_type")))
    return steps
