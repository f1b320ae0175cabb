"""Run a step's function on Ray with the resources it declares — or, for a light step, right here.

The status, lease and record stay with the calling process; only `fn(output_path)` goes to
Ray, as a streaming task that relays what the function prints and logs while it runs
(`relay`). A light step (its function marked `core.light.light`, plain CPU resources) runs in
the calling process when the Ray is embedded, so a run of light steps never starts Ray
(`StepRunner`); starting or joining Ray is timed apart from the step's own work. A multi-host
TPU slice gets a small driver holding the slice's head resource, which fans out one task per
host; a step asking for several hosts otherwise (`Resources.hosts`: GPU nodes, CPU hosts) gets a placement
group of that many distinct nodes, all or none, and one task per host told its place (`core.hosts`): host 0's
address and a free port for JAX's coordinator, the process count and its id. Host 0's result is the step's.
Requests no node can ever satisfy fail at once (`requests.InfeasibleRequestError`)
instead of waiting forever; an interrupted run cancels its task.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from marin_assets.core.hosts import HostPlace
from marin_assets.core.interrupt import stopping_on
from marin_assets.core.lease import LeaseLostError
from marin_assets.core.light import is_light
from marin_assets.core.step import Resources, Step
from marin_assets.execution.relay import StepCall, call_relaying, run_relaying
from marin_assets.execution.requests import RayRequest, check_feasible


class HostLostError(RuntimeError):
    """A host of a multi-host step died (its node or its worker) while the step ran."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a Ray worker, attached as its cause."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _remote_functions() -> tuple[Any, Any, Any, Any]:
    import ray

    @ray.remote(max_retries=0)
    def step_task(call: StepCall, output_path: str, prefix: str, env: dict[str, str], host: int = 0):
        yield from run_relaying(call, output_path, prefix, env, host)

    @ray.remote(max_retries=0, max_calls=1)
    def host_task(call: StepCall, output_path: str, prefix: str, env: dict[str, str], host: int = 0):
        """One host of a placed multi-host step; its worker then exits (JAX joins a distributed program once
        per process: a reused worker could not join the next)."""
        yield from run_relaying(call, output_path, prefix, env, host)

    @ray.remote(max_retries=0)
    def coordinator_address() -> str:
        """`ip:port` on the node of host 0: its address in the cluster and a port free there now."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

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

    return step_task, slice_driver, host_task, coordinator_address


@functools.cache
def _remotes() -> tuple[Any, Any, Any, Any]:
    """The remote functions, defined once per process (and only once Ray is needed)."""
    return _remote_functions()


def _multiplex(generators: list[Any], stop: threading.Event | None = None,
               failed: Callable[[int, BaseException], BaseException] | None = None) -> Iterator[tuple]:
    """Items of several streaming generators as they come; errors propagate (as `failed(index, error)` says,
    when given: which generator failed)."""
    import ray

    pending = list(generators)
    while pending:
        if stop is not None and stop.is_set():
            raise LeaseLostError("lease lost while the step ran on Ray")
        ready, _ = ray.wait(pending, num_returns=1, timeout=0.5)
        for gen in ready:
            try:
                ref = next(gen)  # type: ignore[arg-type]  # a streaming generator: Ray's stubs say ObjectRef
                item = ray.get(ref)
            except StopIteration:
                pending.remove(gen)
                continue
            except BaseException as e:
                said = e if failed is None else failed(generators.index(gen), e)
                if said is e:
                    raise
                raise said from e
            yield item


# --- on the Dagster side ---------------------------------------------------------------------

class RayConnection(Protocol):
    """Where to run: what the Dagster layer's Ray resource (or a test) provides."""

    fail_fast: bool
    """Reject at once a request no node can ever satisfy."""

    def connect(self) -> None:
        """Start or join Ray (once per process)."""

    def worker_env(self) -> dict[str, str]:
        """Environment variables every step's worker gets."""


def runs_in_process(step: Step, ray_resource: Any) -> bool:
    """Whether `step` runs in the calling process rather than as a Ray task: its function is marked
    light, it asks for no more than one CPU (no memory reservation, GPU or TPU), and the resource
    is an embedded Ray that lets light steps run here (`light_steps_in_process`). On a cluster
    every step is a Ray task: the workers have the runtime_env, the Dagster process may not."""
    r = step.resources
    plain = r.cpu <= Resources().cpu and r.memory_gb is None and not r.gpu and not r.tpu_type
    return (plain and is_light(step.fn) and bool(getattr(ray_resource, "embedded", False))
            and bool(getattr(ray_resource, "light_steps_in_process", False)))


