"""Train: Levanter `train_lm` on a weighted mixture of tokenized caches, resumable.

Checkpoints live under the output path with a run id taken from it, so materializing again
after a crash or an interruption resumes from the last checkpoint. The last step is always
checkpointed. The record holds the steps, final losses, tokens/s, the checkpoint steps and
the loss curve, read from Levanter's JSON metrics.

A run starts from random weights, from a Hugging Face model folder, or from a checkpoint of
another training step (`from_hf`, `from_checkpoint`); its mixture weights may change in
stages; a `TokenBudget` stops it after N tokens or limits it to the first N tokens of a
component. Before any compute, a step checks that every component it trains on can fill a
batch and that all were tokenized alike. `Resources(gpu=N)` trains on CUDA.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import atomic_write
from marin_assets.core.identity import canonical
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.run_cost import RunCost
from marin_assets.pipeline.specs import (
    ModelSpec,
    OptimizerSpec,
    SpecError,
    Stages,
    TokenBudget,
    TrainerSpec,
    as_stages,
    check_stages,
    mixture_block_size,
)
from marin_assets.pipeline.tokenize import TokenizedCache, TokenizeStep, tokenizer_fingerprint
from marin_assets.pipeline.tracking import TENSORBOARD_DIR, WANDB_DIR, Tracking, TrackingResult

METRICS_FILE = "metrics.jsonl"
Weights = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]
"""Mixture weights: constant (component → weight), or staged ((start step, weights) pairs)."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack")


class TrainDataError(ValueError):
    """The data of a training step cannot make the run: too little of it, or tokenized differently."""


class TrainSourceError(ValueError):
    """The weights a run should start from are missing, or do not fit its model or tokenizer."""


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
    vocab_size: int | None = None
    """Rows of the model's embedding (None in records made before it was recorded: the tokenizer's size)."""
    train_tokens: int | None = None
    """Tokens the run trains on: steps × train_batch_size × seq_len."""
    initialized_from: str | None = None
    """The Hugging Face folder or Levanter checkpoint the first weights came from; None: random."""
    final_eval_bpb: float | None = None
    """Bits per byte over the validation sets at the last evaluation, as Levanter logged it."""
    cost: RunCost | None = None
    """Parameters, FLOPs, tokens/s, MFU and device-hours (None in records made before it was recorded)."""
    tracking: TrackingResult | None = None
    """Where W&B and TensorBoard logged the run (None: only the JSON metrics file)."""

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
        except ValueError:  # Levanter is writing it (not atomically): still being written
            continue
        found[int(name[5:])] = bool(metadata.get("is_temporary", False))
    return found


def checkpoint_steps(run_dir: str) -> list[int]:
    """Steps of the complete checkpoints in a run folder, temporary ones included."""
    return sorted(list_checkpoints(run_dir))


@dataclass(frozen=True)
class InitWeights:
    """The weights a run starts from, as a place and a size: what `train_lm` takes."""

    path: str
    """A Hugging Face model folder (`config.json` and weights), or a Levanter checkpoint (`…/step-N`)."""
    vocab_size: int
    """Rows of its embedding: the continued model keeps them (the tokenizer's ids must fit)."""
    model: ModelSpec | None = None
    """The model a Levanter checkpoint holds (needed to read it); None for a Hugging Face folder."""


def read_hf_config(folder: str) -> dict[str, Any]:
    """The `config.json` of a Hugging Face model folder (local or URL); `TrainSourceError` if there is none."""
    fs, path = fsspec.core.url_to_fs(folder)
    try:
        config: dict[str, Any] = json.loads(fs.cat_file(f"{path.rstrip('/')}/config.json"))
    except FileNotFoundError:
        raise TrainSourceError(f"{folder} is not a Hugging Face model folder: it has no config.json") from None
    return config


