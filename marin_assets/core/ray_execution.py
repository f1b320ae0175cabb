"""Run a step's function on Ray with the resources it declares.

The status, lease and record stay with the Dagster process; only `fn(output_path)` goes to
Ray, as a streaming task that relays what the function prints and logs while it runs. A
multi-host TPU slice gets a light driver holding the slice's head resource, which fans out
one task per host. Requests no node can ever satisfy fail at once (`InfeasibleRequestError`)
instead of waiting forever; an interrupted run cancels its task.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from marin_assets.core.execute import run_in_process
from marin_assets.core.lease import LeaseLostError
from marin_assets.core.step import Resources, Step

PROGRESS_EVERY_S = 5.0
"""Carriage-return progress lines (tqdm) are relayed at most this often."""


class InfeasibleRequestError(RuntimeError):
    """No node of the cluster can ever run the step as requested."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a Ray worker, attached as its cause."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


# --- what a step asks of Ray ---------------------------------------------------------------

_SINGLE_CORE_TPUS = ("v5litepod", "v5e", "v6e")
_EIGHT_CHIP_HOST_TPUS = ("v5litepod", "v5e", "v6e")


def tpu_slice_shape(tpu_type: str) -> tuple[int, int]:
    """(total chips, chips per host) of a slice type, in Ray's terms.

    `v4-16` counts cores (2 per chip: 8 chips, 2 hosts of 4); `v5litepod-16`/`v6e-16`
    count chips; single-host v5e/v6e slices of up to 8 chips are one host.
    """
    generation, _, size = tpu_type.partition("-")
    if not size.isdigit():
        raise ValueError(f"TPU type must look like 'v4-16' or 'v6e-8', got {tpu_type!r}")
    chips = int(size) if generation.startswith(_SINGLE_CORE_TPUS) else max(1, int(size) // 2)
    per_host = chips if generation.startswith(_EIGHT_CHIP_HOST_TPUS) and chips <= 8 else min(4, chips)
    return chips, per_host


@dataclass(frozen=True)
class RayRequest:
    """Ray task options for one step (per host for a TPU slice)."""

    num_cpus: float
    num_gpus: float = 0
    memory: int | None = None
    accelerator_type: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    hosts: int = 1
    """More than one: a multi-host TPU slice, run by a driver holding `slice_head`."""
    slice_head: str | None = None

    @classmethod
    def of(cls, r: Resources) -> RayRequest:
        if r.tpu_type:
            chips, per_host = tpu_slice_shape(r.tpu_type)
            per_host = r.tpu_count or per_host
            hosts = max(1, chips // per_host)
            head = f"TPU-{r.tpu_type}-head"
            resources = {"TPU": float(per_host)}
            if hosts == 1:
                resources[head] = 1.0
            return cls(num_cpus=r.cpu, memory=_bytes(r.memory_gb), resources=resources, hosts=hosts, slice_head=head)
        return cls(num_cpus=r.cpu, num_gpus=r.gpu, memory=_bytes(r.memory_gb), accelerator_type=r.gpu_type)

    def task_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": 0}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.memory:
            options["memory"] = self.memory
        if self.accelerator_type:
            options["accelerator_type"] = self.accelerator_type
        if self.resources:
            options["resources"] = dict(self.resources)
        return options

    def per_node(self) -> dict[str, float]:
        """What one node must offer in total, in Ray's resource names."""
        need = {"CPU": self.num_cpus}
        if self.num_gpus:
            need["GPU"] = self.num_gpus
        if self.memory:
            need["memory"] = float(self.memory)
        if self.accelerator_type:
            need[f"accelerator_type:{self.accelerator_type}"] = 0.001
        need.update(self.resources)
        return {k: v for k, v in need.items() if v}

    def describe(self) -> str:
        need = _fmt(self.per_node())
        return f"{need} on each of {self.hosts} hosts of a {self.slice_head} slice" if self.hosts > 1 else need


def _bytes(gb: float | None) -> int | None:
    return int(gb * 2**30) if gb else None


def _fmt(resources: dict[str, float]) -> str:
    parts = []
    for k, v in sorted(resources.items()):
        if k.startswith("node:") or k == "object_store_memory":
            continue
        parts.append(f"{k}={v / 2**30:.1f}GiB" if k == "memory" else f"{k}={v:g}")
    return "{" + ", ".join(parts) + "}"


def check_feasible(step: Step, request: RayRequest, nodes: list[dict[str, float]]) -> None:
    """Raise `InfeasibleRequestError` if no alive node could ever run the request."""
    def fits(node: dict[str, float], need: dict[str, float]) -> bool:
        return all(node.get(k, 0.0) >= v for k, v in need.items())

    need = request.per_node()
    problems = []
    if not any(fits(n, need) for n in nodes):
        problems.append(f"needs {request.describe()} on one node")
    if request.hosts > 1 and not any(n.get(request.slice_head or "", 0) >= 1 for n in nodes):
        problems.append(f"needs a {request.slice_head} resource (a {request.hosts}-host slice)")
    if problems:
        offered = "; ".join(_fmt(n) for n in nodes) or "no alive nodes"
        raise InfeasibleRequestError(
            f"step {step.name!r} {' and '.join(problems)}, which this cluster can never provide."
            f" Nodes offer: {offered}. (On an autoscaling cluster set fail_fast=False on the ray resource.)"
        )


# --- on the worker ---------------------------------------------------------------------------

_DONE = object()


class _LineRelay(io.TextIOBase):
    """A text stream that passes lines to a queue (and on to the original stream)."""

    def __init__(self, lines: queue.Queue, original: Any):
        self.lines, self.original = lines, original
        self.buffer = ""
        self.last_progress = 0.0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.original.write(text)
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            line = line.rsplit("\r", 1)[-1].rstrip()
            if line:
                self.lines.put(line)
        if "\r" in self.buffer:
            *done, self.buffer = self.buffer.split("\r")
            latest = next((s.strip() for s in reversed(done) if s.strip()), "")
            if latest and time.monotonic() - self.last_progress >= PROGRESS_EVERY_S:
                self.last_progress = time.monotonic()
                self.lines.put(latest)
        return len(text)

    def flush(self) -> None:
        self.original.flush()


class _QueueHandler(logging.Handler):
    def __init__(self, lines: queue.Queue):
        super().__init__(logging.INFO)
        self.lines = lines
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.put(self.format(record))


@contextlib.contextmanager
def _relaying(lines: queue.Queue) -> Iterator[None]:
    root = logging.getLogger()
    handler, level = _QueueHandler(lines), root.level
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _LineRelay(lines, sys.stdout), _LineRelay(lines, sys.stderr)
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_relaying(step: Step, output_path: str, prefix: str, env: dict[str, str], host: int = 0) -> Iterator[tuple]:
    """Run the function in a thread; yield ("log", host, [lines]) as it prints, then ("result", host, value)."""
    lines: queue.Queue = queue.Queue()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = run_in_process(step, output_path, prefix)
        except BaseException as e:  # re-raised below, in the task's own thread
            box["error"] = e
        finally:
            lines.put(_DONE)

    with _environment(env), _relaying(lines):
        thread = threading.Thread(target=target, name=f"marin-step-{step.name}", daemon=True)
        thread.start()
        done = False
        while not done:
            batch = [lines.get()]
            deadline = time.monotonic() + 0.2
            while batch[-1] is not _DONE and time.monotonic() < deadline:
                try:
                    batch.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            done = batch[-1] is _DONE
            text = [b for b in batch if b is not _DONE]
            if text:
                yield ("log", host, text)
    if "error" in box:
        raise box["error"]
    yield ("result", host, box.get("value"))


def _remote_functions() -> tuple[Any, Any]:
    import ray

    @ray.remote(max_retries=0)
    def step_task(step: Step, output_path: str, prefix: str, env: dict[str, str], host: int = 0):
        yield from run_relaying(step, output_path, prefix, env, host)

    @ray.remote(max_retries=0)
    def slice_driver(step: Step, output_path: str, prefix: str, env: dict[str, str], request: RayRequest):
        """On worker 0 of a TPU slice: one task per host, pinned to this slice by its name."""
        from ray.util.tpu import get_current_pod_name

        pod = get_current_pod_name()
        if not pod:
            raise RuntimeError(f"slice driver for {step.name!r} is not on a TPU host (no TPU name)")
        options = request.task_options()
        options["resources"] = {**options.get("resources", {}), pod: 1}
        hosts = [step_task.options(**options).remote(step, output_path, prefix, env, host=i)
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


def _multiplex(generators: list, stop: threading.Event | None = None) -> Iterator[tuple]:
    """Items of several streaming generators as they come; errors propagate."""
    import ray

    pending = list(generators)
    while pending:
        if stop is not None and stop.is_set():
            raise LeaseLostError("lease lost while the step ran on Ray")
        ready, _ = ray.wait(pending, num_returns=1, timeout=0.5)
        for gen in ready:
            try:
                ref = next(gen)
            except StopIteration:
                pending.remove(gen)
                continue
            yield ray.get(ref)


# --- on the Dagster side ---------------------------------------------------------------------

def run_on_ray(step: Step, output_path: str, prefix: str, stop: threading.Event, ray_resource: Any, log: Any) -> Any:
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
            step, output_path, prefix, env, request)
    else:
        gen = step_task.options(name=name, **request.task_options()).remote(step, output_path, prefix, env)
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


def ray_runner(ray_resource: Any, log: Any) -> Callable[[Step, str, str, threading.Event], Any]:
    """A `run_fn` for `materialize_step` that runs on the given Ray resource."""
    return lambda step, output_path, prefix, stop: run_on_ray(step, output_path, prefix, stop, ray_resource, log)
