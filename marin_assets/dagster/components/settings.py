"""The plain settings of an experiment declared in YAML (`defs.yaml`), as typed models.

Each block maps onto one pipeline factory's arguments, with the factory's own defaults, so a YAML experiment and
its Python twin are the same steps. The specs of training (`ModelSpec`, `OptimizerSpec`, `TrainerSpec`) take
their defaults from the dataclasses themselves; `tests/test_experiment_component.py` checks that every spec field
has a setting, so a new one cannot be silently missing here. Simple bounds (positive sizes, known families and
schedules, at most one source) are in the JSON schema, so `dg check defs` names the line of a bad value before
anything loads; what spans fields (heads dividing the width) fails when the component loads, naming the block.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import dagster as dg
from pydantic import ConfigDict, Field, model_validator

from marin_assets.steps import ModelSpec, OptimizerSpec, SpecError, TrainerSpec

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"
"""One segment of a step name (`core/step.py`): the experiment's name prefixes every step it makes."""



def one_of(*keys: str) -> dict[str, Any]:
    """JSON schema of a block that takes exactly one of `keys` (`corpus`, `tokenizer`, a suite's source)."""
    return {"oneOf": [{"required": [k]} for k in keys]}


BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minItems", "minProperties", "pattern")


def bounded(default: Any = ..., **schema: Any) -> Any:
    """A field with JSON-schema bounds (`BOUNDS`): `dg check defs` checks them, naming the line, and so does
    `Settings` when the file loads. (Dagster takes nested settings as plain models only without pydantic's
    `Annotated` constraints, so the bounds are schema extras, checked here.)"""
    return Field(default, json_schema_extra=schema)


def bound_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """How `value` breaks the bounds in `schema`, or None."""
    rules = {
        "minimum": (lambda v, b: v >= b, "at least"), "exclusiveMinimum": (lambda v, b: v > b, "greater than"),
        "maximum": (lambda v, b: v <= b, "at most"), "exclusiveMaximum": (lambda v, b: v < b, "less than"),
        "minItems": (lambda v, b: len(v) >= b, "a list of at least"),
        "minProperties": (lambda v, b: len(v) >= b, "a mapping of at least"),
        "pattern": (lambda v, b: re.search(b, v) is not None, "text matching"),
    }
    for key, bound in schema.items():
        if key in rules and not rules[key][0](value, bound):
            return f"must be {rules[key][1]} {bound!r}" + (" entries" if key.startswith("min") and key != "minimum"
                                                           else "") + f", got {value!r}"
    return None


class Settings(dg.Model):
    """A block of settings: unknown keys are errors, bounds are checked, field docstrings describe the schema."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    @model_validator(mode="after")
    def within_bounds(self) -> Any:
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if value is not None and isinstance(info.json_schema_extra, dict):
                problem = bound_problem(value, {k: v for k, v in info.json_schema_extra.items() if k in BOUNDS})
                if problem:
                    raise ValueError(f"{name} {problem}")
        return self


def exactly_one(block: str, values: dict[str, Any]) -> str:
    """The one key of `values` that is set; a `ValueError` naming `block` and its keys otherwise."""
    chosen = [k for k, v in values.items() if v is not None]
    if len(chosen) != 1:
        raise ValueError(f"{block} takes exactly one of {sorted(values)}, got {chosen or 'none'}")
    return chosen[0]


# --- where the text comes from -----------------------------------------------------------------------------------


class PythonDocs(Settings):
    """The running Python's documentation (`python_docs_step`): the demo's real text, offline."""

    validation_percent: float = bounded(10.0, minimum=0, exclusiveMaximum=100)
    """Percent of packages and topics held out as `validation/`."""
    min_chars: int = bounded(40, minimum=0)
    """Shorter documents are dropped."""
    shards: int = bounded(2, exclusiveMinimum=0)
    """Files per split."""


class HuggingFace(Settings):
    """A Hugging Face repository at a revision (`hf_download_step`); a commit sha pins it, a branch is followed."""

    repo_id: str
    revision: str
    include: list[str] = ["*"]
    """File globs to download."""
    repo_type: Literal["dataset", "model", "space"] = "dataset"


class Corpus(Settings):
    """The raw text: exactly one source. Its layout gives the splits (`train/`, `validation/`, or
    `data/{split}-*`), as `tokenize_step` finds them."""

    model_config = ConfigDict(json_schema_extra=one_of("python_docs", "huggingface", "urls"))

    python_docs: PythonDocs | None = None
    huggingface: HuggingFace | None = None
    urls: list[str] | None = bounded(None, minItems=1)
    """Any fsspec URLs, globs or local paths (`url_download_step`); a relative path is relative to the YAML file."""
    text_field: str = "text"
    """The field of each record that holds the text (JSON lines, parquet)."""
    text_format: Literal["auto", "jsonl", "parquet", "text-file", "text-lines"] = "auto"
    """How the files are read (`pipeline/data/readers.py`)."""

    @model_validator(mode="after")
    def one_source(self) -> Corpus:
        exactly_one("corpus", {"python_docs": self.python_docs, "huggingface": self.huggingface, "urls": self.urls})
        return self


# --- tokenizer and tokenized caches ---------------------------------------------------------------------------------


class Bpe(Settings):
    """A byte-level BPE trained on the corpus's train split (`bpe_tokenizer_step`)."""

    vocab_size: int = bounded(exclusiveMinimum=0)
    max_documents: int | None = bounded(None, exclusiveMinimum=0)
    """Train on at most this many documents (default: all)."""


