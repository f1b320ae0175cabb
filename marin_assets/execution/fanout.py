"""Fan-out that never hangs: run `fn(item)` for many items on Ray tasks *and* in the calling process.

The classic nested fan-out (a step task holding a CPU submits one task per item and blocks in
`ray.get`) waits forever when no CPU is free for the item tasks: a small node, many steps
fanning out at once, or a lost node. Here the calling process is always one of the workers:

- every item is **claimed** before it is worked on, by a compare-and-swap on a status object
  at `claim_path_of(item)` (the lease protocol of `core.status`/`core.lease`: RUNNING with a
  heartbeat, then SUCCESS or FAILED, all tagged with this fan-out's run id);
- up to `workers - 1` Ray tasks take items from the front (one task per item, a sliding window),
  while the caller takes items from the back; each skips an item that is done or live-claimed;
- when the caller can claim nothing more it waits, in bounded slices, only for items that a
  live holder is working on; a task that never started loses its item to the caller and is
  cancelled (`ray.cancel`), so a Ray with no free CPU just means the caller does everything;
- a task that died (worker crash, node lost) leaves a RUNNING claim whose heartbeat stops: the
  caller takes it over and runs the item itself as soon as its holder is known dead (a claim made
  on a Ray worker names its node: that node is no longer alive, or the holder was a worker of the
  caller's own node that has exited), else once it is stale (`LeaseSettings.stale_timeout`), logging what it waits
  for. This is safe because `fn` must be resumable (e.g. `tokenize_file` continues from its ledger);
- before anything is submitted, a per-task request no alive node could ever satisfy fails at once
  (`InfeasibleRequestError`, naming the request and what every node offers).

A SUCCESS claim written by *this* fan-out means done; one left by an earlier fan-out is not
trusted for a result, so `fn` is called again (cheap for a resumable `fn` whose work is done).
A live RUNNING claim of an earlier fan-out (a task of a crashed run still writing) is waited for,
never run over; one whose node or process is gone (the run before lost a node) is taken over at once.
Errors in `fn` keep their type and get a note naming the item; the remaining tasks are cancelled
(the caller's own item in progress is finished first). Without a running Ray, or with
`workers <= 1`, it is a plain loop in process: no claims, no threads, no Ray import (this module
never imports Ray at module level).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from marin_assets.core.decision import Action, decide
from marin_assets.core.lease import Lease, LeaseLostError, LeaseSettings
from marin_assets.core.status import Status, StatusRecord, new_holder_id, process_alive
from marin_assets.core.stores import status_store
from marin_assets.execution.ray_runner import RemoteTraceback
from marin_assets.execution.requests import InfeasibleRequestError, RayRequest, _fmt

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

ONE_CPU = RayRequest(num_cpus=1)
"""The default request of one item's task."""

_DONE, _HELD = "done", "held"
_WAIT_LOG_EVERY_S = 30.0


def fan_out(items: Sequence[T], fn: Callable[[T], R], *, claim_path_of: Callable[[T], str], workers: int,
            request: RayRequest = ONE_CPU, settings: LeaseSettings = LeaseSettings(), fail_fast: bool = True,
            name: str = "fan-out", log: Any = None) -> list[R]:
    """`[fn(item) for item in items]`, computed by up to `workers` at once: this process and
    `workers - 1` Ray tasks asking for `request` each. Always makes progress, even with no free CPU.
    In process, in order, when Ray is not initialized in this process or `workers <= 1`.

    `claim_path_of(item)`: a folder (any fsspec path) holding the item's claim, distinct per item.
    `fn` must be resumable (safe to run again on an item whose earlier run died part-way), and it
    and the items must pickle when Ray is used. `settings`: the claims' heartbeat, stale timeout
    (how long before a dead task's item is taken over) and poll interval. `fail_fast=False` lets
    tasks wait for an autoscaler instead of failing on a request no current node can satisfy (the
    items are still done here meanwhile). `log`: anything with `info`/`warning` (a Dagster log).
    """
    items = list(items)
    paths = [claim_path_of(item) for item in items]
    if len(set(paths)) != len(paths):
        raise ValueError(f"{name}: claim_path_of must give each item its own path")
    if request.hosts > 1:
        raise ValueError(f"{name}: a fan-out task runs on one host, not a {request.hosts}-host slice")
    ray = _running_ray() if workers > 1 and len(items) > 1 else None
    if ray is None:
        return [_call_here(fn, index, item, name) for index, item in enumerate(items)]
    return _FanOut(items, fn, paths, workers, request, settings, fail_fast, name, log or logger, ray).run()


