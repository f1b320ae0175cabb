"""Downstream evaluation of the demo model with lm-evaluation-harness: the shipped tasks (which sentence of
Python's documentation comes next, multiple choice; the last word of a sentence, loglikelihood; both from
packages the demo never trains on) on its last checkpoint, and on every checkpoint as it lands.

Serve them from `definitions.py` beside the demo:

    steps = hello_world.steps + python_docs.steps + downstream_eval.steps
    per_checkpoint = python_docs.per_checkpoint + downstream_eval.per_checkpoint
    build_definitions(steps, extra_assets=[checkpoint_evals_asset(e) for e in per_checkpoint],
                      sensors=[checkpoint_sensor(per_checkpoint), …])

One sensor for both: a checkpoint's loss and task evaluations run together, one run per checkpoint.
"""

from __future__ import annotations

from marin_assets.core.step import Step
from marin_assets.experiments import python_docs
from marin_assets.pipeline.harness import HarnessCheckpointEvals, HarnessTask, harness_eval_step, shipped_tasks
from marin_assets.pipeline.train import TrainStep

NUM_FEWSHOT = 1
"""One example before each question: the demo model reads 128 tokens; with two, 381 of the next-sentence task's
400 requests lose part of their examples (`TaskScore.truncated`), with one 89."""


def build(pipeline: dict[str, Step], prefix: str, tasks: list[HarnessTask] | None = None,
          num_fewshot: int = NUM_FEWSHOT, limit: int | None = None) -> tuple[Step, HarnessCheckpointEvals]:
    """The tasks (default: the shipped ones) on the pipeline's last checkpoint, `evals/{prefix}-llama-harness`,
    and on each of its checkpoints, `evals/{prefix}-llama-harness-checkpoints`."""
    train = pipeline["train"]
    assert isinstance(train, TrainStep), "train_step makes a TrainStep"
    tasks = tasks if tasks is not None else shipped_tasks()
    final = harness_eval_step(f"evals/{prefix}-llama-harness", train, tasks, num_fewshot, limit=limit)
    return final, HarnessCheckpointEvals(f"evals/{prefix}-llama-harness-checkpoints", train, tasks, num_fewshot,
                                         limit)


final, checkpoints = build(python_docs.pipeline, "python-docs")
steps = [final]
per_checkpoint = [checkpoints]
