"""A model named by its steps — a training run's checkpoint, a Hugging Face export of one, or a model from the Hub
(`hf_model_step`, or its conversion `hf_to_levanter_step`) — for the evaluations that take a model as an argument
(`log_probs_step(model=…)`, both sides of `perplexity_gap_step`).

Each of these records what reading its weights needs (`model_and_tokenizer()`, `checkpoint_path()`, `vocab_size`,
as `eval_step` reads them); an export step says which run it exports, whose record says the same. Anything else
has no known model or tokenizer, and is refused when the step is defined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin_assets.core.record import load_result
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.training.export import ExportResult, ExportStep
from marin_assets.pipeline.training.hf_to_levanter import HfToLevanterStep
from marin_assets.pipeline.training.training_run import TrainStep

HUB_MODEL_KIND = "model"
"""The kind of `hf_model_step`: a Hugging Face model folder whose record (`HfModel`) says what reading it needs."""


@dataclass(frozen=True)
class ModelRef:
    """A checkpoint of a training run (`checkpoint_step`, default the last), `export`, an export of it, or a model
    from the Hub."""

    train: Step
    """The training run, or the model from the Hub (its record says the model spec, tokenizer and vocabulary)."""
    export: Step | None = None
    """A Hugging Face export of the run, scored instead of a checkpoint."""
    checkpoint_step: int | None = None
    """Which checkpoint of `train` (None: the last); unused for an export."""

    @property
    def step(self) -> Step:
        """The step whose output is scored: what a reader depends on (an export's run succeeded before it)."""
        return self.export or self.train

    def describe(self) -> str:
        """The model in words, for errors and descriptions."""
        if self.export is not None:
            return f"export {self.export.name!r}"
        at = "the last checkpoint" if self.checkpoint_step is None else f"checkpoint {self.checkpoint_step}"
        return f"{at} of {self.train.name!r}"

    def identity(self) -> dict[str, object]:
        """What, besides the step's own hash (a dependency), says which weights are scored."""
        return {"checkpoint_step": self.checkpoint_step, "export": self.export is not None}

    def checkpoint(self, platform: str | None = None) -> Checkpoint:
        """The weights to read and what reading them needs (run time: reads the records)."""
        result: Any = load_result(self.train)  # TrainResult, or a model from the Hub (HfModel, LevanterCheckpoint)
        model, tokenizer = result.model_and_tokenizer()
        path = (load_result(self.export, ExportResult).path if self.export is not None
                else result.checkpoint_path(self.checkpoint_step))
        return Checkpoint(path, model, tokenizer, result.vocab_size, platform)


def model_ref(where: str, model: Step, checkpoint_step: int | None = None) -> ModelRef:
    """`model` — a training step (its checkpoint `checkpoint_step`, default the last), an export step or a model from
    the Hub — as a `ModelRef`; anything else is a `StepDefinitionError` naming `where`: its model and tokenizer are
    unknown."""
    if isinstance(model, ExportStep):
        if checkpoint_step is not None:
            raise StepDefinitionError(f"{where}: {model.name!r} is an export (of one checkpoint); checkpoint_step"
                                      f" {checkpoint_step} applies to a training step only")
        return ModelRef(model.exports, model)
    if isinstance(model, (TrainStep, HfToLevanterStep)) or (isinstance(model, Step) and model.kind == HUB_MODEL_KIND):
        return ModelRef(model, None, checkpoint_step)
    what = f"step {model.name!r}" if isinstance(model, Step) else repr(model)
    raise StepDefinitionError(f"{where}: {what} is not a model (a training step, an export of one, or a model from"
                              " the Hub), so its weights and tokenizer are unknown; pass a train_step/sft_step, an"
                              " export_step, an hf_model_step or an hf_to_levanter_step")
