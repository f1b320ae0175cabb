"""What a status means: the one place that decides reuse, wait, take over, rerun or block.

`decide` reads nothing and writes nothing: given the status object of one output (or none),
it says what a materialization of that output does and why. The lease acquisition, the
wait for dependencies and `marin-assets plan` all call it, so a dry run cannot disagree with
a run. `decide_output` adds the one thing that needs reading records: a `SUCCESS` whose
inputs changed since it was made is recomputed.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from marin_assets.core.record import ArtifactRecord, read_record
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.step import Step
from marin_assets.core.versions import changed_inputs


class Action(str, enum.Enum):
    """What a materialization of the output does."""

    REUSE = "reuse"
    """Serve the existing record: the function is not called."""
    WAIT = "wait"
    """A live holder is computing it: wait, then decide again."""
    RUN = "run"
    """Take the lease and compute (nothing there, a stale holder, FAILED, or a recompute)."""


class State(str, enum.Enum):
    """What the status object says about the output, before any request is considered."""

    MISSING = "missing"
    SUCCESS = "success"
    LIVE = "live"
    """RUNNING, with a heartbeat within the stale timeout."""
    STALE = "stale"
    """RUNNING, but the holder stopped renewing: presumed dead."""
    FAILED = "failed"


@dataclass(frozen=True)
class Decision:
    """What a materialization of one output does, the state it found, and why."""

    action: Action
    state: State
    reason: str
    """One line a person reads: what was found and what follows."""
    recompute: str | None = None
    """Why a `SUCCESS` is being made again, when it is."""

    @property
    def ready(self) -> bool:
        """As a dependency: its output can be read now."""
        return self.state is State.SUCCESS


def decide(status: StatusRecord | None, stale_timeout: float, *, recompute: str | None = None,
           now: float | None = None) -> Decision:
    """What to do about one output, given its status object.

    `recompute`: why a `SUCCESS` must be made again (forced by a person, inputs changed), or
    None. A live holder is waited for even then: what it makes is at least as new as the request.
    """
    now = time.time() if now is None else now
    if status is None:
        return Decision(Action.RUN, State.MISSING, "no output yet")
    if status.status is Status.SUCCESS:
        if recompute is not None:
            return Decision(Action.RUN, State.SUCCESS, f"recompute of SUCCESS: {recompute}", recompute)
        made_by = f" (made by run {status.run_id})" if status.run_id else ""
        return Decision(Action.REUSE, State.SUCCESS, f"SUCCESS{made_by}")
    if status.status is Status.FAILED:
        error = f" ({status.error})" if status.error else ""
        return Decision(Action.RUN, State.FAILED, f"previous attempt FAILED{error}")
    age = now - status.heartbeat
    if status.is_live(stale_timeout, now):
        return Decision(Action.WAIT, State.LIVE,
                        f"RUNNING by {status.holder} (run {status.run_id}), heartbeat {age:.0f}s ago")
    return Decision(Action.RUN, State.STALE, f"stale RUNNING by {status.holder}, no heartbeat for {age:.0f}s")


def decide_output(step: Step, output_path: str, status: StatusRecord | None, prefix: str, stale_timeout: float,
                  *, recompute: str | None = None) -> tuple[Decision, ArtifactRecord | None]:
    """`decide`, and for a `SUCCESS` also whether its inputs changed since it was made (then RUN).

    Returns the record read on the way for a reuse, so a cache hit reads it once.
    """
    decision = decide(status, stale_timeout, recompute=recompute)
    if decision.action is not Action.REUSE:
        return decision, None
    record = read_record(output_path, status=status)
    changed = changed_inputs(step, record, prefix)
    if changed:
        return decide(status, stale_timeout, recompute=f"inputs changed since it was made ({'; '.join(changed)})"), None
    return decision, record


def dependency_problem(dependency: Step, path: str, decision: Decision) -> str:
    """Why a dependency in this state cannot be read (for an error or a plan row)."""
    state = {State.MISSING: "not materialized", State.FAILED: decision.reason,
             State.STALE: f"{decision.reason} (its holder is gone)",
             State.LIVE: decision.reason, State.SUCCESS: "SUCCESS"}[decision.state]
    return f"dependency {dependency.name} has no successful output at {path} ({state})"
