"""Materialize one step: status and lease protocol, the function, the record, then SUCCESS.

This is the whole exactly-once story in one place; the Dagster adapter, tests and tools call
`materialize_step`. Where the function runs is pluggable (`run_fn`): in this process by
default, a Ray task when an execution resource supplies one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec

from marin_assets.core.identity import canonical
from marin_assets.core.lease import Cached, LeaseLostError, LeaseSettings, acquire
from marin_assets.core.paths import normalize_prefix, storage_prefix, using_prefix
from marin_assets.core.provenance import current_provenance
from marin_assets.core.record import (
    ArtifactRecord,
    read_record,
    to_jsonable,
    type_name,
    write_record,
)
from marin_assets.core.status import (
    LOCK_FILE,
    STATUS_FILE,
    Status,
    StatusRecord,
    read_status,
    status_store,
)
from marin_assets.core.step import Step
from marin_assets.core.versions import changed_inputs, content_version, current_input_versions

logger = logging.getLogger(__name__)

RunFn = Callable[[Step, str, str, threading.Event], Any]
"""`run_fn(step, output_path, prefix, stop) -> result`: runs `step.fn(output_path)` somewhere,
stopping early (raising) if it can when `stop` is set — the lease was lost."""


class DependencyNotReadyError(RuntimeError):
    """A dependency has no successful output; the step cannot run."""


class StepResultError(TypeError):
    """The step function returned a value that cannot be recorded."""


@dataclass(frozen=True)
class StepOutcome:
    step: Step
    output_path: str
    record: ArtifactRecord
    cached: bool
    """True when the output already existed (or another process made it while we waited)."""
    duration_s: float
    """Wall time of this materialization, waiting included."""
    waited_s: float
    """Time spent waiting for another holder."""
    took_over: str | None = None
    """What this run replaced: e.g. `stale RUNNING by host:pid:id`, `FAILED`, `forced SUCCESS`."""


def run_in_process(step: Step, output_path: str, prefix: str, stop: threading.Event | None = None) -> Any:
    """Call the step's function here, with the prefix in effect for its deps' paths.

    A thread cannot be stopped from outside, so `stop` is not watched here; a lost lease is
    still caught before anything is committed.
    """
    with using_prefix(prefix):
        return step.fn(output_path)


def materialize_step(
    step: Step,
    *,
    prefix: str | None = None,
    settings: LeaseSettings = LeaseSettings(),
    run_id: str | None = None,
    force: bool = False,
    run_fn: RunFn = run_in_process,
    log: Any = logger,
) -> StepOutcome:
    """Make sure `step`'s output exists, computing it here only if no one else has or is."""
    started = time.monotonic()
    prefix = normalize_prefix(prefix) if prefix else storage_prefix()
    out = step.output_path_under(prefix)
    store = status_store(out)

    current = store.read()[0]
    stale_inputs: list[str] = []
    if current is not None and current.status is Status.SUCCESS and not force:  # the common case: a cache hit
        record = read_record(out, status=current)
        stale_inputs = changed_inputs(step, record, prefix)
        if not stale_inputs:
            return StepOutcome(step, out, record, cached=True,
                               duration_s=time.monotonic() - started, waited_s=0.0)
        log.info(f"{step.name}: inputs changed since {out} was made ({'; '.join(stale_inputs)}); recomputing")
        force = True
    _wait_for_deps(step, prefix, settings, log)

    def on_wait(holder) -> None:
        log.info(f"{step.name}: waiting for {holder.holder} (run {holder.run_id}) computing {out}")

    lease = acquire(store, settings, run_id=run_id, force=force, on_wait=on_wait)
    if isinstance(lease, Cached):
        record = read_record(out)
        return StepOutcome(step, out, record, cached=True,
                           duration_s=time.monotonic() - started, waited_s=lease.waited_s)

    took_over = _describe_takeover(lease.took_over)
    if stale_inputs and took_over and took_over.startswith("forced"):
        took_over = f"inputs changed: {'; '.join(stale_inputs)}"
    if took_over:
        log.info(f"{step.name}: taking over {out} ({took_over})")
    try:
        if force and step.override_output_path is None:
            _clear_output(out)
        lease.start_heartbeat()
        inputs = current_input_versions(step, prefix)
        source = step.source_version() if step.source_version is not None else None  # before the copy
        fn_started = time.monotonic()
        result = run_fn(step, out, prefix, lease.lost)
        fn_duration = time.monotonic() - fn_started
        try:
            result_json = to_jsonable(result)
        except TypeError as e:
            raise StepResultError(f"step {step.name!r}: {e}; return a dataclass, pydantic model"
                                  " or plain JSON value") from None
        lease.renew()
        record = ArtifactRecord(
            name=step.name,
            hash=step.hash,
            hash_attrs=canonical(step.hash_attrs),
            deps=[d.name_with_hash for d in step.deps],
            output_path=out,
            result=result_json,
            result_type=type_name(result),
            provenance=current_provenance(run_id),
            duration_s=round(fn_duration, 3),
            content_version=content_version(source, inputs),
            input_versions=inputs,
        )
        write_record(out, record)
        lease.finish(Status.SUCCESS)
    except LeaseLostError:
        lease.stop_heartbeat()
        log.error(f"{step.name}: lost the lease on {out}; this run's work is not committed")
        raise
    except BaseException as e:
        if isinstance(e, Exception):
            e.add_note(f"(while materializing step {step.name!r} at {out})")
        try:
            lease.finish(Status.FAILED, error=f"{type(e).__name__}: {e}"[:1000])
        except LeaseLostError:
            log.error(f"{step.name}: lease on {out} was lost while failing")
        except Exception:
            log.exception(f"{step.name}: could not write FAILED to {out}")
        raise
    return StepOutcome(step, out, record, cached=False, duration_s=time.monotonic() - started,
                       waited_s=lease.waited_s, took_over=took_over)