def hf_fingerprint(folder: str) -> str:
    """16 hex of sha256 over a Hugging Face model folder's `config.json`, its weight index (if sharded), and
    each weight file's name, size and version — the store's content checksum where it keeps one (GCS md5
    or crc32c, S3 ETag), else its modification time. Cheap at definition time: no weight is read."""
    fs, path = fsspec.core.url_to_fs(folder)
    path = path.rstrip("/")
    digest = hashlib.sha256(json.dumps(read_hf_config(folder), sort_keys=True).encode())
    weights = 0
    for info in sorted(fs.ls(path, detail=True), key=lambda i: i["name"]):
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        if name.endswith(".index.json"):
            digest.update(name.encode() + b"\0" + fs.cat_file(info["name"]))
        elif name.endswith(WEIGHT_SUFFIXES):
            weights += 1
            version = next((str(info[k]) for k in ("md5Hash", "crc32c", "ETag", "etag", "mtime") if info.get(k)), "")
            digest.update(f"{name}\0{info.get('size')}\0{version}\0".encode())
    if not weights:
        raise TrainSourceError(f"{folder} has a config.json but no weights (*.safetensors, pytorch_model*.bin)")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class InitFrom:
    """Where a training step's first weights come from: a Hugging Face model folder, or a checkpoint of
    another training step. Only the weights: the optimizer, step count and data order start afresh.
    Make one with `from_hf` or `from_checkpoint`."""

    source: Step | None = None
    """A `TrainStep` (one of its Levanter checkpoints), or a step whose output is a Hugging Face model
    folder (an export step); the training step depends on it."""
    folder: str | None = None
    """A plain Hugging Face model folder (local path or URL), identified by its path and `fingerprint`."""
    checkpoint_step: int | None = None
    """Which checkpoint of a `TrainStep` source; None: its last."""
    fingerprint: str | None = None
    """`hf_fingerprint` of `folder`, taken at definition time."""

    def identity(self) -> dict[str, Any]:
        """What enters the training step's hash_attrs."""
        if isinstance(self.source, TrainStep):
            return {"checkpoint_of": self.source.name_with_hash, "checkpoint_step": self.checkpoint_step}
        if self.source is not None:
            return {"hf_step": self.source.name_with_hash}
        return {"hf_folder": self.folder, "fingerprint": self.fingerprint}

    def describe(self) -> str:
        """The source in words, for messages."""
        if isinstance(self.source, TrainStep):
            which = "the last checkpoint" if self.checkpoint_step is None else f"checkpoint {self.checkpoint_step}"
            return f"{which} of {self.source.name}"
        return f"the Hugging Face model of {self.source.name}" if self.source is not None else str(self.folder)

    def resolve(self) -> InitWeights:
        """The place and vocabulary of the weights (run time: reads the source step's record or the folder)."""
        from marin_assets.pipeline.tokenizer import model_vocab_size

        if isinstance(self.source, TrainStep):
            result = load_result(self.source, TrainResult)
            model, tokenizer = result.model_and_tokenizer()
            try:
                checkpoint = result.checkpoint_path(self.checkpoint_step)
            except ValueError as e:
                raise TrainSourceError(f"cannot start from {self.describe()}: {e}") from None
            vocab = result.vocab_size or model_vocab_size(tokenizer, model.vocab_multiple)
            return InitWeights(checkpoint, vocab, model)
        folder = self.source.output_path if self.source is not None else str(self.folder)
        return InitWeights(folder, int(read_hf_config(folder)["vocab_size"]))


def from_hf(source: Step | str) -> InitFrom:
    """Start from a Hugging Face Llama/GPT-2 model folder: a step whose output is one (an export step), or
    a plain folder (local or URL), whose path and `hf_fingerprint` then enter the training step's identity."""
    if isinstance(source, TrainStep):
        raise StepDefinitionError(f"{source.name} is a training step: start from its checkpoints with"
                                  " from_checkpoint(), or from its export step's folder with from_hf()")
    if isinstance(source, Step):
        return InitFrom(source=source)
    return InitFrom(folder=source, fingerprint=hf_fingerprint(source))


def from_checkpoint(train: TrainStep, step: int | None = None) -> InitFrom:
    """Start from checkpoint `step` (default: the last) of another training step's Levanter checkpoints."""
    if not isinstance(train, TrainStep):
        raise StepDefinitionError(f"from_checkpoint needs a training step (train_step), got"
                                  f" {getattr(train, 'name', train)!r}; for a Hugging Face folder use from_hf()")
    if step is not None and step < 0:
        raise StepDefinitionError(f"checkpoint step must be non-negative, got {step}")
    return InitFrom(source=train, checkpoint_step=step)


