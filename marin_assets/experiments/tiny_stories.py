"""The demo LLM pipeline, offline on a laptop: synthetic stories → BPE tokenizer → Levanter
cache → a tiny Llama → Hugging Face export → evaluation. `build()` makes smaller variants."""

from __future__ import annotations

from marin_assets.core.step import Step
from marin_assets.pipeline.corpus import corpus_step
from marin_assets.pipeline.evaluate import CheckpointEvals, evaluate_step, export_step
from marin_assets.pipeline.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.tokenize import tokenize_step
from marin_assets.pipeline.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.train import TrainStep

MODEL = ModelSpec(family="llama", hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4,
                  seq_len=256)
TRAINER = TrainerSpec(num_train_steps=200, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                      max_eval_batches=8)


def build(prefix: str = "tiny-stories", train_documents: int = 20_000, validation_documents: int = 1_000,
          vocab_size: int = 1024, model: ModelSpec = MODEL, trainer: TrainerSpec = TRAINER,
          optimizer: OptimizerSpec = OptimizerSpec()) -> dict[str, Step]:
    from marin_assets.pipeline.train import train_step

    corpus = corpus_step(f"raw/{prefix}", train_documents, validation_documents, seed=0)
    tokenizer = bpe_tokenizer_step(f"tokenizers/{prefix}-bpe", corpus, vocab_size=vocab_size)
    tokenized = tokenize_step(f"tokenized/{prefix}-bpe", corpus, tokenizer)
    train = train_step(f"checkpoints/{prefix}-llama", {"stories": tokenized}, model, optimizer, trainer)
    return {
        "corpus": corpus, "tokenizer": tokenizer, "tokenized": tokenized, "train": train,
        "export": export_step(f"exports/{prefix}-llama", train),
        "evaluate": evaluate_step(f"evals/{prefix}-llama", train, {"stories": tokenized}),
    }


def checkpoint_evals(pipeline: dict[str, Step], prefix: str = "tiny-stories") -> CheckpointEvals:
    """Every checkpoint of the training run, evaluated on the validation split as it lands."""
    train = pipeline["train"]
    assert isinstance(train, TrainStep), "train_step makes a TrainStep"
    return CheckpointEvals(f"evals/{prefix}-llama-checkpoints", train, {"stories": pipeline["tokenized"]},
                           max_eval_batches=TRAINER.max_eval_batches)


pipeline = build()
steps = [pipeline["export"], pipeline["evaluate"]]
per_checkpoint = [checkpoint_evals(pipeline)]
