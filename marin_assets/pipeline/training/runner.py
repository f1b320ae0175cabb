"""The one runner every training method runs on (pretraining, SFT, and the next: DPO, RL).

A method hands it a Levanter entry point and a config builder; the runner does what every method
needs: the output placed locally or on a remote store (checkpoints straight to the output, logs and
metrics in a scratch folder copied back), resumption from the last checkpoint, wall time over every
attempt, the JSON metrics and the trackers, and the typed record (`TrainResult`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import fsspec

from marin_assets.core.files import atomic_write
from marin_assets.core.hosts import writes_own_files
from marin_assets.core.paths import join_path
from marin_assets.core.preemption import Preempted, preemptible, sigterm_preempts
from marin_assets.core.preemption import received_at as preemption_received_at
from marin_assets.core.step import Resources
from marin_assets.pipeline.training.checkpoints import checkpoint_steps, run_dir_of
from marin_assets.pipeline.training.specs import (
    DeviceLayout,
    ModelSpec,
    TrainerSpec,
)
from marin_assets.pipeline.training.tracking import TENSORBOARD_DIR, WANDB_DIR, Tracking, TrackingResult
from marin_assets.pipeline.training.training_run import TrainResult

METRICS_FILE = "metrics.jsonl"
PREEMPTED_FILE = "preempted.json"
"""Why a run last stopped early on SIGTERM (kept after its retry finishes: a run's history)."""


@dataclass(frozen=True)
class RunPlaces:
    """Where one attempt of a run writes, decided by the runner: what a method's config builder needs."""

    output_path: str
    """The run's output: an absolute local folder or a URL (Levanter cannot delete temporary checkpoints
    under a relative path)."""
    run_id: str
    """The run's id: the last part of the output path (name and hash), also Levanter's run id."""
    local_dir: str
    """A local folder for Levanter's logs, the JSON metrics, the trackers and the reference config: the
    output itself when it is local, a scratch folder copied back to a remote output after the attempt."""
    scratch: str
    """A scratch folder of this attempt (removed after it): for files a method prepares (a reference model
    converted for it, a cache of reference log-probs)."""
    checkpoints: str
    """Where Levanter writes checkpoints (`{output}/checkpoints`; the run's are under `run_dir_of(output)`)."""
    hf_save_path: str
    """Where Levanter writes its Hugging Face export at the end (`{output}/hf`)."""
    reference: str
    """A local folder with the model's transformers `config.json` (and tokenizer): Levanter's
    `reference_checkpoint`, so that nothing is fetched from the hub."""
    metrics_logger: str
    """The Python logger the JSON metrics tracker writes to (`trainer_config(..., metrics_logger)`)."""
    resuming: bool
    """The run has checkpoints of its own: Levanter continues from the last, so a method must not ask it to
    initialize from other weights."""
    platform: str | None
    """The JAX platform the run trains on (`cuda`, `tpu`; None: JAX's choice under `JAX_PLATFORMS`)."""
    layout: DeviceLayout | None = None
    """How the run splits its devices (`trainer_config(..., layout=…)`; None: Levanter's default mesh)."""


class TrainingMethod(Protocol):
    """A training method on the runner: a Levanter entry point and how to configure it for one run.

    Pretraining (`pretrain.LmTraining`: `levanter.main.train_lm`) is one; SFT trains through it on chat
    caches; a new method (DPO: `levanter.main.train_dpo`) is one more class and a step factory beside it.
    The config's `trainer` must come from `levanter_trainer.trainer_config(…, places…)`, which points
    Levanter's checkpoints, logs and metrics where the runner expects them."""

    @property
    def name(self) -> str:
        """The method's name, for messages (`train_lm`, `dpo`)."""
        ...

    @property
    def model(self) -> ModelSpec:
        """The model trained (its reference config is written for the method)."""
        ...

    @property
    def trainer(self) -> TrainerSpec:
        """Steps, batch, checkpoints: `num_train_steps` is the run's own, as the method resolved it."""
        ...

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding."""
        ...

    @property
    def tokenizer_path(self) -> str:
        """The tokenizer folder of the run's data."""
        ...

    @property
    def caches(self) -> dict[str, str]:
        """The Levanter caches the run reads, {name: path} (an `s3://` one needs the S3 settings the runner
        hands to Levanter)."""
        ...

    def entry_point(self) -> Callable[[Any], Any]:
        """The Levanter `main` to call with the config (imported here: only where the run runs)."""
        ...

    def config(self, places: RunPlaces) -> Any:
        """The entry point's config for this attempt."""
        ...

    def finish(self, result: TrainResult, metrics: dict[int, dict[str, Any]]) -> TrainResult:
        """The run's record with what the method adds from its metrics (step → what Levanter logged): DPO's
        preference curves; the record as it is for pretraining and SFT."""
        ...


def run_training(output_path: str, method: TrainingMethod, *, platform: str | None = None,
                 tracking: Tracking | None = None, initialized_from: str | None = None,
                 layout: DeviceLayout | None = None) -> TrainResult:
    """Run `method` to its last step at `output_path`, resuming from the run's last checkpoint, and return
    its record: metrics copied beside the checkpoints, wall time summed over every attempt that trained,
    the trackers' places, the cost. A finished run is summarized again without training."""
    from marin_assets.pipeline.tokens.array_store import refuse_unsupported_array_store, s3_arrays
    from marin_assets.pipeline.training.levanter_model import write_reference_config
    from marin_assets.pipeline.training.levanter_trainer import (
        JsonlMetrics,
        join_hosts,
        read_metrics,
        restored_root_logging,
        use_platform,
    )

    refuse_unsupported_array_store(output_path, f"training ({method.name})")  # before anything is written
    place = join_hosts(f"training at {output_path}")  # before JAX starts a backend
    lead = writes_own_files(place)
    use_platform(platform, f"training at {output_path}")  # before Levanter starts JAX
    remote = "://" in output_path
    if not remote:
        output_path = os.path.abspath(output_path)  # Levanter cannot delete temporary checkpoints under relative paths
    run_id = output_path.rstrip("/").rsplit("/", 1)[-1]
    trainer = method.trainer
    arrays = s3_arrays([output_path, *method.caches.values()])  # checkpoints written, caches read
    with arrays, tempfile.TemporaryDirectory(prefix="marin-train-") as scratch:
        local = scratch if remote or not lead else output_path
        metrics_file = os.path.join(local, METRICS_FILE)
        if remote and lead:
            _copy_if_exists(join_path(output_path, METRICS_FILE), metrics_file)  # a resumed run appends
        done = checkpoint_steps(run_dir_of(output_path))
        places = RunPlaces(
            output_path=output_path, run_id=run_id, local_dir=local, scratch=scratch,
            checkpoints=join_path(output_path, "checkpoints"), hf_save_path=join_path(output_path, "hf"),
            reference=write_reference_config(method.model, method.vocab_size, os.path.join(local, "reference")),
            metrics_logger=f"marin.metrics.{run_id}", resuming=bool(done), platform=platform, layout=layout)
        config = method.config(places)
        started = time.monotonic()
        # A finished run is not called again: Levanter would run its final hooks, rewriting the last checkpoint
        ran = not done or done[-1] + 1 < trainer.num_train_steps
        stopped: Preempted | None = None
        if ran:
            with restored_root_logging(), JsonlMetrics(places.metrics_logger, metrics_file), preemptible(), \
                    sigterm_preempts():
                try:
                    method.entry_point()(config)
                except Preempted as e:
                    stopped = e
        if remote and lead:
            fs, path = fsspec.core.url_to_fs(output_path)
            fs.put(metrics_file, f"{path}/{METRICS_FILE}")
            fs.put(places.reference, f"{path}/reference", recursive=True)
            for folder in (WANDB_DIR, TENSORBOARD_DIR):
                if os.path.isdir(os.path.join(local, folder)):
                    fs.put(os.path.join(local, folder), f"{path}/{folder}", recursive=True)
        seconds = training_seconds(output_path, time.monotonic() - started if ran and lead else None)
        if stopped is not None:
            raise _preempted(output_path, stopped, seconds, write=lead)
        result = summarize(output_path, run_id, trainer, seconds, metrics_file, method.model, method.vocab_size)
        result = replace(result, model=method.model, tokenizer=method.tokenizer_path, vocab_size=method.vocab_size,
                         train_tokens=trainer.num_train_steps * trainer.batch_tokens(method.model),
                         initialized_from=initialized_from, method=method.name,
                         hosts=1 if place is None else place.processes, device_mesh=_device_mesh(layout),
                         tracking=tracking_result(tracking, config.trainer.tracker, output_path, local))
        return method.finish(result, read_metrics(metrics_file))


def _preempted(output_path: str, stopped: Preempted, seconds: float, write: bool = True) -> Preempted:
    """Record why the run stopped (`preempted.json` beside its checkpoints: the step, when SIGTERM came, how long
    the save took) and the error its step fails with: no SUCCESS, and the retry resumes from that checkpoint."""
    done = checkpoint_steps(run_dir_of(output_path))
    signalled = preemption_received_at()
    why = {"reason": "SIGTERM (preemption)", "message": str(stopped), "checkpoint_step": done[-1] if done else None,
           "signal_time": signalled, "stopped_time": time.time(), "training_seconds": seconds}
    if write:
        atomic_write(join_path(output_path, PREEMPTED_FILE), json.dumps(why, indent=2).encode())
    at = f"step {done[-1]}" if done else "no step"
    return Preempted(f"training at {output_path} {stopped}; its last checkpoint is {at}: a retry resumes from it"
                     f" (why: {PREEMPTED_FILE})")


def _device_mesh(layout: DeviceLayout | None) -> dict[str, int]:
    """The mesh axes Levanter built for `layout` on this run's devices (every host's), axes of size 1 left out."""
    import jax

    config = layout.mesh_config() if layout is not None else DeviceLayout().mesh_config()
    ici, dcn = config.axis_shapes(jax.device_count(), 1)
    return {axis: size for axis, size in {**ici, **dcn}.items() if size > 1} or {"data": 1}


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
    from marin_assets.pipeline.training.cost import compute_dtype, device_peak, run_cost
    from marin_assets.pipeline.training.levanter_trainer import SUMMARY_STEP, read_metrics

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


def platform_for(resources: Resources) -> str | None:
    """The JAX platform a step's resources call for: `cuda` with GPUs, `tpu` with a TPU, else None (JAX's
    own choice under `JAX_PLATFORMS`, CPU here)."""
    if resources.gpu:
        return "cuda"
    return "tpu" if resources.tpu_type else None
