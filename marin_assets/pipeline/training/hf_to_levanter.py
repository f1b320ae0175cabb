"""A Hugging Face model converted into a Levanter checkpoint: the form Levanter's trainer, `from_checkpoint` and
evaluation read natively (tensorstore arrays, sharded on load), rather than converting the safetensors again on
every run that starts from them.

The conversion is Levanter's own (`levanter.main.export_hf_to_lm`, the inverse of the export our `export_step`
runs), with the model built from our `ModelSpec` — the one every later reader builds — so the checkpoint's
arrays are exactly what those readers expect. The weights keep their dtype unless `dtype` is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.training.export import ExportStep
from marin_assets.pipeline.training.hf_model import (
    HfModel,
    HfModelError,
    has_tokenizer,
    model_spec_of,
    safetensors_summary,
)
from marin_assets.pipeline.training.specs import ModelSpec
from marin_assets.pipeline.training.training_run import TrainStep

CHECKPOINT_DIR = "step-0"
"""The checkpoint under the step's output: a run's checkpoints are `step-N` folders too."""
DTYPES = ("float32", "bfloat16", "float16")
"""What the weights may be converted to (None keeps the safetensors' own dtype)."""


@record_type("levanter_checkpoint")
@dataclass(frozen=True)
class LevanterCheckpoint:
    """A Levanter checkpoint converted from a Hugging Face model folder, and what reading it needs."""

    checkpoint: str
    """The checkpoint folder (`…/step-0`): the model under `model/`, as a training run saves it."""
    source: str
    """The Hugging Face model folder it was converted from."""
    source_commit: str | None
    """The Hub commit of that folder, when it came from `hf_model_step`; None for another folder."""
    model: ModelSpec
    """The model the checkpoint holds: what `from_checkpoint` and evaluation build to read it."""
    tokenizer: str
    """The tokenizer folder (the Hugging Face folder's own tokenizer)."""
    vocab_size: int
    """Rows of the embedding (`config.json`'s `vocab_size`)."""
    parameters: int
    """Elements of the source's weight tensors."""
    dtype: str | None
    """The dtype the weights were converted to; None: as stored (see `source_dtypes`)."""
    source_dtypes: list[str]
    """The safetensors dtypes of the source weights."""

    def model_and_tokenizer(self) -> tuple[ModelSpec, str]:
        """The model spec and tokenizer folder: what evaluating the checkpoint needs."""
        return self.model, self.tokenizer

    def checkpoint_path(self, step: int | None = None) -> str:
        """The checkpoint (there is one, step 0)."""
        if step not in (None, 0):
            raise ValueError(f"no checkpoint at step {step}; a converted model has one, step 0")
        return self.checkpoint


def convert_hf_to_levanter(output_path: str, hf_folder: str, model: ModelSpec | None = None,
                           dtype: str | None = None, source_commit: str | None = None) -> LevanterCheckpoint:
    """Convert a Hugging Face Llama or GPT-2 folder (config, safetensors, tokenizer) into a Levanter checkpoint
    at `output_path/step-0`, through Levanter's own converter.

    `model`: the `ModelSpec` to build (None: the one `config.json` describes); it must fit the config.
    `dtype`: `float32`, `bfloat16` or `float16` to convert the weights to; None keeps their own."""
    from marin_assets.pipeline.training.hf_folder import read_hf_config

    config = read_hf_config(hf_folder)
    spec = model or model_spec_of(config)
    problems = spec.hf_differences(config)
    if problems:
        raise HfModelError(f"the model given does not fit {hf_folder}: " + "; ".join(problems))
    fs, root = fsspec.core.url_to_fs(hf_folder)
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root.rstrip("/"), detail=False)]
    if not has_tokenizer(names):
        raise HfModelError(f"{hf_folder} has no tokenizer files (tokenizer.json, tokenizer.model …): the checkpoint"
                           " would not say how its ids are made")
    parameters, dtypes = safetensors_summary(hf_folder)
    checkpoint = join_path(output_path, CHECKPOINT_DIR)
    out_fs, target = fsspec.core.url_to_fs(checkpoint)
    if out_fs.exists(target):  # arrays of an attempt that died before its completion marker (we hold the lease)
        out_fs.rm(target, recursive=True)
    with s3_arrays([hf_folder, output_path]):
        _levanter_import(hf_folder, checkpoint, spec, dtype)
    return LevanterCheckpoint(checkpoint=checkpoint, source=hf_folder, source_commit=source_commit, model=spec,
                              tokenizer=hf_folder, vocab_size=int(config["vocab_size"]), parameters=parameters,
                              dtype=dtype, source_dtypes=dtypes)


