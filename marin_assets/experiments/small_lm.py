"""The demo's shape of LLM pipeline on any raw text dataset: BPE tokenizer → Levanter cache →
a small language model → Hugging Face export → evaluation. Experiments differ in the corpus."""

from __future__ import annotations

from marin_assets.core.step import Step
from marin_assets.pipeline.evals.loss import evaluate_step, loss_checkpoint_evals
from marin_assets.pipeline.evals.steps import CheckpointEvals
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.export import export_step
from marin_assets.pipeline.training.run import TrainStep
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec


def build(prefix: str, corpus: Step, dataset: str, vocab_size: int, model: ModelSpec, trainer: TrainerSpec,
          optimizer: OptimizerSpec) -> dict[str, Step]:
    """The steps after `corpus`, named `tokenizers/{prefix}-bpe` … `evals/{prefix}-llama`; `dataset`
    names the corpus in the mixture (and in the eval metrics)."""
    from marin_assets.pipeline.training.pretrain import train_step

    tokenizer = bpe_tokenizer_step(f"tokenizers/{prefix}-bpe", corpus, vocab_size=vocab_size)
    tokenized = tokenize_step(f"tokenized/{prefix}-bpe", corpus, tokenizer)
    train = train_step(f"checkpoints/{prefix}-llama", {dataset: tokenized}, model, optimizer, trainer)
    return {
        "corpus": corpus, "tokenizer": tokenizer, "tokenized": tokenized, "train": train,
        "export": export_step(f"exports/{prefix}-llama", train),
        "evaluate": evaluate_step(f"evals/{prefix}-llama", train, {dataset: tokenized}),
    }


def checkpoint_evals(pipeline: dict[str, Step], prefix: str, dataset: str,
                     max_eval_batches: int | None) -> CheckpointEvals:
    """Every checkpoint of the pipeline's training run, evaluated on the validation split as it lands."""
    train = pipeline["train"]
    assert isinstance(train, TrainStep), "train_step makes a TrainStep"
    return loss_checkpoint_evals(f"evals/{prefix}-llama-checkpoints", train, {dataset: pipeline["tokenized"]},
                           max_eval_batches=max_eval_batches)
