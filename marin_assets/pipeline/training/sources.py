"""Where a training run's first weights come from: random, a Hugging Face model folder (a plain folder or
an export step's), or a Levanter checkpoint — another training step's, or a Hugging Face model converted
(`hf_to_levanter_step`). Only the weights: the optimizer, step count and data order start afresh. The
source enters the step's identity; shapes are checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marin_assets.core.record import RecordNotAvailableError, load_result
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, tokenizer_fingerprint
from marin_assets.pipeline.training.export import ExportStep
from marin_assets.pipeline.training.hf_folder import TrainSourceError, hf_fingerprint, read_hf_config
from marin_assets.pipeline.training.hf_to_levanter import HfToLevanterStep, LevanterCheckpoint
from marin_assets.pipeline.training.specs import (
    ModelSpec,
)
from marin_assets.pipeline.training.training_run import TrainResult, TrainStep


@dataclass(frozen=True)
class InitWeights:
    """The weights a run starts from, as a place and a size: what `train_lm` takes."""

    path: str
    """A Hugging Face model folder (`config.json` and weights), or a Levanter checkpoint (`…/step-N`)."""
    vocab_size: int
    """Rows of its embedding: the continued model keeps them (the tokenizer's ids must fit)."""
    model: ModelSpec | None = None
    """The model a Levanter checkpoint holds (needed to read it); None for a Hugging Face folder."""


@dataclass(frozen=True)
class InitFrom:
    """Where a training step's first weights come from: a Hugging Face model folder, or a checkpoint of
    another training step. Only the weights: the optimizer, step count and data order start afresh.
    Make one with `from_hf` or `from_checkpoint`."""

    source: Step | None = None
    """A `TrainStep` (one of its Levanter checkpoints), an `HfToLevanterStep` (its one checkpoint), or a
    step whose output is a Hugging Face model folder (an export step); the training step depends on it."""
    folder: str | None = None
    """A plain Hugging Face model folder (local path or URL), identified by its path and `fingerprint`."""
    checkpoint_step: int | None = None
    """Which checkpoint of a `TrainStep` source; None: its last."""
    fingerprint: str | None = None
    """`hf_fingerprint` of `folder`, taken at definition time."""

    def identity(self) -> dict[str, Any]:
        """What enters the training step's hash_attrs."""
        if isinstance(self.source, (TrainStep, HfToLevanterStep)):
            return {"checkpoint_of": self.source.name_with_hash, "checkpoint_step": self.checkpoint_step}
        if self.source is not None:
            return {"hf_step": self.source.name_with_hash}
        return {"hf_folder": self.folder, "fingerprint": self.fingerprint}

    def describe(self) -> str:
        """The source in words, for messages."""
        if isinstance(self.source, TrainStep):
            which = "the last checkpoint" if self.checkpoint_step is None else f"checkpoint {self.checkpoint_step}"
            return f"{which} of {self.source.name}"
        if isinstance(self.source, HfToLevanterStep):
            return f"the Levanter checkpoint {self.source.name} converted from {self.source.source.name}"
        return f"the Hugging Face model of {self.source.name}" if self.source is not None else str(self.folder)

    def vocab_size(self) -> int:
        """Rows of the source's embedding (what the continued model keeps)."""
        return self.resolve().vocab_size

    def resolve(self) -> InitWeights:
        """The place and vocabulary of the weights (run time: reads the source step's record or the folder)."""
        from marin_assets.pipeline.tokens.tokenizer import model_vocab_size

        if isinstance(self.source, TrainStep):
            result = load_result(self.source, TrainResult)
            model, tokenizer = result.model_and_tokenizer()
            try:
                checkpoint = result.checkpoint_path(self.checkpoint_step)
            except ValueError as e:
                raise TrainSourceError(f"cannot start from {self.describe()}: {e}") from None
            vocab = result.vocab_size or model_vocab_size(tokenizer, model.vocab_multiple)
            return InitWeights(checkpoint, vocab, model)
        if isinstance(self.source, HfToLevanterStep):
            converted = load_result(self.source, LevanterCheckpoint)
            return InitWeights(converted.checkpoint_path(self.checkpoint_step), converted.vocab_size, converted.model)
        folder = self.source.output_path if self.source is not None else str(self.folder)
        return InitWeights(folder, int(read_hf_config(folder)["vocab_size"]))


def from_hf(source: Step | str) -> InitFrom:
    """Start from a Hugging Face Llama/GPT-2 model folder: a step whose output is one (an export step), or
    a plain folder (local or URL), whose path and `hf_fingerprint` then enter the training step's identity."""
    if isinstance(source, TrainStep):
        raise StepDefinitionError(f"{source.name} is a training step: start from its checkpoints with"
                                  " from_checkpoint(), or from its export step's folder with from_hf()")
    if isinstance(source, HfToLevanterStep):
        raise StepDefinitionError(f"{source.name} is a Levanter checkpoint (converted from {source.source.name}):"
                                  " start from it with from_checkpoint(), or from the Hugging Face folder itself"
                                  " with from_hf()")
    if isinstance(source, Step):
        return InitFrom(source=source)
    return InitFrom(folder=source, fingerprint=hf_fingerprint(source))


def from_checkpoint(train: TrainStep | HfToLevanterStep, step: int | None = None) -> InitFrom:
    """Start from checkpoint `step` (default: the last) of another training step's Levanter checkpoints, or from
    a Hugging Face model converted into one (`hf_to_levanter_step`, whose one checkpoint is step 0)."""
    if not isinstance(train, (TrainStep, HfToLevanterStep)):
        raise StepDefinitionError(f"from_checkpoint needs a training step (train_step) or a converted model"
                                  f" (hf_to_levanter_step), got {getattr(train, 'name', train)!r}; for a Hugging"
                                  " Face folder use from_hf()")
    if step is not None and step < 0:
        raise StepDefinitionError(f"checkpoint step must be non-negative, got {step}")
    if isinstance(train, HfToLevanterStep) and step not in (None, 0):
        raise StepDefinitionError(f"{train.name} is a converted model with one checkpoint (step 0), not {step}")
    return InitFrom(source=train, checkpoint_step=step)


def source_mismatches(model: ModelSpec, init_from: InitFrom, hf_config: Mapping[str, Any] | None) -> str | None:
    """How the source's weights do not fit `model` (None: they fit, or nothing to compare yet): the source
    step's model for a checkpoint, the `config.json` of a Hugging Face folder."""
    if isinstance(init_from.source, TrainStep):
        problems = model.differences(init_from.source.model)
    elif isinstance(init_from.source, HfToLevanterStep):
        theirs = init_from.source.model or _converted_model(init_from.source)
        problems = model.differences(theirs) if theirs is not None else []
    elif hf_config is not None:
        problems = model.hf_differences(hf_config)
    else:
        return None
    if not problems:
        return None
    return f"the model does not fit the weights of {init_from.describe()}: " + "; ".join(problems)


def _converted_model(step: HfToLevanterStep) -> ModelSpec | None:
    """The model a conversion recorded (None before it has one): a conversion that reads its model from
    `config.json` knows it only once it ran."""
    try:
        return load_result(step, LevanterCheckpoint).model
    except RecordNotAvailableError:
        return None


def source_model(init_from: InitFrom) -> ModelSpec | None:
    """The model the starting weights belong to, where the graph says: a training step's, or that of the
    training step an export step exports."""
    source = init_from.source
    if isinstance(source, TrainStep):
        return source.model
    if isinstance(source, ExportStep) and isinstance(source.exports, TrainStep):
        return source.exports.model
    if isinstance(source, HfToLevanterStep):
        return source.model
    return None


def model_of(who: str, model: ModelSpec | None, init_from: InitFrom, *, check_config: bool = False) -> ModelSpec:
    """The model a run from `init_from` trains or scores: `model`, else the source's (`source_model`); with
    `check_config`, checked against the source folder's config. A `StepDefinitionError` naming `who` otherwise."""
    model = model or source_model(init_from)
    if model is None:
        raise StepDefinitionError(f"{who}: give model= (the ModelSpec of the weights in {init_from.describe()});"
                                  " only a training, export or conversion step's model is known")
    if check_config:
        mismatch = source_mismatches(model, init_from,
                                     read_hf_config(init_from.folder) if init_from.folder else None)
        if mismatch:
            raise StepDefinitionError(f"{who}: {mismatch}")
    return model


def check_source_tokenizer(what: str, source: InitFrom, cache: TokenizedCache) -> None:
    """Weights from another training step were trained on the tokenizer the preference cache was made with."""
    if not isinstance(source.source, TrainStep):
        return
    trained = load_result(source.source, TrainResult)
    theirs = tokenizer_fingerprint(trained.model_and_tokenizer()[1])
    if theirs != cache.tokenizer_fingerprint:
        raise TrainSourceError(f"{what}: {source.describe()} was trained on tokenizer {trained.tokenizer} (fingerprint"
                               f" {theirs}), but the preference cache was tokenized with {cache.tokenizer} (fingerprint"
                               f" {cache.tokenizer_fingerprint})")


def resolve_weights(what: str, source: InitFrom, model: ModelSpec) -> InitWeights:
    """The place and vocabulary of `source`'s weights, which must fit `model` (`TrainSourceError` naming `what`)."""
    weights = source.resolve()
    mismatch = source_mismatches(model, source, read_hf_config(weights.path) if weights.model is None else None)
    if mismatch:
        raise TrainSourceError(f"{what}: {mismatch}")
    return weights