def run_here(step: Step, output_path: str, prefix: str, ray_resource: RayConnection, log: Any,
             stop: threading.Event | None = None) -> Any:
    """Run a light step's function in this process, with the workers' environment (the resource's
    `env_vars`, `MARIN_PREFIX`), relaying what it prints and logs to `log` as on Ray; stopped where it is
    when `stop` is set (the lease was lost)."""
    env = {**ray_resource.worker_env(), "MARIN_PREFIX": prefix}
    tag = f"[{step.name}]"

    def emit(lines: list[str]) -> None:
        for line in lines:
            log.info(f"{tag} {line}")

    with stopping_on(stop):
        return call_relaying(StepCall.of(step), output_path, prefix, env, emit)


def run_on_ray(step: Step, output_path: str, prefix: str, stop: threading.Event, ray_resource: RayConnection,
               log: Any, timing: dict[str, float] | None = None) -> Any:
    """Run `step.fn(output_path)` on Ray; relay its output to `log`; return its result.

    `timing`, when given, gets `wait_s` (from submitting the task until host 0 started it: a worker
    spawned, the function imported) and `work_s` (the function's own wall time on host 0)."""
    import ray
    from ray.exceptions import RaySystemError, RayTaskError, TaskCancelledError

    ray_resource.connect()
    request = RayRequest.of(step.resources)
    if ray_resource.fail_fast:
        check_feasible(step, request, [n["Resources"] for n in ray.nodes() if n.get("Alive")])
    env = {**ray_resource.worker_env(), "MARIN_PREFIX": prefix}
    step_task, slice_driver, _, _ = _remotes()
    name = f"{step.name_with_hash}".replace("/", ".")
    if request.placed:
        return _run_placed(step, output_path, prefix, stop, env, request, name, log, timing)
    if request.hosts > 1:
        gen = slice_driver.options(name=name, num_cpus=0, resources={request.slice_head: 1}).remote(
            StepCall.of(step), output_path, prefix, env, request)
    else:
        gen = step_task.options(name=name, **request.task_options()).remote(StepCall.of(step), output_path, prefix,
                                                                             env)
    submitted = time.monotonic()
    log.info(f"{step.name}: running on Ray with {request.describe()}")
    try:
        for kind, host, payload in _multiplex([gen], stop):
            if timing is not None and host == 0 and kind == "started":
                timing["wait_s"] = time.monotonic() - submitted
            elif timing is not None and host == 0 and kind == "work":
                timing["work_s"] = payload
            elif kind == "log":
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


PLACEMENT_LOG_EVERY_S = 60.0
"""While a placement group waits for nodes (an autoscaler adding them), say so this often."""