def _call_here(fn: Callable[[T], R], index: int, item: T, name: str) -> R:
    try:
        return fn(item)
    except BaseException as e:
        e.add_note(f"{name}: {_describe(index, item)} failed in the calling process")
        raise


def _running_ray() -> Any:
    """The `ray` module if Ray is initialized in this process (a driver or a worker), else None.

    Never imports Ray: a process that has not imported it has not started or joined a cluster.
    """
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def check_fan_out_feasible(name: str, request: RayRequest, nodes: list[dict[str, float]]) -> None:
    """Raise `InfeasibleRequestError` if no alive node could ever run one task of the fan-out."""
    need = request.per_node()
    if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
        return
    offered = "; ".join(_fmt(n) for n in nodes) or "no alive nodes"
    raise InfeasibleRequestError(
        f"{name}: each task needs {request.describe()} on one node, which this cluster can never provide."
        f" Nodes offer: {offered}. (Ask for less per task, or pass fail_fast=False on an autoscaling cluster.)"
    )


# --- claims ------------------------------------------------------------------------------------

def _try_claim(path: str, settings: LeaseSettings, run_id: str, *, success_is_done: bool,
               gone: Callable[[str], str | None] = lambda holder: None) -> Lease | str:
    """Take the claim on one item (a `Lease`), or say why not: `_DONE` or `_HELD`.

    Free to take: nothing there, FAILED, a stale RUNNING (its holder died), a RUNNING whose holder
    `gone` says is dead (its Ray node is gone, its worker on our node exited: no need to wait out
    the stale timeout), or a SUCCESS that does not count as done (another fan-out's, or ours when
    `success_is_done` is False). A lost race counts as held.
    """
    store = status_store(path)
    current, generation = store.read()
    foreign_success = current is not None and current.status is Status.SUCCESS and (
        current.run_id != run_id or not success_is_done)
    decision = decide(current, settings.stale_timeout,
                      recompute="not done by this fan-out" if foreign_success else None)
    reason = decision.reason
    if decision.action is Action.REUSE:
        return _DONE
    if decision.action is Action.WAIT:
        why = gone(current.holder) if current is not None else None
        if why is None:
            return _HELD
        reason = f"stale RUNNING by {current.holder if current else '?'}: {why}"
    mine = StatusRecord(Status.RUNNING, holder=_holder_id(), token=uuid.uuid4().hex, heartbeat=time.time(),
                        run_id=run_id)
    new_generation = store.write_if(generation, mine)
    if new_generation is None:
        return _HELD
    return Lease(store, mine, new_generation, settings, took_over=current, waited_s=0.0, reason=reason)


_NODE_TAG = "@ray-node:"


def _holder_id() -> str:
    """`host:pid:id`, plus `@ray-node:<id>` on a Ray worker, so a later fan-out can tell that the node
    holding a claim is gone instead of waiting out its stale timeout."""
    holder = new_holder_id()
    ray = _running_ray()
    if ray is not None:
        with contextlib.suppress(Exception):
            return f"{holder}{_NODE_TAG}{ray.get_runtime_context().get_node_id()}"
    return holder


class _GoneHolders:
    """Says when a claim's holder is certainly dead: its Ray node is no longer alive, or it was a worker
    of this process's own Ray node (same host, same process namespace) that has exited. Claims made
    outside Ray only go stale. Ray's node list is read at most once per `every` seconds."""

    def __init__(self, ray: Any, every: float):
        self.ray, self.every = ray, every
        self.alive: set[str] = set()
        self.read_at = -float("inf")
        self.own_node = ""
        with contextlib.suppress(Exception):
            self.own_node = ray.get_runtime_context().get_node_id()

    def __call__(self, holder: str) -> str | None:
        base, _, node = holder.partition(_NODE_TAG)
        if not node:
            return None
        if time.monotonic() - self.read_at > self.every:
            with contextlib.suppress(Exception):
                self.alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
                self.read_at = time.monotonic()
        if self.alive and node not in self.alive:
            return f"its Ray node {node[:12]} is dead"
        host, _, rest = base.partition(":")
        pid = rest.partition(":")[0]
        if node == self.own_node and host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
            return f"its process {pid} on this Ray node has exited"
        return None


def _run_claimed(fn: Callable[[Any], Any], item: Any, lease: Lease) -> Any:
    """`fn(item)` under a heartbeating claim, marked SUCCESS or FAILED; `LeaseLostError` if taken over."""
    lease.start_heartbeat()
    try:
        result = fn(item)
    except BaseException as e:
        with contextlib.suppress(Exception):
            lease.finish(Status.FAILED, error=f"{type(e).__name__}: {e}"[:2000])
        raise
    lease.finish(Status.SUCCESS)
    return result


