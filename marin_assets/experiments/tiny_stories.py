"""The LLM pipeline on generated stories (`pipeline/data/corpus.py`): any size in seconds, so tests
build it small. The demo trains on real text instead (`python_docs.py`): a model learns these
template sentences almost perfectly, which no real run does."""

from __future__ import annotations

from marin_assets import Step
from marin_assets.experiments import small_lm
from marin_assets.steps import CheckpointEvals, ModelSpec, OptimizerSpec, TrainerSpec, corpus_step

DATASET = "stories"
MODEL = ModelSpec(family="llama", hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4,
                  seq_len=256)
TRAINER = TrainerSpec(num_train_steps=200, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                      max_eval_batches=8)


def build(prefix: str = "tiny-stories", train_documents: int = 20_000, validation_documents: int = 1_000,
          vocab_size: int = 1024, model: ModelSpec = MODEL, trainer: TrainerSpec = TRAINER,
          optimizer: OptimizerSpec = OptimizerSpec()) -> dict[str, Step]:
    corpus = corpus_step(f"raw/{prefix}", train_documents, validation_documents, seed=0)
    return small_lm.build(prefix, corpus, DATASET, vocab_size, model, trainer, optimizer)


def checkpoint_evals(pipeline: dict[str, Step], prefix: str = "tiny-stories") -> CheckpointEvals:
    """Every checkpoint of the training run, evaluated on the validation split as it lands."""
    return small_lm.checkpoint_evals(pipeline, prefix, DATASET, TRAINER.max_eval_batches)
