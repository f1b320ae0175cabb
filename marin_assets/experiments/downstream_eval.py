"""Downstream evaluation of the demo model with lm-evaluation-harness: the shipped tasks (which sentence of
Python's documentation comes next, multiple choice; the last word of a sentence, loglikelihood; both from
packages the demo never trains on) on its last checkpoint, and on every checkpoint as it lands.

Served by `definitions.py` beside the demo (`experiment`, merged with the others by `experiment_definitions`):
one checkpoint sensor for both, so a checkpoint's loss and task evaluations run together, one run per checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping

from marin_assets import Experiment, Step
from marin_assets.experiments import python_docs
from marin_assets.steps import (
    CheckpointEvals,
    HarnessTask,
    TrainStep,
    harness_checkpoint_evals,
    harness_eval_step,
    shipped_tasks,
)

NUM_FEWSHOT = 1
"""One example before each question: the demo model reads 128 tokens; with two, 381 of the next-sentence task's
400 requests lose part of their examples (`TaskScore.truncated`), with one 89."""


def build(pipeline: Mapping[str, Step], prefix: str, tasks: list[HarnessTask] | None = None,
          num_fewshot: int = NUM_FEWSHOT, limit: int | None = None) -> tuple[Step, CheckpointEvals]:
    """The tasks (default: the shipped ones) on the pipeline's last checkpoint, `evals/{prefix}-llama-harness`,
    and on each of its checkpoints, `evals/{prefix}-llama-harness-checkpoints`."""
    train = pipeline["train"]
    assert isinstance(train, TrainStep), "train_step makes a TrainStep"
    tasks = tasks if tasks is not None else shipped_tasks()
    final = harness_eval_step(f"evals/{prefix}-llama-harness", train, tasks, num_fewshot, limit=limit)
    return final, harness_checkpoint_evals(f"evals/{prefix}-llama-harness-checkpoints", train, tasks, num_fewshot,
                                         limit)


final, checkpoints = build(python_docs.pipeline, "python-docs")
steps = [final]
per_checkpoint = [checkpoints]
experiment = Experiment("python-docs-harness", steps, per_checkpoint)