class Existing(Settings):
    """An existing Hugging Face tokenizer, by hub name or folder (`existing_tokenizer_step`)."""

    name_or_path: str
    revision: str | None = None
    label: str | None = bounded(None, pattern=NAME_PATTERN)
    """Names its steps (`tokenizers/{name}-{label}`); default: the last part of `name_or_path`."""


class Tokenizer(Settings):
    """Exactly one of `bpe` (trained here) or `existing`."""

    model_config = ConfigDict(json_schema_extra=one_of("bpe", "existing"))

    bpe: Bpe | None = None
    existing: Existing | None = None

    @model_validator(mode="after")
    def one_tokenizer(self) -> Tokenizer:
        exactly_one("tokenizer", {"bpe": self.bpe, "existing": self.existing})
        return self


class Tokenize(Settings):
    """How the corpus becomes a Levanter cache (`tokenize_step`)."""

    splits: dict[str, list[str]] | None = None
    """Split → file globs; default: found from the corpus's layout."""
    config: str | None = None
    """The config folder, for a dataset with several."""
    framing: Literal["bos_eos", "eos", "levanter"] = "bos_eos"
    workers: int = bounded(1, exclusiveMinimum=0)
    """Processes tokenizing files at once (Ray tasks beside the step's own)."""


# --- training: one field per spec field, the spec's defaults ------------------------------------------------------


class Model(Settings):
    """The model (`ModelSpec`)."""

    family: Literal["llama", "gpt2"] = "llama"
    hidden_dim: int = bounded(ModelSpec.hidden_dim, exclusiveMinimum=0)
    intermediate_dim: int = bounded(ModelSpec.intermediate_dim, exclusiveMinimum=0)
    """Llama MLP width (GPT-2 uses 4 × hidden)."""
    num_layers: int = bounded(ModelSpec.num_layers, exclusiveMinimum=0)
    num_heads: int = bounded(ModelSpec.num_heads, exclusiveMinimum=0)
    num_kv_heads: int = bounded(ModelSpec.num_kv_heads, exclusiveMinimum=0)
    """Llama grouped-query heads."""
    seq_len: int = bounded(ModelSpec.seq_len, exclusiveMinimum=0)
    max_seq_len: int = bounded(ModelSpec.max_seq_len, exclusiveMinimum=0)
    vocab_multiple: int = bounded(ModelSpec.vocab_multiple, exclusiveMinimum=0)
    """The vocabulary is the tokenizer's largest id + 1 rounded up to a multiple of this."""
    norm_epsilon: float = bounded(ModelSpec.norm_epsilon, exclusiveMinimum=0)
    rope_theta: float = bounded(ModelSpec.rope_theta, exclusiveMinimum=0)
    tie_embeddings: bool = ModelSpec.tie_embeddings

    def spec(self) -> ModelSpec:
        return ModelSpec(**self.model_dump())

    @model_validator(mode="after")
    def valid_spec(self) -> Model:
        """What spans fields (heads dividing the width, a sequence the model allows), as the spec checks it."""
        try:
            self.spec()
        except SpecError as e:
            raise ValueError(str(e)) from None
        return self


