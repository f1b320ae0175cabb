"""The demo LLM pipeline, offline on a laptop, on real English text: the running Python's own
documentation (standard-library docstrings and pydoc topics, `pipeline/data/python_docs.py`) →
BPE tokenizer → Levanter cache → a small Llama → Hugging Face export → evaluation.

Sized for `make demo` on 2 CPU cores (about 400k training tokens): the loss falls from about
ln(vocab) as a real run's does and is still falling at the end. `build()` makes other sizes.
"""

from __future__ import annotations

from marin_assets import Experiment
from marin_assets.steps import (
    CheckpointEvals,
    LanguageModelPipeline,
    ModelSpec,
    OptimizerSpec,
    PythonBuild,
    TrainerSpec,
    language_model_pipeline,
    python_docs_step,
)

DATASET = "python-docs"
MODEL = ModelSpec(family="llama", hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4,
                  seq_len=128)
TRAINER = TrainerSpec(num_train_steps=200, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                      max_eval_batches=8)


def build(prefix: str = "python-docs", python: PythonBuild | None = None, vocab_size: int = 1024,
          model: ModelSpec = MODEL, trainer: TrainerSpec = TRAINER,
          optimizer: OptimizerSpec = OptimizerSpec()) -> LanguageModelPipeline:
    """`language_model_pipeline` on the documentation of `python` (default: the running interpreter)."""
    corpus = python_docs_step(f"raw/{prefix}", python)
    return language_model_pipeline(prefix, corpus, dataset=DATASET, vocab_size=vocab_size, model=model,
                                   trainer=trainer, optimizer=optimizer)


def checkpoint_evals(pipeline: LanguageModelPipeline, prefix: str = "python-docs") -> CheckpointEvals:
    """Every checkpoint of the training run, evaluated on the validation split as it lands (`TRAINER`'s
    batches, whatever trainer the pipeline was built with)."""
    assert pipeline.prefix == prefix, f"the pipeline is {pipeline.prefix!r}'s, not {prefix!r}'s"
    return pipeline.checkpoint_evals(TRAINER.max_eval_batches)


pipeline = build()
steps = [pipeline["export"], pipeline["evaluate"]]
per_checkpoint = [checkpoint_evals(pipeline)]
experiment = Experiment("python-docs", steps, per_checkpoint)
