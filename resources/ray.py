"""Ray: where step functions run. An embedded local Ray by default, a cluster by address.

Connection is lazy: a run whose assets are all cached — or whose steps that compute are all
light (`marin_assets.core.light`), run in the Dagster process — never starts Ray. An embedded Ray is
sized for the machine (all cores, a small object store, no dashboard, no token auth, its
session files under a temp folder rather than the home folder) and shut down at the end of
the run; a cluster connection is only disconnected. Where `marin-assets ray start` left a local Ray
running (`marin_assets.execution.local_ray`), a run joins it instead of starting its own — Ray's
start-up paid once, not per run — and leaves it running; a stale address file is logged and ignored.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from marin_assets.execution import local_ray

# Environment variables a step commonly needs, forwarded to workers when set here.
FORWARDED_ENV = (
    "JAX_PLATFORMS", "XLA_FLAGS", "LIBTPU_INIT_ARGS",
    "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_HOME",
    "TOKENIZERS_PARALLELISM", "WANDB_MODE", "MARIN_PREFIX", "STORAGE_EMULATOR_HOST",
)


class RayResource(ConfigurableResource):
    """Where step functions run; see README "Execution on Ray" for the resource mapping."""

    address: str | None = Field(
        default=None,
        description="None: start an embedded local Ray. 'auto', 'ray://host:10001' or 'host:6379': a cluster.",
    )
    num_cpus: int | None = Field(default=None, description="Embedded Ray only: CPUs (default: all cores).")
    object_store_mb: int | None = Field(
        default=None, description="Embedded Ray only: object store size (default: 10% of RAM, 256 MiB–2 GiB)."
    )
    custom_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Embedded Ray only: extra node resources, e.g. to imitate a TPU host in tests.",
    )
    runtime_env: dict[str, Any] = Field(
        default_factory=dict, description="Passed to ray.init: env_vars, working_dir, py_modules, pip…"
    )
    env_vars: dict[str, str] = Field(default_factory=dict, description="Extra environment for every step's worker.")
    fail_fast: bool = Field(
        default=True,
        description="Reject at once a request no node can ever satisfy. Turn off on autoscaling clusters.",
    )
    temp_dir: str | None = Field(
        default=None, description="Embedded Ray only: session folder root (default: <tmp>/marin-ray-<uid>)."
    )
    keep_session_logs: bool = Field(default=False, description="Embedded Ray only: keep worker logs after shutdown.")
    light_steps_in_process: bool = Field(
        default=True,
        description="Embedded Ray only: run light steps (function marked `light`, at most 1 CPU, no memory,"
                    " GPU or TPU request) in the Dagster process, so they never start Ray. False: every step"
                    " is a Ray task.",
    )
    use_local_ray: bool = Field(
        default=True,
        description="Embedded Ray only: join the local Ray that `marin-assets ray start` left running (its address"
                    " in $DAGSTER_HOME/local-ray.json) when it is alive, instead of starting one for the run."
                    " A resource that sizes its Ray (num_cpus, object_store_mb, custom_resources, temp_dir)"
                    " always starts its own.",
    )

    _started_here: bool = PrivateAttr(default=False)
    _session_dir: str | None = PrivateAttr(default=None)
    _log: Any = PrivateAttr(default=None)
    _joined: local_ray.LocalRay | None = PrivateAttr(default=None)

    @property
    def embedded(self) -> bool:
        return self.address is None

    def worker_env(self) -> dict[str, str]:
        """What every step's worker gets: forwarded variables, then `env_vars`."""
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        env.update(self.runtime_env.get("env_vars", {}))
        env.update(self.env_vars)
        return env

    @property
    def sized(self) -> bool:
        """Whether this resource asks for an embedded Ray of a given shape (then it never joins a local Ray)."""
        return bool(self.num_cpus or self.object_store_mb or self.custom_resources or self.temp_dir)

    @property
    def joined(self) -> local_ray.LocalRay | None:
        """The local Ray this resource joined (None: it started its own, joined a cluster, or has not connected)."""
        return self._joined

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._log = context.log  # where `connect` says which Ray it joined, in the run's own log

    def _say(self, level: int, message: str) -> None:
        if self._log is not None:
            self._log.log(level, message)
        else:
            logging.getLogger(__name__).log(level, message)

    def local(self) -> local_ray.LocalRay | None:
        """The live local Ray this resource would join (logging why a stale address file is ignored)."""
        if not (self.embedded and self.use_local_ray) or self.sized:
            return None
        found, stale = local_ray.find()
        if stale:
            self._say(logging.WARNING, f"{stale}; starting an embedded Ray for this run"
                                       " (`marin-assets ray start` starts a new local Ray)")
        return found

    def connect(self) -> None:
        """Start or join Ray once per process; reuse a Ray someone else initialized."""
        import ray

        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        runtime_env = {k: v for k, v in self.runtime_env.items() if k != "env_vars"}
        runtime_env["env_vars"] = self.worker_env()
        options: dict[str, Any] = {"runtime_env": runtime_env, "log_to_driver": False}
        found = self.local()
        if found is not None:
            ray.init(address=found.address, **options)
            self._joined = found
            self._say(logging.INFO, f"joined the {local_ray.describe(found)}")
        elif self.embedded:
            options.update(
                num_cpus=self.num_cpus or os.cpu_count(),
                object_store_memory=(self.object_store_mb * 2**20) if self.object_store_mb
                else local_ray.default_object_store(),
                resources=dict(self.custom_resources) or None,
                include_dashboard=False,
                _temp_dir=self.temp_dir or local_ray.default_temp_dir(),
            )
            ray.init(**options)
            self._session_dir = session_dir()
        else:
            ray.init(address=self.address, **options)
        self._started_here = True

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the embedded Ray (or leave the cluster) if this resource started it."""
        if not self._started_here:
            return
        import ray

        ray.shutdown()  # a joined local Ray or a cluster: only this driver leaves
        self._started_here, self._joined = False, None
        if self._session_dir and not self.keep_session_logs:
            shutil.rmtree(self._session_dir, ignore_errors=True)
            latest = os.path.join(os.path.dirname(self._session_dir), "session_latest")
            if os.path.islink(latest) and not os.path.exists(latest):
                os.unlink(latest)
        self._session_dir = None


def session_dir() -> str | None:
    """The embedded Ray's session folder (`<temp dir>/session_<date>_<pid>`), so that `shutdown` can
    delete it: Ray leaves its logs and sockets behind, one folder per run.

    Pinned `ray==2.60.0`. This used the private `ray._private.worker._global_node.get_session_dir_path()`;
    Ray 2.60's public `RuntimeContext.get_temp_dir()` and `get_session_name()` give the same path
    (Ray's node joins exactly these two), so no private API is needed any more. The layout is
    pinned by `tests/test_private_apis.py`. Best effort: None when it cannot be found.
    """
    try:
        import ray

        context = ray.get_runtime_context()
        return os.path.join(context.get_temp_dir(), context.get_session_name())
    except Exception:  # best effort: only used to tidy up
        return None
