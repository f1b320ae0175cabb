"""The loss kind of evaluation: loss and bits per byte of a checkpoint on validation caches, as a final
step (`loss_eval_step`) or on every checkpoint as it lands (`loss_checkpoint_evals`).

`evaluate_step` is `loss_eval_step`'s name before 0.2.0 (beside the generic `eval_step` it read as the generic
one): it still works for one release, warning."""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import open_file
from marin_assets.core.hosts import writes_own_files
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.record_types import record_type
from marin_assets.core.renames import renamed
from marin_assets.core.step import Step
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep, eval_step
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.tokens.tokenize import TokenizedCache
from marin_assets.pipeline.tokens.tokenizer import model_vocab_size
from marin_assets.pipeline.training.export import checkpoint_step_of, is_hf_model
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainStep


@record_type("loss_eval_result")
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


def evaluate_lm(output_path: str, checkpoint: str, model: ModelSpec, tokenizer_path: str, caches: dict[str, str],
                max_eval_batches: int | None = None, batch_size: int = 16,
                vocab_size: int | None = None, platform: str | None = None) -> EvalResult:
    """Loss and bits per byte of a Levanter checkpoint (or HF folder) on each validation cache.

    `vocab_size`: rows of the model's embedding (None: as a fresh training run sizes it). Ids the
    tokenizer has no token for (id gaps, rows a rounded-up vocabulary adds) count as zero bytes.
    `platform`: the JAX platform to run on (`cuda`; None: JAX's choice under `JAX_PLATFORMS`). On several hosts
    (the step's `hosts`) each host evaluates its share of every batch as one JAX program; host 0 writes the output.
    """
    import json
    with s3_arrays([checkpoint, output_path, *caches.values()]):

        from marin_assets.pipeline.training.levanter_trainer import join_hosts, use_platform

        place = join_hosts(f"evaluation at {output_path}")  # before JAX starts a backend
        lead = writes_own_files(place)
        use_platform(platform, f"evaluation at {output_path}")  # before Levanter starts JAX
        from levanter.main import eval_lm

        from marin_assets.pipeline.training.levanter_data import data_config
        from marin_assets.pipeline.training.levanter_model import model_config, write_reference_config
        from marin_assets.pipeline.training.levanter_trainer import (
            JsonlMetrics,
            read_metrics,
            restored_root_logging,
            trainer_config,
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
                max_eval_length=model.seq_len,  # Levanter's default is 2048 tokens: windows as training's
            )
            started = time.monotonic()
            with restored_root_logging(), JsonlMetrics(logger_name, metrics_file):
                eval_lm.main(config)
            logged: dict = {}
            for values in read_metrics(metrics_file).values():
                logged.update(values)
            if not lead:  # Levanter's trackers log on host 0 only; its result is the step's record
                return EvalResult(checkpoint, checkpoint_step_of(checkpoint), math.nan, None, {},
                                  round(time.monotonic() - started, 2))
            if "eval/loss" not in logged:
                raise RuntimeError(f"evaluation of {checkpoint} logged no eval/loss")
            per_dataset = {name: {"loss": logged[f"eval/{name}/loss"], "bpb": logged.get(f"eval/{name}/bpb")}
                           for name in caches if f"eval/{name}/loss" in logged}
            result = EvalResult(checkpoint, checkpoint_step_of(checkpoint), logged["eval/loss"], logged.get("eval/bpb"),
                                per_dataset, round(time.monotonic() - started, 2))
            if lead:
                with open_file(join_path(output_path, "metrics.jsonl"), "wb") as out, open(metrics_file, "rb") as src:
                    out.write(src.read())
        if lead:
            with open_file(join_path(output_path, "results.json"), "w") as f:
                json.dump(result.__dict__, f, indent=2)
        return result


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


@dataclass(frozen=True)
class LossEval:
    """The loss kind: loss and bits per byte of a checkpoint on each validation cache."""

    validation: Mapping[str, Step]
    """Validation set name → tokenized cache step."""
    max_eval_batches: int | None = None
    """Batches per validation set; None for all of it."""
    tags: ClassVar[tuple[str, ...]] = ("levanter", "jax")
    function: ClassVar[Callable[..., Any]] = staticmethod(evaluate_lm)
    spans_hosts: ClassVar[bool] = True
    """Levanter's evaluation loop on every host's share of each batch; host 0 writes."""

    def identity(self) -> dict[str, Any]:
        return {"max_eval_batches": self.max_eval_batches, "validation": sorted(self.validation)}

    @property
    def deps(self) -> list[Step]:
        return [self.validation[k] for k in sorted(self.validation)]

    def summary(self) -> str:
        return f"loss and bits per byte on {', '.join(sorted(self.validation))}"

    def evaluate(self, output_path: str, checkpoint: Checkpoint) -> EvalResult:
        caches = {k: load_result(self.validation[k], TokenizedCache).path for k in sorted(self.validation)}
        return evaluate_lm(output_path, checkpoint.path, checkpoint.model, checkpoint.tokenizer_path, caches,
                           self.max_eval_batches, vocab_size=checkpoint.vocab_size, platform=checkpoint.platform)

    def checks(self) -> list[Check]:
        return [every_set_evaluated(sorted(self.validation))]

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """Loss, and bits per byte if measured."""
        return {"loss": result["loss"], **({"bpb": result["bpb"]} if result.get("bpb") is not None else {})}

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """Loss and bits per byte, overall and per set."""
        row = {"loss": result["loss"], "bpb": result.get("bpb")}
        for name in sorted(self.validation):
            for metric in ("loss", "bpb"):
                row[f"{name}/{metric}"] = result["per_dataset"].get(name, {}).get(metric)
        return row

    def columns(self) -> list[str]:
        return ["loss", "bpb"] + [f"{n}/{m}" for n in sorted(self.validation) for m in ("loss", "bpb")]

    def summary_columns(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """The evaluated checkpoint's loss and bits per byte (beside the run's own last eval loss)."""
        return {"evaluated_loss": result["loss"], "evaluated_bpb": result.get("bpb")}


def loss_eval_step(name: str, train: Step, validation: dict[str, Step], checkpoint_step: int | None = None,
                   max_eval_batches: int | None = None, gpu: float = 0, gpu_type: str | None = None,
                   hosts: int = 1) -> EvalStep:
    """Loss and bits per byte of a checkpoint (default: the last) of a training step on each validation cache
    (on `gpu` CUDA GPUs when asked; on `hosts` hosts as one JAX program, each scoring its share of every batch).

    Identity: `validation`, `max_eval_batches`, `checkpoint_step` (and `train`); not `gpu`, `gpu_type` nor `hosts`.
    """
    return eval_step(name, LossEval(validation, max_eval_batches), train, checkpoint_step, gpu=gpu,
                     gpu_type=gpu_type, hosts=hosts)


evaluate_step = renamed(loss_eval_step, "evaluate_step", __name__)
"""`loss_eval_step`'s name before 0.2.0; goes in 0.3.0."""


def loss_checkpoint_evals(name: str, train: TrainStep, validation: Mapping[str, Step],
                          max_eval_batches: int | None = None, *, hosts: int = 1) -> CheckpointEvals:
    """Loss and bits per byte of every checkpoint of `train` on `validation`, as each lands (each on `hosts` hosts).

    Identity: each checkpoint's step's: `validation`, `max_eval_batches`, the checkpoint (and `train`); not `hosts`.
    """
    return CheckpointEvals(name, train, LossEval(validation, max_eval_batches), hosts=hosts)
