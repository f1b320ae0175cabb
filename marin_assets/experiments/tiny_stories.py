"""The LLM pipeline on generated stories (`pipeline/data/corpus.py`): any size in seconds, so tests
build it small. The demo trains on real text instead (`python_docs.py`): a model learns these
template sentences almost perfectly, which no real run does."""

from __future__ import annotations

from marin_assets.steps import (
    CheckpointEvals,
    LanguageModelPipeline,
    ModelSpec,
    OptimizerSpec,
    TrainerSpec,
    corpus_step,
    language_model_pipeline,
)

DATASET = "stories"
MODEL = ModelSpec(family="llama", hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4,
                  seq_len=256)
TRAINER = TrainerSpec(num_train_steps=200, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                      max_eval_batches=8)


def build(prefix: str = "tiny-stories", train_documents: int = 20_000, validation_documents: int = 1_000,
          vocab_size: int = 1024, model: ModelSpec = MODEL, trainer: TrainerSpec = TRAINER,
          optimizer: OptimizerSpec = OptimizerSpec()) -> LanguageModelPipeline:
    """`raw/{prefix}` (generated stories), then `language_model_pipeline` on them: `tokenizers/{prefix}-bpe` …
    `evals/{prefix}-llama`."""
    corpus = corpus_step(f"raw/{prefix}", train_documents, validation_documents, seed=0)
    return language_model_pipeline(prefix, corpus, dataset=DATASET, vocab_size=vocab_size, model=model,
                                   trainer=trainer, optimizer=optimizer)


def checkpoint_evals(pipeline: LanguageModelPipeline, prefix: str = "tiny-stories") -> CheckpointEvals:
    """Every checkpoint of the training run, evaluated on the validation split as it lands (`TRAINER`'s
    batches, whatever trainer the pipeline was built with)."""
    assert pipeline.prefix == prefix, f"the pipeline is {pipeline.prefix!r}'s, not {prefix!r}'s"
    return pipeline.checkpoint_evals(TRAINER.max_eval_batches)
