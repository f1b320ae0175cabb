"""Run a step's function on Ray with the resources it declares.

The status, lease and record stay with the calling process; only `fn(output_path)` goes to
Ray, as a streaming task that relays what the function prints and logs while it runs
(`relay`). A multi-host TPU slice gets a light driver holding the slice's head resource,
which fans out one task per host. Requests no node can ever satisfy fail at once
(`requests.InfeasibleRequestError`) instead of waiting forever; an interrupted run cancels
its task.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from marin_assets.core.lease import LeaseLostError
from marin_assets.core.step import Step
from marin_assets.execution.relay import StepCall, run_relaying
from marin_assets.execution.requests import RayRequest, check_feasible


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a Ray worker, attached as its cause."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _remote_functions() -> tuple[Any, Any]:
    import ray

    @ray.remote(max_retries=0)
    def step_task(call: StepCall, output_path: str, prefix: str, env: dict[str, str], host: int = 0):
        yield from run_relaying(call, output_path, prefix, env, host)

    @ray.remote(max_retries=0)
    def slice_driver(call: StepCall, output_path: str, prefix: str, env: dict[str, str], request: RayRequest):
        """On worker 0 of a TPU slice: one task per host, pinned to this slice by its name."""
        from ray.util.tpu import get_current_pod_name

        pod = get_current_pod_name()
        if not pod:
            raise RuntimeError(f"slice driver for {call.name!r} is not on a TPU host (no TPU name)")
        options = request.task_options()
        options["resources"] = {**options.get("resources", {}), pod: 1}
        hosts = [step_task.options(**options).remote(call, output_path, prefix, env, host=i)
                 for i in range(request.hosts)]
        try:
            result = None
            for kind, host, payload in _multiplex(hosts):
                if kind == "result":
                    result = payload if host == 0 else result
                else:
                    yield (kind, host, payload)
            yield ("result", 0, result)
        finally:
            for gen in hosts:
                ray.cancel(gen, force=True)

    return step_task, slice_driver


@functools.cache
def _remotes() -> tuple[Any, Any]:
    """The remote functions, defined once per process (and only once Ray is needed)."""
    return _remote_functions()


def _multiplex(generators: list[Any], stop: threading.Event | None = None) -> Iterator[tuple]:
    """Items of several streaming generators as they come; errors propagate."""
    import ray

    pending = list(generators)
    while pending:
        if stop is not None and stop.is_set():
            raise LeaseLostError("lease lost while the step ran on Ray")
        ready, _ = ray.wait(pending, num_returns=1, timeout=0.5)
        for gen in ready:
            try:
                ref = next(gen)  # type: ignore[arg-type]  # a streaming generator: Ray's stubs say ObjectRef
            except StopIteration:
                pending.remove(gen)
                continue
            yield ray.get(ref)


# --- on the Dagster side ---------------------------------------------------------------------

class RayConnection(Protocol):
    """Where to run: what the Dagster layer's Ray resource (or a test) provides."""

    fail_fast: bool
    """Reject at once a request no node can ever satisfy."""

    def connect(self) -> None:
        """Start or join Ray (once per process)."""

    def worker_env(self) -> dict[str, str]:
        """Environment variables every step's worker gets."""


def run_on_ray(step: Step, output_path: str, prefix: str, stop: threading.Event, ray_resource: RayConnection,
               log: Any) -> Any:
    """Run `step.fn(output_path)` on Ray; relay its output to `log`; return its result."""
    import ray
    from ray.exceptions import RaySystemError, RayTaskError, TaskCancelledError

    ray_resource.connect()
    request = RayRequest.of(step.resources)
    if ray_resource.fail_fast:
        check_feasible(step, request, [n["Resources"] for n in ray.nodes() if n.get("Alive")])
    env = {**ray_resource.worker_env(), "MARIN_PREFIX": prefix}
    step_task, slice_driver = _remotes()
    name = f"{step.name_with_hash}".replace("/", ".")
    if request.hosts > 1:
        gen = slice_driver.options(name=name, num_cpus=0, resources={request.slice_head: 1}).remote(
            StepCall.of(step), output_path, prefix, env, request)
    else:
        gen = step_task.options(name=name, **request.task_options()).remote(StepCall.of(step), output_path, prefix,
                                                                             env)
    log.info(f"{step.name}: running on Ray with {request.describe()}")
    try:
        for kind, host, payload in _multiplex([gen], stop):
            if kind == "log":
                tag = f"[{step.name}{f' host {host}' if request.hosts > 1 else ''}]"
                for line in payload:
                    log.info(f"{tag} {line}")
            elif kind == "result":
                return payload
        raise RuntimeError(f"step {step.name!r}: Ray task ended without a result")
    except RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
        if cause is None:
            raise
        if isinstance(cause, RaySystemError) and "No module named" in str(cause):
            raise ModuleNotFoundError(
                f"step {step.name!r}: its function cannot be imported on the Ray worker"
                f" ({str(cause).splitlines()[0]}). Install its package where Ray runs, or ship it with"
                " the ray resource's runtime_env (py_modules, working_dir or env_vars PYTHONPATH)."
            ) from RemoteTraceback(str(e))
        raise cause from RemoteTraceback(str(e))
    except TaskCancelledError:
        raise
    except BaseException as e:
        ray.cancel(gen, force=True)  # interrupted run or lost lease: stop the work, then fail
        log.warning(f"{step.name}: cancelled its Ray task ({type(e).__name__})")
        raise


def ray_runner(ray_resource: RayConnection, log: Any) -> Callable[[Step, str, str, threading.Event], Any]:
    """A `run_fn` for `materialize_step` that runs on the given Ray resource."""
    return lambda step, output_path, prefix, stop: run_on_ray(step, output_path, prefix, stop, ray_resource, log)
