"""Export: a training run's checkpoint as a Hugging Face model folder (config, weights, tokenizer),
the form other tools, the Hub and lm-eval read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fsspec

from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.tokens.tokenizer import model_vocab_size
from marin_assets.pipeline.training.specs import ModelSpec
from marin_assets.pipeline.training.training_run import TrainResult


@record_type("hf_export")
@dataclass(frozen=True)
class ExportResult:
    """A Hugging Face model folder made from one checkpoint."""

    path: str
    checkpoint: str
    step: int


def checkpoint_step_of(checkpoint: str) -> int | None:
    """N of a `…/step-N` checkpoint folder; None for any other folder (a Hugging Face model)."""
    name = checkpoint.rstrip("/").rsplit("/", 1)[-1]
    return int(name.split("-", 1)[1]) if name.startswith("step-") else None


def export_hf(output_path: str, checkpoint: str, model: ModelSpec, tokenizer_path: str,
              vocab_size: int | None = None) -> ExportResult:
    """Convert a Levanter checkpoint to a Hugging Face model folder (config, safetensors, tokenizer).

    `vocab_size`: rows of the model's embedding (None: the tokenizer's largest id + 1, rounded up to
    `model.vocab_multiple`, as a fresh training run sizes it)."""
    from marin_assets.pipeline.training.levanter_model import export_checkpoint
    with s3_arrays([checkpoint, output_path]):

        if not _exists(join_path(checkpoint, "metadata.json")):
            raise FileNotFoundError(f"no complete checkpoint at {checkpoint}")
        export_checkpoint(checkpoint, output_path, model, tokenizer_path,
                          vocab_size or model_vocab_size(tokenizer_path, model.vocab_multiple))
        return ExportResult(output_path, checkpoint, checkpoint_step_of(checkpoint) or 0)


def is_hf_model(checkpoint: str) -> bool:
    """Whether `checkpoint` is a Hugging Face model folder (else a complete Levanter checkpoint);
    `FileNotFoundError` when it is neither."""
    is_hf = _exists(join_path(checkpoint, "config.json"))
    if not is_hf and not _exists(join_path(checkpoint, "metadata.json")):
        raise FileNotFoundError(f"no complete checkpoint or Hugging Face model at {checkpoint}")
    return is_hf


def _exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(path)


@dataclass(frozen=True, eq=False)
class ExportStep(Step):
    """An export step that says which training run it exports (what fine-tuning from it starts from)."""

    exports: Step = field(kw_only=True)
    """The training step whose checkpoint is exported."""


def export_step(name: str, train: Step, checkpoint_step: int | None = None) -> ExportStep:
    """A Hugging Face export of a checkpoint (default: the last) of a training step (its result is a `TrainResult`).

    Identity: `checkpoint_step` (and `train`).
    """
    def run(out: str) -> ExportResult:
        result = load_result(train, TrainResult)
        model, tokenizer = result.model_and_tokenizer()
        return export_hf(out, result.checkpoint_path(checkpoint_step), model, tokenizer, result.vocab_size)

    return ExportStep(name=name, fn=run, deps=[train], hash_attrs={"checkpoint_step": checkpoint_step}, kind="export",
                      description=made_by(export_hf), kinds=["levanter", "huggingface"], exports=train)