def _wait_for_deps(step: Step, prefix: str, settings: LeaseSettings, log: Any) -> None:
    """Every dependency must be SUCCESS; a live holder of one is waited for."""
    for dep in step.deps:
        path = dep.output_path_under(prefix)
        logged = False
        while True:
            status = read_status(path)
            if status is not None and status.is_live(settings.stale_timeout):
                if not logged:
                    log.info(f"{step.name}: waiting for dependency {dep.name} ({status.holder})")
                    logged = True
                time.sleep(settings.poll_interval)
                continue
            break
        if status is None or status.status is not Status.SUCCESS:
            state = "not materialized" if status is None else status.status.value
            if status is not None and status.status is Status.RUNNING:
                state = f"RUNNING with a stale heartbeat (holder {status.holder} is gone)"
            if status is not None and status.error:
                state += f": {status.error}"
            raise DependencyNotReadyError(
                f"{step.name}: dependency {dep.name} has no successful output at {path}"
                f" ({state}); materialize it first, e.g. --select '+{step.name}'"
            )


def _describe_takeover(previous: StatusRecord | None) -> str | None:
    if previous is None:
        return None
    if previous.status is Status.SUCCESS:
        return "forced recompute of SUCCESS"
    if previous.status is Status.FAILED:
        return f"previous attempt FAILED: {previous.error}" if previous.error else "previous attempt FAILED"
    age = time.time() - previous.heartbeat
    return f"stale RUNNING by {previous.holder}, no heartbeat for {age:.0f}s"


def _clear_output(out: str) -> None:
    """Remove a previous output before a forced recompute; the status object stays."""
    fs, path = fsspec.core.url_to_fs(out)
    if not fs.exists(path):
        return
    for entry in fs.ls(path, detail=False):
        if entry.rstrip("/").rsplit("/", 1)[-1] in (STATUS_FILE, LOCK_FILE):
            continue
        fs.rm(entry, recursive=True)