def _run_placed(step: Step, output_path: str, prefix: str, stop: threading.Event, env: dict[str, str],
                request: RayRequest, name: str, log: Any, timing: dict[str, float] | None) -> Any:
    """A step on `request.hosts` distinct nodes: a STRICT_SPREAD placement group (all hosts or none), host 0's
    coordinator address, then one task per host; host 0's result. Any host failing (its node lost, its error)
    fails the step at once and stops the others; the group is removed either way."""
    import ray
    from ray.exceptions import RayTaskError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    _, _, host_task, coordinator_address = _remotes()
    group = placement_group([request.per_node()] * request.hosts, strategy="STRICT_SPREAD", name=name)
    submitted = time.monotonic()
    gens: list[Any] = []
    try:
        waited_logged = submitted
        while True:
            ready, _ = ray.wait([group.ready()], timeout=0.5)
            if ready:
                break
            if stop.is_set():
                raise LeaseLostError("lease lost while the step waited for its hosts")
            if time.monotonic() - waited_logged >= PLACEMENT_LOG_EVERY_S:
                waited_logged = time.monotonic()
                log.info(f"{step.name}: waiting for {request.describe()} ({waited_logged - submitted:.0f} s so far)")

        def on(host: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=host)

        coordinator = ray.get(coordinator_address.options(num_cpus=0, scheduling_strategy=on(0)).remote())
        log.info(f"{step.name}: running on Ray with {request.describe()}; JAX coordinator at {coordinator}")
        options = {k: v for k, v in request.task_options().items() if k != "max_retries"}
        call = StepCall.of(step)
        for host in range(request.hosts):
            place = HostPlace(process_id=host, processes=request.hosts, coordinator=coordinator)
            gens.append(host_task.options(name=f"{name} host {host}", scheduling_strategy=on(host), **options)
                        .remote(call, output_path, prefix, {**env, **place.env()}, host))
        result, finished = None, False
        def failed(host: int, error: BaseException) -> BaseException:
            if isinstance(error, RayTaskError):
                return error  # the function's own error, raised as it is below
            return HostLostError(f"step {step.name!r}: host {host} of {request.hosts} was lost"
                                 f" ({type(error).__name__}: {_first_sentences(error)}); the step's other"
                                 " hosts were stopped. A retry resumes from its last checkpoint.")

        for kind, host, payload in _multiplex(gens, stop, failed):
            if timing is not None and host == 0 and kind == "started":
                timing["wait_s"] = time.monotonic() - submitted
            elif timing is not None and host == 0 and kind == "work":
                timing["work_s"] = payload
            elif kind == "log":
                for line in payload:
                    log.info(f"[{step.name} host {host}] {line}")
            elif kind == "result" and host == 0:
                result, finished = payload, True
        if not finished:
            raise RuntimeError(f"step {step.name!r}: host 0's Ray task ended without a result")
        return result
    except RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
        if cause is None:
            raise
        raise cause from RemoteTraceback(str(e))
    except BaseException as e:
        if gens:
            log.warning(f"{step.name}: stopping its {request.hosts} hosts' Ray tasks ({type(e).__name__})")
        raise
    finally:
        for gen in gens:
            ray.cancel(gen, force=True)  # the hosts still in a collective with a failed one would wait forever
        remove_placement_group(group)


def _first_sentences(error: BaseException, count: int = 2) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return ". ".join(text.split(". ")[:count]).rstrip(".") + "."


class StepRunner:
    """A `run_fn` for `materialize_step`: a light step in this process, any other as a Ray task.

    It times each call in two parts (`timing()`): the start-up — starting or joining Ray, then
    waiting until a worker has started the function (a fresh Ray spawns one) — and the function's
    own work, measured where it runs. Ray is started at most once per process (the resource keeps
    it), never for a light step.
    """

    def __init__(self, ray_resource: RayConnection, log: Any):
        self.ray_resource, self.log = ray_resource, log
        self.startup_s = 0.0
        """Start-up of the last call: Ray start or connect plus the wait for a worker (0 in process)."""
        self.work_s: float | None = None
        """The last call's function's own wall time (None: it did not finish)."""
        self.ran_in: str | None = None
        """Where the last step ran: `process` or `ray`."""

    def runs_here(self, step: Step) -> bool:
        return runs_in_process(step, self.ray_resource)

    def prepare(self, step: Step) -> float:
        """Start or join Ray unless `step` runs here or Ray is up; the seconds it took."""
        if self.runs_here(step):
            return 0.0
        started = time.monotonic()
        self.ray_resource.connect()
        seconds = time.monotonic() - started
        if seconds >= 0.05:
            self.log.info(f"{step.name}: Ray ready after {seconds:.1f} s (start-up, not the step's work)")
        return seconds

    def timing(self) -> tuple[float, float | None]:
        """(start-up, the function's own time) of the last call, in seconds."""
        return self.startup_s, self.work_s

    def __call__(self, step: Step, output_path: str, prefix: str, stop: threading.Event) -> Any:
        self.startup_s, self.work_s = 0.0, None
        if self.runs_here(step):
            self.ran_in = "process"
            self.log.info(f"{step.name}: running in this process (a light step: no Ray needed)")
            started = time.monotonic()
            result = run_here(step, output_path, prefix, self.ray_resource, self.log, stop)
            self.work_s = time.monotonic() - started
            return result
        self.ran_in = "ray"
        self.startup_s = self.prepare(step)
        timing: dict[str, float] = {}
        try:
            return run_on_ray(step, output_path, prefix, stop, self.ray_resource, self.log, timing)
        finally:
            self.startup_s += timing.get("wait_s", 0.0)
            self.work_s = timing.get("work_s")


def ray_runner(ray_resource: RayConnection, log: Any) -> StepRunner:
    """A `run_fn` for `materialize_step` that runs on the given Ray resource (light steps here)."""
    return StepRunner(ray_resource, log)
