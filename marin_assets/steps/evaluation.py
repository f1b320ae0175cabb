"""Evaluation: the evaluation kinds as final steps or per checkpoint, and what they take.

Loss and bits per byte, lm-eval harness tasks (generative ones too), per-token log-probs, the perplexity gap between
two models, and the train–test overlap of evaluation sets with a model's training text; a model's completions of
prompts (`generate_step`, with a `Sampling`) and the model served behind OpenAI's API (`served`); `eval_step` and
`CheckpointEvals` run any `EvalKind`. `evaluate_step` is `loss_eval_step`'s name before 0.2.0 (it goes in 0.3.0).
"""

from marin_assets.pipeline.evals.completions import (
    GenerationResult,
    Prompts,
    generate_checkpoints,
    generate_step,
    prompts_from,
)
from marin_assets.pipeline.evals.harness import harness_checkpoint_evals, harness_eval_step
from marin_assets.pipeline.evals.harness_tasks import HarnessTask, harness_task, shipped_task, shipped_tasks
from marin_assets.pipeline.evals.kind import EvalKind
from marin_assets.pipeline.evals.log_probs import log_probs_checkpoint_evals, log_probs_step
from marin_assets.pipeline.evals.loss import evaluate_step, loss_checkpoint_evals, loss_eval_step
from marin_assets.pipeline.evals.perplexity_gap import (
    TextSet,
    perplexity_gap_checkpoint_evals,
    perplexity_gap_step,
    suite_text_sets,
)
from marin_assets.pipeline.evals.serving import Served, checkpoint_at, served
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep, eval_step
from marin_assets.pipeline.reports.overlap import overlap_step
from marin_assets.pipeline.training.generation import Sampling

__all__ = [
    # any kind, final or per checkpoint
    "eval_step", "EvalStep", "EvalKind", "CheckpointEvals",
    # loss and bits per byte
    "loss_eval_step", "loss_checkpoint_evals",
    # lm-eval harness
    "harness_eval_step", "harness_checkpoint_evals", "HarnessTask", "harness_task", "shipped_task", "shipped_tasks",
    # a model writes: completions of prompts, and the model served behind OpenAI's API
    "generate_step", "generate_checkpoints", "prompts_from", "Prompts", "Sampling", "GenerationResult",
    "served", "Served", "checkpoint_at",
    # inside a model
    "log_probs_step", "log_probs_checkpoint_evals", "perplexity_gap_step", "perplexity_gap_checkpoint_evals",
    "suite_text_sets", "TextSet",
    # train–test overlap
    "overlap_step",
    # old names, kept for one release: calling one warns (DeprecationWarning), naming the new name
    "evaluate_step",  # loss_eval_step
]
