"""Materialize one step: status and lease protocol, the function, the record, then SUCCESS.

This is the whole exactly-once story in one place, read top to bottom in `materialize_step`;
the Dagster layer, tests and tools call it. Where the function runs is pluggable (`run_fn`): in this process by
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

from marin_assets.core.decision import Action, Decision, decide, decide_output, dependency_problem
from marin_assets.core.gc import GC_RUN_ID
from marin_assets.core.identity import canonical
from marin_assets.core.interrupt import stopping_on
from marin_assets.core.lease import Cached, Lease, LeaseLostError, LeaseSettings, acquire
from marin_assets.core.paths import normalize_prefix, storage_prefix, using_prefix
from marin_assets.core.prices import PriceTable
from marin_assets.core.pricing import Prediction, keep_sample, measured_after_run, predict_for_run
from marin_assets.core.provenance import current_provenance
from marin_assets.core.record import ArtifactRecord, RecordNotAvailableError, read_record, write_record
from marin_assets.core.results import encode_result, type_name
from marin_assets.core.status import LOCK_FILE, STATUS_FILE, Status, StatusRecord
from marin_assets.core.step import Step
from marin_assets.core.stores import StatusStore, read_status, status_store
from marin_assets.core.throughput import Sample
from marin_assets.core.versions import content_version, current_input_versions

logger = logging.getLogger(__name__)

RunFn = Callable[[Step, str, str, threading.Event], Any]
"""`run_fn(step, output_path, prefix, stop) -> result`: runs `step.fn(output_path)` somewhere,
stopping early (raising) if it can when `stop` is set — the lease was lost. A `run_fn` with a
`timing() -> (startup_s, work_s)` method (the execution layer's `StepRunner`) says, after a call, how
long went on making a place to run (starting Ray, a worker) and how long the function itself took:
the record keeps them apart (`startup_s`, `duration_s`)."""


class DependencyNotReadyError(RuntimeError):
    """A dependency has no successful output; the step cannot run."""


@dataclass(frozen=True)
class StepOutcome:
    """What materializing a step did: where the output is, its record, cached or computed, how long."""

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
    """Why this run replaced an existing status: `stale RUNNING by host:pid:id, …`,
    `previous attempt FAILED (…)`, `recompute of SUCCESS: forced by …`; None for a fresh output."""


def run_in_process(step: Step, output_path: str, prefix: str, stop: threading.Event | None = None) -> Any:
    """Call the step's function here, with the prefix in effect for its deps' paths.

    When `stop` is set (the lease was lost) the function is stopped where it is (`core/interrupt.py`);
    either way nothing is committed by a holder that lost its lease.
    """
    with stopping_on(stop), using_prefix(prefix):
        return step.fn(output_path)


def materialize_step(
    step: Step,
    *,
    prefix: str | None = None,
    settings: LeaseSettings = LeaseSettings(),
    run_id: str | None = None,
    recompute: str | None = None,
    run_fn: RunFn = run_in_process,
    log: Any = logger,
) -> StepOutcome:
    """Make sure `step`'s output exists, computing it here only if no one else has or is.

    `recompute`: why an existing `SUCCESS` must be made again (e.g. `forced by run config`);
    None reuses it — unless its inputs changed since it was made, which is then the reason.
    """
    started = time.monotonic()
    prefix = normalize_prefix(prefix) if prefix else storage_prefix()
    out = step.output_path_under(prefix)
    store = status_store(out)

    # 1. A cache hit is one status read and one record read.
    decision, record = _look(step, out, store, prefix, settings, recompute)
    if record is not None:
        return StepOutcome(step, out, record, cached=True, duration_s=time.monotonic() - started, waited_s=0.0)
    if decision.recompute is not None:
        recompute = decision.recompute
        log.info(f"{step.name}: {decision.reason}")

    # 2. Every dependency has a successful output (a live holder of one is waited for).
    wait_for_dependencies(step, prefix, settings, log)

    # 3. Take the lease — or find that a holder we waited for made the output.
    def on_wait(holder: StatusRecord) -> None:
        log.info(f"{step.name}: waiting for {holder.holder} (run {holder.run_id}) computing {out}")

    lease = acquire(store, settings, run_id=run_id, recompute=recompute, on_wait=on_wait)
    if isinstance(lease, Cached):
        return StepOutcome(step, out, read_record(out), cached=True,
                           duration_s=time.monotonic() - started, waited_s=lease.waited_s)
    took_over = lease.reason if lease.took_over is not None else None
    replaces_success = lease.took_over is not None and lease.took_over.status is Status.SUCCESS
    # an interrupted `marin-assets gc` deletion (core/gc.py) left a half-deleted folder: never resume on it
    half_deleted = lease.took_over is not None and lease.took_over.run_id == GC_RUN_ID
    if took_over:
        log.info(f"{step.name}: taking over {out} ({took_over})")

    # 4. Compute, record, then SUCCESS — or FAILED; a lost lease commits nothing.
    record = compute_and_commit(step, out, prefix, lease, run_fn, run_id, log,
                                clear_first=(replaces_success or half_deleted) and step.override_output_path is None)
    return StepOutcome(step, out, record, cached=False, duration_s=time.monotonic() - started,
                       waited_s=lease.waited_s, took_over=took_over)


def _look(step: Step, out: str, store: StatusStore, prefix: str, settings: LeaseSettings,
          recompute: str | None) -> tuple[Decision, ArtifactRecord | None]:
    """`decide_output` on the current status; if the record of a SUCCESS went missing because the status
    changed meanwhile (`marin-assets gc` deleting the output), look once more at what is there now."""
    status = store.read()[0]
    try:
        return decide_output(step, out, status, prefix, settings.stale_timeout, recompute=recompute)
    except RecordNotAvailableError:
        now = store.read()[0]
        if now == status:
            raise  # still SUCCESS without its record: a damaged output, said as such
        return decide_output(step, out, now, prefix, settings.stale_timeout, recompute=recompute)


def compute_and_commit(step: Step, out: str, prefix: str, lease: Lease, run_fn: RunFn, run_id: str | None,
                       log: Any, clear_first: bool) -> ArtifactRecord:
    """Holding `lease`: run the function, write the record, mark SUCCESS (or FAILED and re-raise)."""
    try:
        if clear_first:
            _clear_output(out)
        lease.start_heartbeat()
        inputs = current_input_versions(step, prefix)
        source = step.source_version() if step.source_version is not None else None  # before the copy
        prediction, prices = _predict(step, prefix, log)
        fn_started = time.monotonic()
        result = run_fn(step, out, prefix, lease.lost)
        fn_duration = time.monotonic() - fn_started
        timing = getattr(run_fn, "timing", None)  # a runner that knows: (start-up, the function's own time)
        startup_s, work_s = timing() if timing is not None else (0.0, None)
        fn_duration = fn_duration - startup_s if work_s is None else work_s
        result_json = encode_result(step.name, result)
        compared, sample = _measured(step, prefix, fn_duration, result_json, prediction, prices, log)
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
            startup_s=round(startup_s, 3),
            content_version=content_version(source, inputs),
            input_versions=inputs,
            prediction=compared,
        )
        write_record(out, record)
        lease.finish(Status.SUCCESS)
        _keep_sample(prefix, sample, log)
        return record
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


def _predict(step: Step, prefix: str, log: Any) -> tuple[Prediction | None, PriceTable | None]:
    """The prediction to record beside the actual numbers; None (and a warning) if it cannot be made: a
    prediction is advice and never fails a step."""
    try:
        return predict_for_run(step, prefix)
    except Exception as e:
        log.warning(f"{step.name}: no prediction recorded ({type(e).__name__}: {e})")
        return None, None


def _measured(step: Step, prefix: str, seconds: float, result: Any, prediction: Prediction | None,
              prices: PriceTable | None, log: Any) -> tuple[dict[str, Any] | None, Sample | None]:
    try:
        return measured_after_run(step, prefix, seconds, result, prediction, prices)
    except Exception as e:
        log.warning(f"{step.name}: predicted and actual not compared ({type(e).__name__}: {e})")
        return None, None


def _keep_sample(prefix: str, sample: Sample | None, log: Any) -> None:
    """Keep the run's throughput for later predictions (`core/throughput.py`); a failure only loses the sample."""
    if sample is None:
        return
    try:
        keep_sample(prefix, sample)
    except Exception as e:
        log.warning(f"{sample.step}: throughput sample not kept ({type(e).__name__}: {e})")


def wait_for_dependencies(step: Step, prefix: str, settings: LeaseSettings, log: Any) -> None:
    """Every dependency must be SUCCESS; a live holder of one is waited for, anything else is an error."""
    for dep in step.deps:
        path = dep.output_path_under(prefix)
        logged = False
        while (decision := decide(read_status(path), settings.stale_timeout)).action is Action.WAIT:
            if not logged:
                log.info(f"{step.name}: waiting for dependency {dep.name} ({decision.reason})")
                logged = True
            time.sleep(settings.poll_interval)
        if not decision.ready:
            raise DependencyNotReadyError(f"{step.name}: {dependency_problem(dep, path, decision)};"
                                          f" materialize it first, e.g. --select '+{step.name}'")


def _clear_output(out: str) -> None:
    """Remove a previous output before a forced recompute; the status object stays."""
    fs, path = fsspec.core.url_to_fs(out)
    if not fs.exists(path):
        return
    for entry in fs.ls(path, detail=False):
        if entry.rstrip("/").rsplit("/", 1)[-1] in (STATUS_FILE, LOCK_FILE):
            continue
        fs.rm(entry, recursive=True)
