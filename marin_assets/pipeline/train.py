"""Train: Levanter `train_lm` on a weighted mixture of tokenized caches, resumable.

Checkpoints live under the output path with a run id taken from it, so materializing again
after a crash or an interruption resumes from the last checkpoint. The last step is always
checkpointed. The record holds the steps, final losses, tokens/s, the checkpoint steps and
the loss curve, read from Levanter's JSON metrics.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.identity import canonical
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.specs import (
    ModelSpec,
    OptimizerSpec,
    SpecError,
    TrainerSpec,
    check_weights,
)
from marin_assets.pipeline.tokenize import TokenizedCache, TokenizeStep

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class TrainResult:
    """What a training run made: its checkpoints, losses, throughput, and what reads them needs."""

    run_id: str
    steps: int
    final_train_loss: float | None
    final_eval_loss: float | None
    eval_losses: dict[str, float]
    """Final eval loss per validation set."""
    tokens_per_second: float | None
    checkpoint_steps: list[int]
    checkpoint_dir: str
    hf_dir: str | None
    parameter_count: int | None = None
    train_seconds: float = 0.0
    loss_curve: list[list[float]] = field(default_factory=list)
    """[step, train loss] pairs."""
    eval_curve: list[list[float]] = field(default_factory=list)
    """[step, eval loss] pairs."""
    model: ModelSpec | None = None
    """The model trained: what export and evaluation load the checkpoints as (None in records
    made before it was recorded)."""
    tokenizer: str | None = None
    """The tokenizer folder the training data was tokenized with."""

    def model_and_tokenizer(self) -> tuple[ModelSpec, str]:
        """The model spec and tokenizer folder, or an error saying the record predates them."""
        if self.model is None or self.tokenizer is None:
            raise ValueError(f"the training record of {self.run_id} has no model/tokenizer (made by an older"
                             " marin-assets); re-materialize the training step with force to record them")
        return self.model, self.tokenizer

    def checkpoint_path(self, step: int | None = None) -> str:
        """The checkpoint of `step` (default: the last)."""
        chosen = self.checkpoint_steps[-1] if step is None else step
        if chosen not in self.checkpoint_steps:
            raise ValueError(f"no checkpoint at step {chosen}; have {self.checkpoint_steps}")
        return os.path.join(self.checkpoint_dir, f"step-{chosen}")


def run_dir_of(output_path: str) -> str:
    """Where Levanter writes the checkpoints (`step-N/`) of the training run at `output_path`."""
    run_id = output_path.rstrip("/").rsplit("/", 1)[-1]
    return join_path(output_path, "checkpoints", run_id)


def list_checkpoints(run_dir: str, known: Collection[int] = ()) -> dict[int, bool]:
    """Complete checkpoints under a run folder (local or any fsspec URL) → whether temporary.

    A checkpoint counts once Levanter has written its `metadata.json`, which it does after the
    arrays are committed; a folder without it is still being written. One listing of the run
    folder, then one small read per checkpoint not in `known` — never a walk of the arrays.
    """
    fs, path = fsspec.core.url_to_fs(run_dir)
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=False)
    except FileNotFoundError:
        return {}
    found: dict[int, bool] = {}
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if not re.fullmatch(r"step-\d+", name) or int(name[5:]) in known:
            continue
        try:
            metadata = json.loads(fs.cat_file(f"{entry.rstrip('/')}/metadata.json"))
        except FileNotFoundError:
            continue
        found[int(name[5:])] = bool(metadata.get("is_temporary", False))
    return found


def checkpoint_steps(run_dir: str) -> list[int]:
    """Steps of the complete checkpoints in a run folder, temporary ones included."""
    return sorted(list_checkpoints(run_dir))


def train_lm(output_path: str, tokenizer_path: str, caches: dict[str, str], weights: dict[str, float],
             model: ModelSpec, optimizer: OptimizerSpec, trainer: TrainerSpec) -> TrainResult:
    """Train a language model with Levanter on a mixture of Levanter caches (resumes if interrupted)."""
    check_weights(weights)
    missing = set(weights) - set(caches)
    if missing:
        raise SpecError(f"mixture weights name unknown components: {sorted(missing)}")
    from levanter.main import train_lm as levanter_train

    from marin_assets.pipeline.levanter_configs import (
        JsonlMetrics,
        data_config,
        model_config,
        optimizer_config,
        restored_root_logging,
        trainer_config,
        write_reference_config,
    )
    from marin_assets.pipeline.tokenizer import load_hf_tokenizer

    remote = "://" in output_path
    if not remote:
        output_path = os.path.abspath(output_path)  # Levanter cannot delete temporary checkpoints under relative paths
    run_id = output_path.rstrip("/").rsplit("/", 1)[-1]
    run_dir = run_dir_of(output_path)
    vocab = len(load_hf_tokenizer(tokenizer_path))
    logger_name = f"marin.metrics.{run_id}"
    with tempfile.TemporaryDirectory(prefix="marin-train-") as scratch:
        # Checkpoints and the Hugging Face export go straight to the output (local or gs://);
        # Levanter's logs, the metrics file and the reference config are local files, copied
        # to a remote output afterwards.
        local = scratch if remote else output_path
        metrics_file = os.path.join(local, METRICS_FILE)
        if remote:
            _copy_if_exists(join_path(output_path, METRICS_FILE), metrics_file)  # a resumed run appends
        reference = write_reference_config(model, vocab, os.path.join(local, "reference"))
        config = levanter_train.TrainLmConfig(
            data=data_config(tokenizer_path, caches, weights),
            model=model_config(model, reference, tokenizer_path),
            trainer=trainer_config(trainer, run_id, local, logger_name, join_path(output_path, "checkpoints")),
            optimizer=optimizer_config(optimizer),
            hf_save_path=join_path(output_path, "hf"),
            hf_save_steps=10**9,  # only the forced export at the end
        )
        started = time.monotonic()
        done = checkpoint_steps(run_dir)
        if not done or done[-1] + 1 < trainer.num_train_steps:  # Levanter refuses to re-run a finished run
            with restored_root_logging(), JsonlMetrics(logger_name, metrics_file):
                levanter_train.main(config)
        if remote:
            fs, path = fsspec.core.url_to_fs(output_path)
            fs.put(metrics_file, f"{path}/{METRICS_FILE}")
            fs.put(os.path.join(local, "reference"), f"{path}/reference", recursive=True)
        result = summarize(output_path, run_id, trainer, time.monotonic() - started, metrics_file)
        return replace(result, model=model, tokenizer=tokenizer_path)


def _copy_if_exists(url: str, local_path: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.get(path, local_path)


def summarize(output_path: str, run_id: str, trainer: TrainerSpec, seconds: float,
              metrics_file: str | None = None) -> TrainResult:
    """The `TrainResult` of a run, read from its metrics file and checkpoint folder."""
    from marin_assets.pipeline.levanter_configs import SUMMARY_STEP, read_metrics

    metrics = read_metrics(metrics_file or os.path.join(output_path, METRICS_FILE))
    params = metrics.pop(SUMMARY_STEP, {}).get("parameter_count")
    train = [[s, m["train/loss"]] for s, m in sorted(metrics.items()) if "train/loss" in m]
    evals = [[s, m["eval/loss"]] for s, m in sorted(metrics.items()) if "eval/loss" in m]
    last_eval = next((m for _, m in sorted(metrics.items(), reverse=True) if "eval/loss" in m), {})
    per_set = {k.split("/")[1]: v for k, v in last_eval.items()
               if k.startswith("eval/") and k.endswith("/loss") and k.count("/") == 2}
    throughput = [m["throughput/tokens_per_second"] for m in metrics.values() if "throughput/tokens_per_second" in m]
    hf_root = join_path(output_path, "hf", run_id)
    fs, hf_path = fsspec.core.url_to_fs(hf_root)
    fs.invalidate_cache(hf_path)
    hf_steps = sorted(int(p.rstrip("/").rsplit("-", 1)[1]) for p in fs.ls(hf_path, detail=False)
                      if p.rstrip("/").rsplit("/", 1)[-1].startswith("step-")) if fs.isdir(hf_path) else []
    run_dir = run_dir_of(output_path)
    return TrainResult(
        run_id=run_id, steps=trainer.num_train_steps,
        final_train_loss=train[-1][1] if train else None, final_eval_loss=last_eval.get("eval/loss"),
        eval_losses=per_set,
        tokens_per_second=round(sorted(throughput)[len(throughput) // 2], 1) if throughput else None,
        checkpoint_steps=checkpoint_steps(run_dir), checkpoint_dir=run_dir,
        hf_dir=join_path(hf_root, f"step-{hf_steps[-1]}") if hf_steps else None,
        parameter_count=params, train_seconds=round(seconds, 2), loss_curve=train, eval_curve=evals,
    )


def loss_fell(output_path: str, result: dict) -> CheckOutcome:
    """Every logged training loss is finite and the last is below the first."""
    curve = result.get("loss_curve") or []
    losses = [loss for _, loss in curve]
    if len(losses) < 2:
        return CheckOutcome(False, f"only {len(losses)} training loss value(s) logged")
    bad = [step for step, loss in curve if not math.isfinite(loss)]
    if bad:
        return CheckOutcome(False, f"non-finite loss at steps {bad[:10]}", {"non_finite": len(bad)})
    fell = losses[-1] < losses[0]
    return CheckOutcome(fell, f"loss {losses[0]:.4g} → {losses[-1]:.4g}" + ("" if fell else " (did not fall)"),
                        {"first_loss": losses[0], "last_loss": losses[-1]})


LOSS_FELL = Check("loss_finite_and_fell", loss_fell, "Training loss is finite at every logged step and fell.")


@dataclass(frozen=True, eq=False)
class TrainStep(Step):
    """A training step that says, at definition time, what reading its checkpoints needs — so
    per-checkpoint evaluation can start while training runs, before its record exists."""

    model: ModelSpec = field(kw_only=True)
    """The model being trained."""

    def tokenizer_path(self) -> str:
        """The tokenizer folder of its caches (read from the first cache's record; they share one)."""
        return load_result(self.deps[0], TokenizedCache).tokenizer

    def checkpoint_path(self, step: int) -> str:
        """The folder of checkpoint `step` under the current prefix."""
        return join_path(run_dir_of(self.output_path), f"step-{step}")


def train_step(name: str, train: dict[str, Step], model: ModelSpec = ModelSpec(),
               optimizer: OptimizerSpec = OptimizerSpec(), trainer: TrainerSpec = TrainerSpec(),
               weights: dict[str, float] | None = None, validation: dict[str, Step] | None = None,
               cpu: float = 1, tpu_type: str | None = None) -> TrainStep:
    """A training step on a mixture: `train` components (default weight 1), `validation` ones weight 0.

    Mixing caches of different tokenizers is an error here when the caches are `TokenizeStep`s
    (which know their tokenizer step), and when the run starts otherwise (their fingerprints)."""
    weights = dict(weights or {k: 1.0 for k in train})
    components = {**train, **(validation or {})}
    for k in validation or {}:
        weights.setdefault(k, 0.0)
    try:
        check_weights(weights)
    except SpecError as e:
        raise StepDefinitionError(f"step {name!r}: {e}") from None
    unknown = set(weights) - set(components)
    if unknown:
        raise StepDefinitionError(f"step {name!r}: weights for unknown components {sorted(unknown)}")
    tokenizers = {k: s.tokenizer.name_with_hash for k, s in components.items() if isinstance(s, TokenizeStep)}
    if len(set(tokenizers.values())) > 1:
        described = dict(sorted(tokenizers.items()))
        raise StepDefinitionError(f"step {name!r}: the mixture mixes tokenizers: {described}")
    names = sorted(components)

    def run(out: str) -> TrainResult:
        results = {k: load_result(components[k], TokenizedCache) for k in names}
        fingerprints = {r.tokenizer_fingerprint for r in results.values()}
        if len(fingerprints) > 1:
            raise SpecError(f"the mixture's caches were built with different tokenizers: {fingerprints}")
        first = results[names[0]]
        return train_lm(out, first.tokenizer, {k: r.path for k, r in results.items()}, weights,
                        model, optimizer, trainer)

    return TrainStep(
        name=name,
        fn=run,
        deps=[components[k] for k in names],
        hash_attrs={"weights": canonical(weights), "model": model, "optimizer": optimizer, "trainer": trainer},
        resources=Resources(cpu=cpu, tpu_type=tpu_type),
        kind="train",
        description=made_by(train_lm),
        kinds=["levanter", "jax"],
        checks=[LOSS_FELL],
        model=model,
    )
