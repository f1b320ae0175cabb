"""Our `TrainerSpec` → Levanter's trainer config, and the sharp edges of Levanter on an offline CPU.

Imported only inside step functions (on Ray workers).
- The JSON logger tracker, written to a JSONL file we parse for curves; W&B and TensorBoard beside it
  only when a run's `Tracking` asks (Levanter's default tracker is W&B; an empty tuple is none).
- No accelerator required (Levanter refuses a CPU by default); the JAX platform chosen before Levanter starts
  JAX; a multi-host step's processes joined into one JAX program by us (`join_hosts`), never by Levanter.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from marin_assets.core.hosts import HostPlace
from marin_assets.pipeline.training.specs import DeviceLayout, TrainerSpec
from marin_assets.pipeline.training.tracking import Tracking

JAX_BACKENDS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}
"""JAX platform name → the backend `jax.default_backend()` reports for it."""
CUDA_PLUGIN = "jax_cuda13_plugin"
"""The module of JAX's CUDA plugin (Levanter's gpu extra installs `jax[cuda13]`)."""


class AcceleratorError(RuntimeError):
    """The step asked for an accelerator JAX cannot use here."""


@functools.cache
def _wandb_class():
    from levanter.tracker import TrackerConfig
    from levanter.tracker.wandb import WandbConfig

    if "wandb_local" in TrackerConfig.get_known_choices():
        return TrackerConfig.get_choice_class("wandb_local")

    @TrackerConfig.register_subclass("wandb_local")
    @dataclass
    class LocalDirWandbConfig(WandbConfig):
        """Levanter's W&B tracker writing its run files under `{dir}/wandb` (W&B's own `WANDB_DIR`, set while it
        starts); once started, its `run_url` (None offline) and `run_dir` (the run's local folder) say where the
        run went."""

        dir: str = ""

        def init(self, run_id):
            import wandb

            os.makedirs(self.dir, exist_ok=True)
            before = os.environ.get("WANDB_DIR")
            os.environ["WANDB_DIR"] = self.dir  # W&B fixes its run folder when the run starts
            try:
                tracker = super().init(run_id)
            finally:
                if before is None:
                    os.environ.pop("WANDB_DIR", None)
                else:
                    os.environ["WANDB_DIR"] = before
            run = wandb.run  # Levanter wraps its W&B tracker in a background one: ask W&B
            self.run_url = None if run is None or run.offline else run.url
            self.run_dir = None if run is None else os.path.dirname(run.dir)  # `…/offline-run-…-ID/files` → its folder
            return tracker

    return LocalDirWandbConfig


def tracker_configs(tracking: Tracking | None, run_id: str, output_dir: str, metrics_logger: str) -> list:
    """Levanter's tracker configs: the JSON logger (the source of our curves) first, then W&B (run files
    under `{output_dir}/wandb`) and TensorBoard (`{output_dir}/tensorboard/{run_id}`) as `tracking` asks."""
    from levanter.tracker.json_logger import JsonLoggerConfig
    from levanter.tracker.tensorboard import TensorboardConfig

    from marin_assets.pipeline.training.tracking import TENSORBOARD_DIR

    configs: list = [JsonLoggerConfig(logger_name=metrics_logger)]
    if tracking is not None and tracking.wandb:
        configs.append(_wandb_class()(project=tracking.wandb_project, entity=tracking.wandb_entity,
                                      tags=list(tracking.wandb_tags), id=run_id, save_code=False,
                                      dir=output_dir))  # W&B writes under `{dir}/wandb`
    if tracking is not None and tracking.tensorboard:
        configs.append(TensorboardConfig(logdir=os.path.join(output_dir, TENSORBOARD_DIR), flush_secs=10))
    return configs


def trainer_config(trainer: TrainerSpec, run_id: str, output_dir: str, metrics_logger: str,
                   checkpoint_dir: str | None = None, require_accelerator: bool = False,
                   tracking: Tracking | None = None, layout: DeviceLayout | None = None):
    """Levanter's trainer config for a `TrainerSpec`: offline, JSON metrics, checkpoints under `checkpoint_root`.

    `trainer.num_train_steps` is the run's length (a `TokenBudget` has already been applied to it);
    `tracking`: W&B and TensorBoard beside the JSON metrics (`tracker_configs`); `layout`: how the devices are
    split (None: Levanter's default mesh, every device on the FSDP `data` axis).
    """
    import jmp
    from levanter.callbacks.watch import WatchConfig
    from levanter.distributed import DistributedConfig
    from levanter.trainer import TrainerConfig
    from levanter.utils.mesh import MeshConfig

    # Every K steps until the one before last; Levanter forces a permanent checkpoint of the last step when
    # training ends (a policy saving it too would write it twice).
    trackers = tracker_configs(tracking, run_id, output_dir, metrics_logger)
    last = trainer.num_train_steps - 1
    keep = [dict(every=trainer.checkpoint_every, until=last - 1)] if last >= 1 else []
    return TrainerConfig(
        id=run_id, seed=trainer.seed, mp=jmp.get_policy(trainer.mixed_precision),
        tracker=trackers[0] if len(trackers) == 1 else tuple(trackers),
        log_dir=Path(output_dir) / "logs",
        train_batch_size=trainer.train_batch_size, num_train_steps=trainer.num_train_steps,
        steps_per_eval=trainer.steps_per_eval, max_eval_batches=trainer.max_eval_batches,
        checkpointer=_preemptible_checkpointer_config()(
            base_path=checkpoint_dir or os.path.join(output_dir, "checkpoints"), save_interval=timedelta(minutes=30),
            keep=keep),
        require_accelerator=require_accelerator,
        distributed=DistributedConfig(initialize_jax_distributed=False),  # `join_hosts` joins a multi-host step
        mesh=layout.mesh_config() if layout is not None else MeshConfig(),
        watch=WatchConfig(watch_targets=[]), log_jaxprs=False, log_xla_hlo=False,
    )


@functools.cache
def _preemptible_checkpointer_config() -> type:
    """Levanter's `CheckpointerConfig` whose checkpointer, at the first step after SIGTERM asked the process to stop
    (`core.preemption.requested`), saves a permanent checkpoint of that step, waits for it to be written, and
    raises `Preempted`: the run's retry resumes from it. Otherwise Levanter's checkpointer, unchanged. (Levanter
    calls the checkpointer after every step; it is the one place outside its `main` that sees each step.)"""
    from levanter.checkpoint import Checkpointer, CheckpointerConfig

    from marin_assets.core import preemption

    class PreemptibleCheckpointer(Checkpointer):
        def on_step(self, *, tree: Any, step: int, force: bool = False) -> None:
            if not preemption.requested.is_set():
                super().on_step(tree=tree, step=step, force=force)
                return
            super().on_step(tree=tree, step=step, force=True)
            self.wait_until_finished()
            raise preemption.Preempted(f"stopped on SIGTERM after step {int(step)}, its checkpoint saved")

    @dataclass
    class PreemptibleCheckpointerConfig(CheckpointerConfig):
        def create(self, run_id: str) -> Checkpointer:
            made = super().create(run_id)
            made.__class__ = PreemptibleCheckpointer  # the same object, with the preemption check before each save
            return made

    return PreemptibleCheckpointerConfig


JOIN_TIMEOUT_S = 300
"""How long a host waits for the others to join its JAX program before failing (a host that never came)."""


def join_hosts(who: str) -> HostPlace | None:
    """Join this process to the other hosts of its step as one JAX program, before JAX starts a backend: JAX's
    distributed runtime at the coordinator the runner chose (or the one JAX finds on a TPU slice), CPU
    collectives over gloo. None (and nothing done) on one host; a process already joined stays as it is."""
    place = HostPlace.from_env()
    if place is None:
        return None
    import jax

    if jax.distributed.is_initialized():
        return place
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        if place.coordinator:
            jax.distributed.initialize(place.coordinator, place.processes, place.process_id,
                                       initialization_timeout=JOIN_TIMEOUT_S)
        else:
            jax.distributed.initialize(initialization_timeout=JOIN_TIMEOUT_S)
    except Exception as e:
        raise RuntimeError(f"{who}: host {place.process_id} of {place.processes} could not join the step's JAX"
                           f" program (coordinator {place.coordinator or 'found by JAX'}): {e}") from e
    logging.getLogger(__name__).info(
        f"{who}: host {place.process_id} of {place.processes} joined: {jax.device_count()} devices in all,"
        f" {jax.local_device_count()} here")
    return place


def use_platform(platform: str | None, who: str) -> None:
    """Make JAX in this process run on `platform` (`cuda`, `tpu`, `cpu`), whatever `JAX_PLATFORMS` says.

    The environment may say `cpu` (the Makefile exports it, and the Ray resource forwards it to
    every worker): an accelerator step overrides it here, before Levanter starts JAX. A worker
    whose JAX already runs elsewhere (it ran a CPU step before) has its backends cleared and
    started again. JAX without the platform's plugin is an `AcceleratorError` naming `who`,
    before any compute. None: leave JAX to `JAX_PLATFORMS` and its own choice.
    """
    if platform is None:
        return
    if platform not in JAX_BACKENDS:
        raise ValueError(f"{who}: unknown JAX platform {platform!r} (known: {sorted(JAX_BACKENDS)})")
    import jax
    from jax.extend import backend as jax_backend

    previous = getattr(jax.config, "jax_platforms")  # noqa: B009  (a config state mypy does not see)
    # the CPU backend stays beside the accelerator: Levanter keeps its data loader's arrays on it
    jax.config.update("jax_platforms", platform if platform == "cpu" else f"{platform},cpu")
    cleared = False
    try:
        found = jax.default_backend()
        if found != JAX_BACKENDS[platform]:  # this process started JAX elsewhere before
            jax_backend.clear_backends()
            cleared = True
            found = jax.default_backend()
        problem = None if found == JAX_BACKENDS[platform] else f"JAX started on {found!r}"
    except Exception as e:  # JAX raises a bare AssertionError or a RuntimeError for a backend it cannot start
        problem = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no backend'}"
    if problem is not None and JAX_BACKENDS[platform] == "gpu" and importlib.util.find_spec(CUDA_PLUGIN) is None:
        problem = f"JAX's CUDA 13 plugin ({CUDA_PLUGIN.replace('_', '-')}) is not installed"
    if problem is None:
        return
    jax.config.update("jax_platforms", previous)
    if cleared:
        jax_backend.clear_backends()
    hint = ""
    if JAX_BACKENDS[platform] == "gpu":
        hint = f"install JAX with CUDA: pip install 'jax[cuda13]=={jax.__version__}' (docs/gpu.md)"
    elif platform == "tpu":
        hint = f"install JAX with TPU support: pip install 'jax[tpu]=={jax.__version__}'"
    raise AcceleratorError(f"{who}: asked to run on {platform!r}, but JAX {jax.__version__} cannot start that"
                           f" backend here ({problem}){'; ' + hint if hint else ''}")


@contextlib.contextmanager
def restored_root_logging() -> Iterator[None]:
    """Undo Levanter's `init_logging` afterwards: it replaces the root logger's handlers with a
    file handler under its log dir (often a temporary folder) and a console handler, which
    would outlive the call in a reused worker or test process and write to a deleted folder."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


class JsonlMetrics:
    """Route a JSON-logger tracker's records into a JSONL file for the duration of a run."""

    def __init__(self, logger_name: str, path: str):
        self.logger = logging.getLogger(logger_name)
        self.path = path

    def __enter__(self) -> JsonlMetrics:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.handler = logging.FileHandler(self.path, mode="a")
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.handler.close()


def read_metrics(path: str) -> dict[int, dict[str, Any]]:
    """step → merged metrics (last value wins: a resumed run replays some steps)."""
    steps: dict[int, dict[str, Any]] = {}
    if not os.path.exists(path):
        return steps
    with open(path) as f:
        for line in f:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "log" and event.get("step") is not None:
                steps.setdefault(int(event["step"]), {}).update(event.get("metrics", {}))
            elif event.get("event") == "summary":
                steps.setdefault(SUMMARY_STEP, {}).update(event.get("metrics", {}))
    return steps


SUMMARY_STEP = -1
"""`read_metrics` files run summaries (e.g. parameter_count) under this step."""