def training_data_config(tokenizer_path: str, caches: dict[str, str], weights: Weights, model: ModelSpec,
                         trainer: TrainerSpec, budget: TokenBudget | None = None, vocab_size: int | None = None):
    """The Levanter data config `train_lm` trains on: the mixture (constant or staged `train_weights`, mixed in
    blocks every stage start falls on), the component token budgets (`max_train_batches`), and a tokenizer
    that Levanter sees with the model's `vocab_size`. `trainer.num_train_steps` is the run's own."""
    from marin_assets.pipeline.levanter_configs import data_config

    stages = as_stages(weights)
    budget = budget or TokenBudget()
    check_stages(stages, list(caches), trainer.num_train_steps)
    unknown = sorted(set(budget.component_tokens) - set(caches))
    if unknown:
        raise SpecError(f"token budgets name unknown components {unknown} (known: {sorted(caches)})")
    return data_config(tokenizer_path, caches, stages, vocab_size=vocab_size,
                       max_train_batches=budget.max_train_batches(trainer, model) or None,
                       block_size=mixture_block_size(stages, trainer.train_batch_size))


def train_lm(output_path: str, tokenizer_path: str, caches: dict[str, str], weights: Weights,
             model: ModelSpec, optimizer: OptimizerSpec, trainer: TrainerSpec, budget: TokenBudget | None = None,
             init: InitWeights | None = None, platform: str | None = None, *,
             tracking: Tracking | None = None) -> TrainResult:
    """Train a language model with Levanter on a mixture of Levanter caches (resumes if interrupted).

    `weights`: constant or staged; `budget`: stop after N tokens and/or read only the first N tokens of
    a component; `init`: the weights to start from (random when None); `platform`: the JAX platform to
    train on (`cuda`, `tpu`; None: whatever JAX picks under `JAX_PLATFORMS`); `tracking`: W&B and/or
    TensorBoard beside the JSON metrics (files under the output's `wandb/` and `tensorboard/`).
    """
    from marin_assets.pipeline.levanter_configs import use_platform

    use_platform(platform, f"training at {output_path}")  # before Levanter starts JAX
    budget = budget or TokenBudget()
    trainer = replace(trainer, num_train_steps=budget.num_train_steps(trainer, model))
    from levanter.main import train_lm as levanter_train

    from marin_assets.pipeline.levanter_configs import (
        JsonlMetrics,
        export_checkpoint,
        model_config,
        optimizer_config,
        restored_root_logging,
        trainer_config,
        write_reference_config,
    )
    from marin_assets.pipeline.tokenizer import largest_token_id, load_hf_tokenizer

    remote = "://" in output_path
    if not remote:
        output_path = os.path.abspath(output_path)  # Levanter cannot delete temporary checkpoints under relative paths
    run_id = output_path.rstrip("/").rsplit("/", 1)[-1]
    run_dir = run_dir_of(output_path)
    largest = largest_token_id(load_hf_tokenizer(tokenizer_path))
    vocab = init.vocab_size if init is not None else -(-(largest + 1) // model.vocab_multiple) * model.vocab_multiple
    if vocab <= largest:
        raise TrainSourceError(f"{init.path if init else 'the model'} has a vocabulary of {vocab}, but the"
                               f" tokenizer {tokenizer_path} has ids up to {largest}")
    data = training_data_config(tokenizer_path, caches, weights, model, trainer, budget, vocab)
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
        done = checkpoint_steps(run_dir)
        start_from: str | bool = False  # a resumed run continues from its own checkpoint
        if init is not None and not done:
            start_from = init.path if init.model is None else export_checkpoint(
                init.path, os.path.join(scratch, "init-hf"), init.model, tokenizer_path, vocab)
        config = levanter_train.TrainLmConfig(
            data=data,
            model=model_config(model, reference, tokenizer_path),
            trainer=trainer_config(trainer, run_id, local, logger_name, join_path(output_path, "checkpoints"),
                                   require_accelerator=platform not in (None, "cpu"), tracking=tracking),
            optimizer=optimizer_config(optimizer),
            initialize_from_hf=start_from,
            hf_save_path=join_path(output_path, "hf"),
            hf_save_steps=10**9,  # only the forced export at the end
        )
        started = time.monotonic()
        ran = not done or done[-1] + 1 < trainer.num_train_steps  # Levanter refuses to re-run a finished run
        if ran:
            with restored_root_logging(), JsonlMetrics(logger_name, metrics_file):
                levanter_train.main(config)
        if remote:
            fs, path = fsspec.core.url_to_fs(output_path)
            fs.put(metrics_file, f"{path}/{METRICS_FILE}")
            fs.put(os.path.join(local, "reference"), f"{path}/reference", recursive=True)
            for folder in (WANDB_DIR, TENSORBOARD_DIR):
                if os.path.isdir(os.path.join(local, folder)):
                    fs.put(os.path.join(local, folder), f"{path}/{folder}", recursive=True)
        seconds = training_seconds(output_path, time.monotonic() - started if ran else None)
        result = summarize(output_path, run_id, trainer, seconds, metrics_file, model, vocab)
        return replace(result, model=model, tokenizer=tokenizer_path, vocab_size=vocab,
                       train_tokens=trainer.num_train_steps * trainer.batch_tokens(model),
                       initialized_from=init.path if init is not None else None,
                       tracking=tracking_result(tracking, config.trainer.tracker, output_path, local))


def tracking_result(tracking: Tracking | None, trackers: Any, output_path: str, local: str) -> TrackingResult | None:
    """Where the run's trackers wrote, as paths under the output (`local`: where they wrote, before a copy to
    a remote output); None without `tracking`."""
    if tracking is None or not (tracking.wandb or tracking.tensorboard):
        return None
    started = [t for t in (trackers if isinstance(trackers, tuple) else (trackers,)) if hasattr(t, "run_dir")]
    url, run = (started[0].run_url, started[0].run_dir) if started else (None, None)  # None: it did not run
    return TrackingResult(
        wandb_url=url,
        wandb_dir=join_path(output_path, os.path.relpath(run, local)) if run else None,
        tensorboard_dir=join_path(output_path, TENSORBOARD_DIR) if tracking.tensorboard else None)


ATTEMPTS_FILE = "train_attempts.json"


def training_seconds(output_path: str, attempt: float | None) -> float:
    """Wall seconds of every attempt that trained this run (`attempt`: this one's, None if it trained
    nothing), kept beside the checkpoints so a resumed run's device-hours count every attempt that
    finished its call. An attempt killed mid-way is not counted (its time is lost with its process)."""
    url = join_path(output_path, ATTEMPTS_FILE)
    fs, path = fsspec.core.url_to_fs(url)
    attempts: list[float] = json.loads(fs.cat_file(path))["seconds"] if fs.exists(path) else []
    if attempt is not None:
        attempts.append(round(attempt, 2))
        atomic_write(url, json.dumps({"seconds": attempts}).encode())
    return sum(attempts)


def _copy_if_exists(url: str, local_path: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.get(path, local_path)


def summarize(output_path: str, run_id: str, trainer: TrainerSpec, seconds: float,
              metrics_file: str | None = None, model: ModelSpec | None = None,
              vocab_size: int | None = None) -> TrainResult:
    """The `TrainResult` of a run, read from its metrics file and checkpoint folder; with the `model` and its
    `vocab_size`, and steps logged, its cost too (run in the training process: it asks JAX for the devices)."""
    from marin_assets.pipeline.levanter_configs import SUMMARY_STEP, read_metrics
    from marin_assets.pipeline.run_cost import compute_dtype, device_peak, run_cost

    metrics = read_metrics(metrics_file or os.path.join(output_path, METRICS_FILE))
    summary = metrics.pop(SUMMARY_STEP, {})
    params = summary.get("parameter_count")
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
    cost = None
    if model is not None and vocab_size is not None and throughput:
        peak = device_peak(compute_dtype(trainer.mixed_precision))
        cost = run_cost(run_id, metrics, summary, model, vocab_size,
                        trainer.num_train_steps * trainer.batch_tokens(model), round(seconds, 2), peak)
    return TrainResult(
        run_id=run_id, steps=trainer.num_train_steps,
        final_train_loss=train[-1][1] if train else None, final_eval_loss=last_eval.get("eval/loss"),
        eval_losses=per_set,
        tokens_per_second=round(sorted(throughput)[len(throughput) // 2], 1) if throughput else None,
        checkpoint_steps=checkpoint_steps(run_dir), checkpoint_dir=run_dir,
        hf_dir=join_path(hf_root, f"step-{hf_steps[-1]}") if hf_steps else None,
        parameter_count=params, train_seconds=round(seconds, 2), loss_curve=train, eval_curve=evals,
        final_eval_bpb=last_eval.get("eval/bpb"), cost=cost,
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
    init_from: InitFrom | None = field(default=None, kw_only=True)
    """Where its first weights come from; None: random."""

    def tokenizer_path(self) -> str:
        """The tokenizer folder of its caches (read from the first cache's record; they share one)."""
        return load_result(self.deps[0], TokenizedCache).tokenizer

    def vocab_size(self) -> int:
        """Rows of its model's embedding: the source's when it starts from other weights, else the tokenizer's
        largest id + 1 rounded up to `model.vocab_multiple` (run time: reads records)."""
        from marin_assets.pipeline.tokenizer import model_vocab_size

        if self.init_from is not None:
            return self.init_from.resolve().vocab_size
        return model_vocab_size(self.tokenizer_path(), self.model.vocab_multiple)

    def checkpoint_path(self, step: int) -> str:
        """The folder of checkpoint `step` under the current prefix."""
        return join_path(run_dir_of(self.output_path), f"step-{step}")


def check_tokenizers(step_name: str, caches: Mapping[str, TokenizedCache]) -> None:
    """All components were tokenized with one tokenizer (`TrainDataError` naming each one otherwise)."""
    if len({c.tokenizer_fingerprint for c in caches.values()}) > 1:
        listed = "; ".join(f"{k}: {c.tokenizer} (fingerprint {c.tokenizer_fingerprint})" for k, c in caches.items())
        raise TrainDataError(f"step {step_name!r}: the mixture's components were tokenized with different"
                             f" tokenizers — {listed}; tokenize them all with one tokenizer")


def check_data_fills_batches(step_name: str, caches: Mapping[str, TokenizedCache], stages: Stages,
                             trainer: TrainerSpec, model: ModelSpec, budget: TokenBudget | None = None) -> None:
    """Every component the run trains on holds at least one batch (train_batch_size × seq_len tokens) in its
    train split, within its token budget; every validation split holds a sequence (counts from the records).

    Levanter would otherwise fail inside its data loader (an IndexError) or evaluate nothing.
    """
    per_batch = trainer.batch_tokens(model)
    batch = f"one batch ({trainer.train_batch_size} sequences × {model.seq_len} tokens = {per_batch:,} tokens)"
    trained = [k for k in caches if any(w.get(k, 0) > 0 for _, w in stages)]
    budgets = (budget or TokenBudget()).component_tokens
    for k in trained:
        splits = caches[k].splits
        if "train" not in splits:
            raise TrainDataError(f"step {step_name!r}: component {k!r} has no train split (its splits:"
                                 f" {sorted(splits)}), but the mixture trains on it")
        stats = splits["train"]
        if stats.tokens < per_batch:
            raise TrainDataError(f"step {step_name!r}: component {k!r} has {stats.tokens:,} train tokens in"
                                 f" {_documents(stats.documents)}, less than {batch}; give it more data, or lower"
                                 " train_batch_size or seq_len")
        if k in budgets and budgets[k] > stats.tokens:
            raise TrainDataError(f"step {step_name!r}: the token budget asks for the first {budgets[k]:,} tokens of"
                                 f" component {k!r}, which has only {stats.tokens:,} train tokens")
    for k, cache in caches.items():
        held = cache.splits.get("validation")
        if held is not None and held.tokens < model.seq_len:
            raise TrainDataError(f"step {step_name!r}: component {k!r} has {held.tokens:,} validation tokens in"
                                 f" {_documents(held.documents)}, less than one sequence of {model.seq_len} tokens")


def _documents(n: int) -> str:
    return f"{n:,} document" + ("" if n == 1 else "s")


def source_mismatches(model: ModelSpec, init_from: InitFrom, hf_config: Mapping[str, Any] | None) -> str | None:
    """How the source's weights do not fit `model` (None: they fit, or nothing to compare yet): the source
    step's model for a checkpoint, the `config.json` of a Hugging Face folder."""
    if isinstance(init_from.source, TrainStep):
        problems = model.differences(init_from.source.model)
    elif hf_config is not None:
        problems = model.hf_differences(hf_config)
    else:
        return None
    if not problems:
        return None
    return f"the model does not fit the weights of {init_from.describe()}: " + "; ".join(problems)


def platform_for(resources: Resources) -> str | None:
    """The JAX platform a step's resources call for: `cuda` with GPUs, `tpu` with a TPU, else None (JAX's
    own choice under `JAX_PLATFORMS`, CPU here)."""
    if resources.gpu:
        return "cuda"
    return "tpu" if resources.tpu_type else None


def train_step(name: str, train: dict[str, Step], model: ModelSpec = ModelSpec(),
               optimizer: OptimizerSpec = OptimizerSpec(), trainer: TrainerSpec = TrainerSpec(),
               weights: Weights | None = None, validation: dict[str, Step] | None = None,
               cpu: float = 1, tpu_type: str | None = None, *, init_from: InitFrom | None = None,
               budget: TokenBudget | None = None, gpu: float = 0, gpu_type: str | None = None,
               tracking: Tracking | None = None) -> TrainStep:
    """A training step on a mixture: `train` components (default weight 1), `validation` ones weight 0.

    `weights` are constant or staged — (start step, weights) pairs, the first at step 0; a component a
    stage leaves out has weight 0 then. `init_from` (`from_hf`, `from_checkpoint`) starts from other
    weights; `budget` limits tokens; `gpu=N` trains on N CUDA GPUs. Mixing caches of different tokenizers
    is an error here when the caches are `TokenizeStep`s (which know their tokenizer step), and when the
    run starts otherwise (their fingerprints), as is data that cannot fill one batch. `tracking` (W&B,
    TensorBoard) is how the run is watched, not part of its identity."""
    components = {**train, **(validation or {})}
    stages = as_stages(weights if weights is not None else {k: 1.0 for k in train})
    for _, stage in stages:
        for k in validation or {}:
            stage.setdefault(k, 0.0)
    budget = budget or TokenBudget()
    try:
        trainer = replace(trainer, num_train_steps=budget.num_train_steps(trainer, model))
        check_stages(stages, list(components), trainer.num_train_steps)
        mixture_block_size(stages, trainer.train_batch_size)
        unknown = sorted(set(budget.component_tokens) - set(components))
        if unknown:
            raise SpecError(f"token budgets name unknown components {unknown} (known: {sorted(components)})")
        untrained = sorted(k for k in budget.component_tokens if not any(w.get(k, 0) > 0 for _, w in stages))
        if untrained:
            raise SpecError(f"token budgets name components {untrained} that no stage trains on")
        budget.max_train_batches(trainer, model)
        if init_from is not None:
            folder_config = read_hf_config(init_from.folder) if init_from.folder is not None else None
            mismatch = source_mismatches(model, init_from, folder_config)
            if mismatch:
                raise SpecError(mismatch)
    except (SpecError, TrainSourceError) as e:
        raise StepDefinitionError(f"step {name!r}: {e}") from None
    tokenizers = {k: s.tokenizer.name_with_hash for k, s in components.items() if isinstance(s, TokenizeStep)}
    if len(set(tokenizers.values())) > 1:
        described = dict(sorted(tokenizers.items()))
        raise StepDefinitionError(f"step {name!r}: the mixture mixes tokenizers: {described}")
    names = sorted(components)
    platform = platform_for(Resources(cpu=cpu, gpu=gpu, gpu_type=gpu_type, tpu_type=tpu_type))

    def run(out: str) -> TrainResult:
        results = {k: load_result(components[k], TokenizedCache) for k in names}
        check_tokenizers(name, results)
        check_data_fills_batches(name, results, stages, trainer, model, budget)
        first = results[names[0]]
        init = None
        if init_from is not None:
            init = init_from.resolve()
            mismatch = source_mismatches(model, init_from, read_hf_config(init.path) if init.model is None else None)
            if mismatch:
                raise TrainSourceError(f"step {name!r}: {mismatch}")
            if isinstance(init_from.source, TrainStep):
                source = load_result(init_from.source, TrainResult)
                theirs = tokenizer_fingerprint(source.model_and_tokenizer()[1])
                if theirs != first.tokenizer_fingerprint:
                    raise TrainSourceError(
                        f"step {name!r}: {init_from.describe()} was trained on tokenizer {source.tokenizer}"
                        f" (fingerprint {theirs}), but this run's data was tokenized with {first.tokenizer}"
                        f" (fingerprint {first.tokenizer_fingerprint})")
        return train_lm(out, first.tokenizer, {k: r.path for k, r in results.items()}, stages, model, optimizer,
                        trainer, budget, init, platform, tracking=tracking)

    hash_attrs: dict[str, Any] = {
        "weights": canonical(stages[0][1]) if len(stages) == 1 else [[s, canonical(w)] for s, w in stages],
        "model": model, "optimizer": optimizer, "trainer": trainer}
    if budget != TokenBudget():
        hash_attrs["budget"] = budget
    if init_from is not None:
        hash_attrs["init_from"] = init_from.identity()
    return TrainStep(
        name=name,
        fn=run,
        deps=[components[k] for k in names] + ([init_from.source] if init_from and init_from.source else []),
        hash_attrs=hash_attrs,
        resources=Resources(cpu=cpu, gpu=gpu, gpu_type=gpu_type, tpu_type=tpu_type),
        kind="train",
        description=made_by(train_lm),
        kinds=["levanter", "jax"],
        checks=[LOSS_FELL],
        model=model,
        init_from=init_from,
    )