def _levanter_import(hf_folder: str, checkpoint: str, model: ModelSpec, dtype: str | None) -> None:
    """Levanter's HF → Levanter converter (public: `levanter.main.export_hf_to_lm`), the model saved under
    `model/` as a training run's checkpoint holds it (what `initialize_model_from_checkpoint_path` and
    `eval_lm` read)."""
    from levanter.main.export_hf_to_lm import ImportHfConfig, main

    from marin_assets.pipeline.training.levanter_model import model_config
    from marin_assets.pipeline.training.levanter_trainer import restored_root_logging

    with restored_root_logging():
        main(ImportHfConfig(hf_checkpoint=hf_folder, output_path=checkpoint,
                            model=model_config(model, reference=hf_folder, tokenizer=hf_folder),
                            use_hf_model_config=False, tokenizer=hf_folder, dtype=dtype, subpath="model"))


def checkpoint_complete(output_path: str, result: dict) -> CheckOutcome:
    """The checkpoint has Levanter's completion marker (`metadata.json`, written after every array)."""
    fs, path = fsspec.core.url_to_fs(join_path(result.get("checkpoint") or output_path, "metadata.json"))
    fs.invalidate_cache()
    done = fs.exists(path)
    where = result.get("checkpoint")
    return CheckOutcome(done, "the checkpoint is complete" if done else f"no metadata.json at {where}")


CHECKPOINT_COMPLETE = Check("checkpoint_complete", checkpoint_complete,
                            "The converted checkpoint carries Levanter's completion marker.")


@dataclass(frozen=True, eq=False)
class HfToLevanterStep(Step):
    """A Levanter checkpoint converted from a Hugging Face model: `from_checkpoint(step)` starts a run from it."""

    source: Step = field(kw_only=True)
    """The step whose output is the Hugging Face folder (`hf_model_step`, an export step)."""
    model: ModelSpec | None = field(default=None, kw_only=True)
    """The model, where known when steps are defined (given, or the trained model an export step exports);
    None: read from `config.json` when converting."""


def hf_to_levanter_step(name: str, hf_model: Step, model: ModelSpec | None = None,
                        dtype: str | None = None) -> HfToLevanterStep:
    """A Levanter checkpoint of the Hugging Face model `hf_model` makes (`hf_model_step`, `export_step`), for
    `from_checkpoint` and evaluation. `model`: None takes `config.json`'s (an export step's: its run's model).

    Identity: `model`, `dtype` (and `hf_model`).
    """
    if isinstance(hf_model, TrainStep):
        raise StepDefinitionError(f"step {name!r}: {hf_model.name} is a training step, whose checkpoints are"
                                  " Levanter's already: use from_checkpoint() on it")
    if not isinstance(hf_model, Step):
        raise StepDefinitionError(f"step {name!r}: converts {hf_model!r}, which is not a step (hf_model_step,"
                                  " export_step)")
    if dtype not in (None, *DTYPES):
        raise StepDefinitionError(f"step {name!r}: dtype must be one of {DTYPES} or None (as stored), got {dtype!r}")
    if model is None and isinstance(hf_model, ExportStep) and isinstance(hf_model.exports, TrainStep):
        model = hf_model.exports.model

    def run(out: str) -> LevanterCheckpoint:
        made: Any = load_result(hf_model)  # the type it recorded: an HfModel names the Hub commit
        commit = made.commit if isinstance(made, HfModel) else None
        return convert_hf_to_levanter(out, hf_model.output_path, model, dtype, commit)

    return HfToLevanterStep(name=name, fn=run, deps=[hf_model], hash_attrs={"model": model, "dtype": dtype},
                            kind="convert", description=made_by(convert_hf_to_levanter),
                            kinds=["huggingface", "levanter"], checks=[CHECKPOINT_COMPLETE], source=hf_model,
                            model=model)


__all__ = ["CHECKPOINT_DIR", "HfToLevanterStep", "LevanterCheckpoint", "convert_hf_to_levanter",
           "hf_to_levanter_step"]