class Optimizer(Settings):
    """AdamW with warmup and a decay schedule (`OptimizerSpec`)."""

    learning_rate: float = bounded(OptimizerSpec.learning_rate, exclusiveMinimum=0)
    weight_decay: float = bounded(OptimizerSpec.weight_decay, minimum=0)
    warmup: float = bounded(OptimizerSpec.warmup, minimum=0)
    """Fraction of steps (or a step count if ≥ 1)."""
    lr_schedule: Literal["cosine", "linear", "constant", "inv_sqrt"] = "cosine"
    min_lr_ratio: float = bounded(OptimizerSpec.min_lr_ratio, minimum=0)

    def spec(self) -> OptimizerSpec:
        return OptimizerSpec(**self.model_dump())

    @model_validator(mode="after")
    def valid_spec(self) -> Optimizer:
        """What spans fields (heads dividing the width, a sequence the model allows), as the spec checks it."""
        try:
            self.spec()
        except SpecError as e:
            raise ValueError(str(e)) from None
        return self


class Trainer(Settings):
    """How long and how to train (`TrainerSpec`)."""

    num_train_steps: int = bounded(TrainerSpec.num_train_steps, exclusiveMinimum=0)
    train_batch_size: int = bounded(TrainerSpec.train_batch_size, exclusiveMinimum=0)
    seed: int = TrainerSpec.seed
    checkpoint_every: int = bounded(TrainerSpec.checkpoint_every, exclusiveMinimum=0)
    """A permanent checkpoint every this many steps (and always at the last)."""
    steps_per_eval: int = bounded(TrainerSpec.steps_per_eval, exclusiveMinimum=0)
    max_eval_batches: int | None = bounded(TrainerSpec.max_eval_batches, exclusiveMinimum=0)
    """Batches per evaluation during training (null: the whole validation split)."""
    mixed_precision: str = TrainerSpec.mixed_precision

    def spec(self) -> TrainerSpec:
        return TrainerSpec(**self.model_dump())

    @model_validator(mode="after")
    def valid_spec(self) -> Trainer:
        """What spans fields (heads dividing the width, a sequence the model allows), as the spec checks it."""
        try:
            self.spec()
        except SpecError as e:
            raise ValueError(str(e)) from None
        return self


class Training(Settings):
    """The run: model, optimizer and trainer."""

    model: Model = Model()
    optimizer: Optimizer = Optimizer()
    trainer: Trainer = Trainer()


# --- what the run is scored on, and the grid of a sweep ------------------------------------------------------------


class Suite(Settings):
    """A validation suite (`hf_validation_suite` / `url_validation_suite`): held-out sets every run is scored on,
    logged as `eval/{name}-{set}/loss`. Exactly one source."""

    model_config = ConfigDict(json_schema_extra=one_of("huggingface", "urls"))

    name: str = bounded(pattern=NAME_PATTERN)
    huggingface: HuggingFace | None = None
    """Its revision must be a commit sha: scores must stay comparable."""
    urls: list[str] | None = bounded(None, minItems=1)
    sets: dict[str, list[str]] = bounded(minProperties=1)
    """Set → file globs inside the download."""
    text_field: str = "text"

    @model_validator(mode="after")
    def one_source(self) -> Suite:
        exactly_one(f"validation suite {self.name!r}", {"huggingface": self.huggingface, "urls": self.urls})
        return self


class Sweep(Settings):
    """A grid (`lr_model_sweep`): one run per model × learning rate, on the same caches, each evaluated."""

    learning_rates: list[float] = bounded(minItems=1)
    models: dict[str, Model] | None = None
    """Label → model; default: the `training.model`, labelled by its family."""
