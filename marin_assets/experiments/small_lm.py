"""The demo's shape of LLM pipeline on any raw text dataset: BPE tokenizer → Levanter cache →
a small language model → Hugging Face export → evaluation. Experiments differ in the corpus."""

from __future__ import annotations

from marin_assets import Step
from marin_assets.steps import (
    CheckpointEvals,
    ModelSpec,
    OptimizerSpec,
    TrainerSpec,
    TrainStep,
    bpe_tokenizer_step,
    evaluate_step,
    export_step,
    loss_checkpoint_evals,
    tokenize_step,
    train_step,
)


def build(prefix: str, corpus: Step, dataset: str, vocab_size: int, model: ModelSpec, trainer: TrainerSpec,
          optimizer: OptimizerSpec) -> dict[str, Step]:
    """The steps after `corpus`, named `tokenizers/{prefix}-bpe` … `evals/{prefix}-llama`; `dataset`
    names the corpus in the mixture (and in the eval metrics)."""
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