def _remote_item(fn: Callable[[Any], Any], item: Any, path: str, run_id: str,
                 settings: LeaseSettings) -> tuple[str, Any]:
    """One item on a Ray worker: ("done", result), or ("skipped", None) when someone else has it."""
    claim = _try_claim(path, settings, run_id, success_is_done=True)
    if not isinstance(claim, Lease):
        return ("skipped", None)
    try:
        return ("done", _run_claimed(fn, item, claim))
    except LeaseLostError as e:
        logger.warning("%s", e)
        return ("skipped", None)


@functools.cache
def _item_task() -> Any:
    import ray

    return ray.remote(max_retries=0)(_remote_item)


def _describe(index: int, item: Any) -> str:
    text = repr(item)
    return f"item {index} ({text if len(text) <= 200 else text[:197] + '...'})"


# --- the caller's loop -------------------------------------------------------------------------

class _FanOut(Generic[T, R]):
    def __init__(self, items: list[T], fn: Callable[[T], R], paths: list[str], workers: int, request: RayRequest,
                 settings: LeaseSettings, fail_fast: bool, name: str, log: Any, ray: Any):
        self.items, self.fn, self.paths, self.request = items, fn, paths, request
        self.settings, self.fail_fast, self.name, self.log, self.ray = settings, fail_fast, name, log, ray
        self.slots = workers - 1
        self.run_id = f"fan-out-{uuid.uuid4().hex[:12]}"
        self.results: dict[int, R] = {}
        self.fresh = collections.deque(range(len(items)))
        """Items this process has not looked at yet: it takes them from the back while tasks take the front."""
        self.looked_at: set[int] = set()
        self.recheck_at: dict[int, float] = {}
        """Items seen claimed by another holder (or skipped by their task): when this process looks again."""
        self.inflight: dict[Any, int] = {}
        """Ray task (ObjectRef) → item index."""
        self.task_of: dict[int, Any] = {}
        self.next_submit = 0
        self.fn_ref: Any = None
        self.failure: BaseException | None = None
        """The first error of a task, raised once this process's own item (if any) is finished."""
        self.pump_s = min(1.0, settings.poll_interval)
        self.by_tasks = self.here = self.task_deaths = 0
        self.gone = _GoneHolders(ray, every=self.pump_s)
        self.waiting_logged_at = -float("inf")

    def run(self) -> list[R]:
        n = len(self.items)
        started = time.monotonic()
        if self.fail_fast:
            nodes = [node["Resources"] for node in self.ray.nodes() if node.get("Alive")]
            check_fan_out_feasible(self.name, self.request, nodes)
        self.fn_ref = self.ray.put(self.fn)
        self.log.info(f"{self.name}: {n} items, up to {self.slots} Ray tasks with {self.request.describe()}"
                      " and this process")
        try:
            self._submit_more()
            while len(self.results) < n:
                self._harvest(timeout=0)
                self._raise_failure()
                index = self._next_candidate()
                if index is not None:
                    self._try_here(index)
                else:
                    self._wait()
            self._raise_failure()
        finally:
            self._cancel(list(self.inflight))
        died = f", {self.task_deaths} tasks died" if self.task_deaths else ""
        self.log.info(f"{self.name}: {n} items done in {time.monotonic() - started:.1f}s, {self.by_tasks} by Ray"
                      f" tasks, {self.here} in this process{died}")
        return [self.results[i] for i in range(n)]

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    # -- items in this process

    def _next_candidate(self) -> int | None:
        """An item not looked at yet (from the back: tasks take the front, so the two rarely meet), else a
        held item due another look, else None."""
        while self.fresh:
            index = self.fresh.pop()
            self.looked_at.add(index)
            if index not in self.results and index not in self.recheck_at:
                return index
        now = time.monotonic()
        due = [(t, i) for i, t in self.recheck_at.items() if t <= now and i not in self.results]
        return min(due)[1] if due else None

    def _try_here(self, index: int) -> None:
        # Ours and SUCCESS counts as done only while its task may still deliver the result.
        claim = _try_claim(self.paths[index], self.settings, self.run_id, success_is_done=index in self.task_of,
                           gone=self.gone)
        if not isinstance(claim, Lease):
            self.recheck_at[index] = time.monotonic() + self.settings.poll_interval
            return
        self.recheck_at.pop(index, None)
        task = self.task_of.pop(index, None)
        if task is not None:  # it had not started (or it lost its claim): this process has the item now
            self.inflight.pop(task, None)
            self._cancel([task])
        item = self.items[index]
        before = claim.took_over
        if task is not None and before is not None and before.run_id == self.run_id \
                and before.status is Status.RUNNING:
            # This fan-out's own task held it and is dead or silent, seen here before Ray reported it.
            self.task_deaths += 1
            self.log.warning(f"{self.name}: the Ray task of {_describe(index, item)} died (its claim said so"
                             " before Ray did)")
        if claim.reason.startswith("stale"):
            self.log.warning(f"{self.name}: taking over {_describe(index, item)}: {claim.reason}")
        try:
            result = self._run_here(index, claim)
        except LeaseLostError as e:
            self.log.warning(f"{self.name}: {_describe(index, item)}: {e}; its new holder finishes it")
            self.recheck_at[index] = time.monotonic() + self.settings.poll_interval
            return
        except BaseException as e:
            e.add_note(f"{self.name}: {_describe(index, item)} failed in the calling process")
            raise
        self._done(index, result)
        self.here += 1

    def _done(self, index: int, result: R) -> None:
        self.results[index] = result
        self.recheck_at.pop(index, None)

    def _run_here(self, index: int, claim: Lease) -> R:
        """`fn` on one item here, in a thread while this one keeps taking the tasks' results and refilling
        their window (a long item here must not leave finished task slots idle)."""
        done: concurrent.futures.Future[R] = concurrent.futures.Future()

        def target() -> None:
            try:
                done.set_result(_run_claimed(self.fn, self.items[index], claim))
            except BaseException as e:
                done.set_exception(e)

        threading.Thread(target=target, name=f"{self.name} item {index}", daemon=True).start()
        while not done.done():
            if self.inflight:
                self._harvest(self.pump_s)
            else:
                concurrent.futures.wait([done])
        return done.result()

    def _wait(self) -> None:
        """Nothing to claim now: wait for a task's result or the next look at a held item (bounded)."""
        now = time.monotonic()
        held = sorted(i for i in self.recheck_at if i not in self.results)
        if held and now - self.waiting_logged_at >= _WAIT_LOG_EVERY_S:
            self.waiting_logged_at = now
            first = _describe(held[0], self.items[held[0]])
            self.log.warning(f"{self.name}: waiting for {len(held)} items (first: {first})"
                             " claimed by live holders (another run's tasks?); each is taken over once its holder"
                             f" is gone or silent for {self.settings.stale_timeout:g}s")
        due = min(self.recheck_at.values(), default=now)
        timeout = min(max(due - now, 0.01), self.settings.poll_interval)
        if self.inflight:
            self._harvest(timeout)
        else:
            time.sleep(timeout)

    # -- Ray tasks

    def _submit_more(self) -> None:
        task = _item_task() if self.failure is None else None
        while task is not None and len(self.inflight) < self.slots and self.next_submit < len(self.items):
            index = self.next_submit
            self.next_submit += 1
            if index in self.results or index in self.recheck_at or index in self.looked_at:
                continue  # done, being done here, or someone else holds it: this process looks after it
            ref = task.options(name=f"{self.name} item {index}", **self.request.task_options()).remote(
                self.fn_ref, self.items[index], self.paths[index], self.run_id, self.settings)
            self.inflight[ref] = index
            self.task_of[index] = ref

    def _harvest(self, timeout: float) -> None:
        """Take the results of finished tasks (waiting up to `timeout` for one), then refill the window."""
        if not self.inflight:
            return
        ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0)
        for ref in ready:
            index = self.inflight.pop(ref)
            self.task_of.pop(index, None)
            self._take(index, ref)
        if ready:
            self._submit_more()

    def _take(self, index: int, ref: Any) -> None:
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError

        item = self.items[index]
        try:
            kind, value = self.ray.get(ref, timeout=max(self.settings.poll_interval, 1.0))
        except TaskCancelledError:
            return
        except RayTaskError as e:
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
            cause.add_note(f"{self.name}: {_describe(index, item)} failed in a Ray task")
            if cause is not e:
                cause.__cause__ = RemoteTraceback(str(e))
            if self.failure is None:
                self.failure = cause
                self._cancel(list(self.inflight))  # stop the other tasks now; they mark their claims FAILED
                self.inflight.clear()
                self.task_of.clear()
            return
        except RayError as e:  # the worker or its node died: its claim goes stale, then it is taken over here
            self.task_deaths += 1
            self.log.warning(f"{self.name}: the Ray task of {_describe(index, item)} died ({type(e).__name__});"
                             " this process takes the item over once its claim is stale (no heartbeat for"
                             f" {self.settings.stale_timeout:g}s)")
            self.recheck_at[index] = time.monotonic()
            return
        if kind == "done" and index not in self.results:
            self._done(index, value)
            self.by_tasks += 1
        elif index not in self.results:
            self.recheck_at[index] = time.monotonic()  # skipped: whoever holds it, look again now

    def _cancel(self, refs: list[Any]) -> None:
        for ref in refs:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref)
