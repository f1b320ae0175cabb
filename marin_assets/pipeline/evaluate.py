"""Export a checkpoint to Hugging Face format, and evaluate a checkpoint on validation caches.

Both read the training step's record to find its checkpoints, so any checkpoint (not only
the last) can be exported or evaluated: the automation builds per-checkpoint evaluation on
`evaluate_step(..., checkpoint_step=N)`.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import open_file
from marin_assets.core.identity import identity_hash
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.step import Resources, Step, made_by
from marin_assets.pipeline.specs import ModelSpec, TrainerSpec
from marin_assets.pipeline.tokenize import TokenizedCache
from marin_assets.pipeline.tokenizer import model_vocab_size
from marin_assets.pipeline.train import TrainResult, TrainStep, platform_for


@dataclass(frozen=True)
class ExportResult:
    """A Hugging Face model folder made from one checkpoint."""

    path: str
    checkpoint: str
    step: int


@dataclass(frozen=True)
class EvalResult:
    """Loss and bits per byte of one checkpoint, overall and per validation set."""

    checkpoint: str
    step: int | None
    loss: float
    bpb: float | None
    per_dataset: dict[str, dict[str, float]]
    """Validation set → {"loss": …, "bpb": …}."""
    seconds: float


def _step_of(checkpoint: str) -> int | None:
    name = checkpoint.rstrip("/").rsplit("/", 1)[-1]
    return int(name.split("-", 1)[1]) if name.startswith("step-") else None


def export_hf(output_path: str, checkpoint: str, model: ModelSpec, tokenizer_path: str,
              vocab_size: int | None = None) -> ExportResult:
    """Convert a Levanter checkpoint to a Hugging Face model folder (config, safetensors, tokenizer).

    `vocab_size`: rows of the model's embedding (None: the tokenizer's largest id + 1, rounded up to
    `model.vocab_multiple`, as a fresh training run sizes it)."""
    from marin_assets.pipeline.levanter_configs import export_checkpoint

    if not _exists(join_path(checkpoint, "metadata.json")):
        raise FileNotFoundError(f"no complete checkpoint at {checkpoint}")
    export_checkpoint(checkpoint, output_path, model, tokenizer_path,
                      vocab_size or model_vocab_size(tokenizer_path, model.vocab_multiple))
    return ExportResult(output_path, checkpoint, _step_of(checkpoint) or 0)


def evaluate_lm(output_path: str, checkpoint: str, model: ModelSpec, tokenizer_path: str, caches: dict[str, str],
                max_eval_batches: int | None = None, batch_size: int = 16,
                vocab_size: int | None = None, platform: str | None = None) -> EvalResult:
    """Loss and bits per byte of a Levanter checkpoint (or HF folder) on each validation cache.

    `vocab_size`: rows of the model's embedding (None: as a fresh training run sizes it). Ids the
    tokenizer has no token for (id gaps, rows a rounded-up vocabulary adds) count as zero bytes.
    `platform`: the JAX platform to run on (`cuda`; None: JAX's choice under `JAX_PLATFORMS`).
    """
    import json

    from marin_assets.pipeline.levanter_configs import use_platform

    use_platform(platform, f"evaluation at {output_path}")  # before Levanter starts JAX
    from levanter.main import eval_lm

    from marin_assets.pipeline.levanter_configs import (
        JsonlMetrics,
        data_config,
        model_config,
        read_metrics,
        restored_root_logging,
        trainer_config,
        write_reference_config,
    )

    is_hf = is_hf_model(checkpoint)
    run_id = f"eval-{output_path.rstrip('/').rsplit('/', 1)[-1]}"
    vocab = vocab_size or model_vocab_size(tokenizer_path, model.vocab_multiple)
    logger_name = f"marin.metrics.{run_id}"
    with tempfile.TemporaryDirectory(prefix="marin-eval-") as scratch:
        # Levanter's logs, the metrics and the reference config are local; the results are
        # written to the output (local or a URL) at the end. A retry measures from scratch.
        reference = write_reference_config(model, vocab, os.path.join(scratch, "reference"))
        metrics_file = os.path.join(scratch, "metrics.jsonl")
        spec = TrainerSpec(num_train_steps=1, train_batch_size=batch_size, max_eval_batches=max_eval_batches)
        config = eval_lm.EvalLmConfig(
            checkpoint_path=None if is_hf else checkpoint, hf_checkpoint=checkpoint if is_hf else None,
            trainer=trainer_config(spec, run_id, scratch, logger_name,
                                   require_accelerator=platform not in (None, "cpu")),
            data=data_config(tokenizer_path, caches, {k: 0.0 for k in caches} | {next(iter(caches)): 1.0},
                             vocab_size=vocab),
            model=model_config(model, reference, tokenizer_path),
        )
        started = time.monotonic()
        with restored_root_logging(), JsonlMetrics(logger_name, metrics_file):
            eval_lm.main(config)
        logged: dict = {}
        for values in read_metrics(metrics_file).values():
            logged.update(values)
        if "eval/loss" not in logged:
            raise RuntimeError(f"evaluation of {checkpoint} logged no eval/loss")
        per_dataset = {name: {"loss": logged[f"eval/{name}/loss"], "bpb": logged.get(f"eval/{name}/bpb")}
                       for name in caches if f"eval/{name}/loss" in logged}
        result = EvalResult(checkpoint, _step_of(checkpoint), logged["eval/loss"], logged.get("eval/bpb"),
                            per_dataset, round(time.monotonic() - started, 2))
        with open_file(join_path(output_path, "metrics.jsonl"), "wb") as out, open(metrics_file, "rb") as src:
            out.write(src.read())
    with open_file(join_path(output_path, "results.json"), "w") as f:
        json.dump(result.__dict__, f, indent=2)
    return result


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


def every_set_evaluated(names: list[str]) -> Check:
    """The check that every validation set got a finite loss."""
    def check(output_path: str, result: dict) -> CheckOutcome:
        values = {n: (result.get("per_dataset") or {}).get(n, {}).get("loss") for n in names}
        missing = [n for n, v in values.items() if not isinstance(v, (int, float)) or not math.isfinite(v)]
        if missing:
            return CheckOutcome(False, f"no finite loss for {', '.join(missing)}")
        return CheckOutcome(True, ", ".join(f"{n}: {v:.4g}" for n, v in values.items()),
                            {f"{n}_loss": v for n, v in values.items()})

    return Check("every_set_evaluated", check, f"A finite loss for every validation set ({', '.join(names)}).")


def export_step(name: str, train: Step, checkpoint_step: int | None = None) -> Step:
    """A Hugging Face export of a checkpoint (default: the last) of a training step (its result is a `TrainResult`)."""
    def run(out: str) -> ExportResult:
        result = load_result(train, TrainResult)
        model, tokenizer = result.model_and_tokenizer()
        return export_hf(out, result.checkpoint_path(checkpoint_step), model, tokenizer, result.vocab_size)

    return Step(name=name, fn=run, deps=[train], hash_attrs={"checkpoint_step": checkpoint_step}, kind="export",
                description=made_by(export_hf), kinds=["levanter", "huggingface"])


def evaluate_step(name: str, train: Step, validation: dict[str, Step], checkpoint_step: int | None = None,
                  max_eval_batches: int | None = None, gpu: float = 0, gpu_type: str | None = None) -> Step:
    """Loss and bits per byte of a checkpoint (default: the last) of a training step on each validation cache
    (on `gpu` CUDA GPUs when asked)."""
    names = sorted(validation)
    resources = Resources(cpu=1, gpu=gpu, gpu_type=gpu_type)

    def run(out: str) -> EvalResult:
        result = load_result(train, TrainResult)
        model, tokenizer = result.model_and_tokenizer()
        caches = {k: load_result(validation[k], TokenizedCache).path for k in names}
        return evaluate_lm(out, result.checkpoint_path(checkpoint_step), model, tokenizer, caches, max_eval_batches,
                           vocab_size=result.vocab_size, platform=platform_for(resources))

    return Step(name=name, fn=run, deps=[train] + [validation[k] for k in names],
                hash_attrs={"checkpoint_step": checkpoint_step, "max_eval_batches": max_eval_batches,
                            "validation": names},
                resources=resources, kind="eval", description=made_by(evaluate_lm),
                kinds=["levanter", "jax"], checks=[every_set_evaluated(names)])


def checkpoint_eval_step(name: str, train: TrainStep, validation: Mapping[str, Step], checkpoint_step: int,
                         max_eval_batches: int | None = None) -> Step:
    """Evaluate checkpoint `checkpoint_step` of `train` as soon as it is complete, while training goes on.

    The training step is not a dependency — its record exists only once training ends — so
    its identity enters `hash_attrs` instead: a different training run is a different output.
    The model and tokenizer come from the typed `TrainStep`, not from its record.
    """
    names = sorted(validation)

    def run(out: str) -> EvalResult:
        caches = {k: load_result(validation[k], TokenizedCache).path for k in names}
        return evaluate_lm(out, train.checkpoint_path(checkpoint_step), train.model, train.tokenizer_path(),
                           caches, max_eval_batches, vocab_size=train.vocab_size())

    return Step(name=name, fn=run, deps=[validation[k] for k in names],
                hash_attrs={"checkpoint_of": train.name_with_hash, "checkpoint_step": checkpoint_step,
                            "max_eval_batches": max_eval_batches, "validation": names},
                resources=Resources(cpu=1), kind="eval", description=made_by(checkpoint_eval_step),
                kinds=["levanter", "jax"], checks=[every_set_evaluated(names)])


@dataclass(frozen=True)
class CheckpointEvals:
    """Evaluate each checkpoint of `train` on `validation` as it lands: one step per checkpoint,
    served as one partitioned asset (`marin_assets.dagster.checkpoint_evals`)."""

    name: str
    """Asset name (`evals/tiny-llama-checkpoints`); checkpoint N's output is `{name}/step-N_{hash}`."""
    train: TrainStep
    """The training step whose checkpoints are evaluated."""
    validation: Mapping[str, Step]
    """Validation set name → tokenized cache step."""
    max_eval_batches: int | None = None
    """Batches per validation set; None for all of it."""

    @property
    def hash(self) -> str:
        """Identity of the evaluation setup (each checkpoint adds its step)."""
        return identity_hash(self.name, {"checkpoint_of": self.train.name_with_hash,
                                         "max_eval_batches": self.max_eval_batches,
                                         "validation": sorted(self.validation)},
                             sorted(v.name_with_hash for v in self.validation.values()))

    @property
    def deps(self) -> list[Step]:
        """Upstream assets besides the training step: the validation caches."""
        return [self.validation[k] for k in sorted(self.validation)]

    @property
    def description(self) -> str:
        """What the partitioned asset shows."""
        return (f"Loss and bits per byte of every checkpoint of `{self.train.name}` on"
                f" {', '.join(sorted(self.validation))}, one partition per checkpoint step, added by the"
                " checkpoint sensor as each lands. Made by `marin_assets.pipeline.evaluate.evaluate_lm`.")

    def step(self, checkpoint: int) -> Step:
        """The evaluation of checkpoint step `checkpoint`."""
        return checkpoint_eval_step(f"{self.name}/step-{checkpoint}", self.train, self.validation, checkpoint,
                                    self.max_eval_batches)

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """A partition's numbers (Dagster plots them across partitions): loss, and bits per byte if measured."""
        return {"loss": result["loss"], **({"bpb": result["bpb"]} if result.get("bpb") is not None else {})}

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """A checkpoint's row of the all-checkpoints table: loss and bits per byte, overall and per set."""
        row = {"loss": result["loss"], "bpb": result.get("bpb")}
        for name in sorted(self.validation):
            for metric in ("loss", "bpb"):
                row[f"{name}/{metric}"] = result["per_dataset"].get(name, {}).get(metric)
        return row

    def columns(self) -> list[str]:
        """The all-checkpoints table's columns after `step`."""
        return ["loss", "bpb"] + [f"{n}/{m}" for n in sorted(self.validation) for m in ("loss", "bpb")]


class PerCheckpointEvals(Protocol):
    """What the per-checkpoint asset and sensor need of an evaluation family (`CheckpointEvals`,
    `harness.HarnessCheckpointEvals`): one step per checkpoint of `train`, and how to show its results."""

    @property
    def name(self) -> str:
        """Asset name; checkpoint N's step is `{name}/step-N`."""

    @property
    def train(self) -> TrainStep:
        """The training step whose checkpoints are evaluated."""

    @property
    def hash(self) -> str:
        """Identity of the family: the asset's code version."""

    @property
    def deps(self) -> list[Step]:
        """Upstream assets besides the training step."""

    @property
    def description(self) -> str:
        """The asset's description."""

    def step(self, checkpoint: int) -> Step:
        """The evaluation of checkpoint step `checkpoint`."""

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """A partition's numbers, from its step's result (JSON)."""

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """A checkpoint's row of the all-checkpoints table (after `step`)."""

    def columns(self) -> list[str]:
        """The all-checkpoints table's columns (after `step`), all floats."""
