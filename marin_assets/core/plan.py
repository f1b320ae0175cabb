"""Plan: what materializing a selection would do, and why, without doing anything.

For each selected step and what it depends on: the output path, the hash, and the action
(`run`, `reuse`, `wait` for a live holder, `blocked` by a dependency) with a reason. When the
Dagster instance's last materialization of an asset had a different hash, `changed` names
the hash_attrs (and dependencies) that differ, from the record at the old output path.
Read-only: it reads status objects and records, never creates a directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from marin_assets.core.decision import Action, decide, decide_output
from marin_assets.core.identity import canonical
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.step import Step, walk
from marin_assets.core.stores import read_status

RUN, REUSE, WAIT = Action.RUN.value, Action.REUSE.value, Action.WAIT.value
BLOCKED = "blocked"


@dataclass(frozen=True)
class PreviousMaterialization:
    """What the Dagster instance remembers of an asset's last materialization."""

    hash: str | None
    output_path: str | None
    hash_attrs: dict[str, Any] | None
    deps: list[str] | None


@dataclass(frozen=True)
class PlanRow:
    """One asset of a plan: its output path and hash, what a run would do, and why."""

    asset_key: str
    output_path: str
    hash: str
    action: str
    reason: str
    selected: bool
    status: str | None
    changed: list[dict[str, Any]] = field(default_factory=list)
    previous_hash: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    steps: Sequence[Step],
    selected: set[str],
    prefix: str,
    settings: LeaseSettings = LeaseSettings(),
    previous: Mapping[str, PreviousMaterialization] | None = None,
) -> list[PlanRow]:
    """Rows for `steps` named in `selected` and their upstream closure, dependencies first.

    Each output's action is `decision.decide_output`'s — what a materialization would do;
    a step that would run but is not selected, or whose dependency cannot be made, is blocked.
    """
    previous = previous or {}
    wanted = [s for s in walk(steps) if s.name in selected]
    rows: dict[str, PlanRow] = {}
    for step in walk(wanted):
        out = step.output_path_under(prefix)
        status = read_status(out)
        is_selected = step.name in selected
        try:
            decision = decide_output(step, out, status, prefix, settings.stale_timeout)[0]
        except (RecordNotAvailableError, OSError, ValueError):  # an unreadable record: say what the status says
            decision = decide(status, settings.stale_timeout)
        action, reason = decision.action.value, decision.reason
        if action == RUN:
            blocker = _blocking_dep(step, rows)
            if not is_selected:
                action, reason = BLOCKED, f"not in the selection and {reason}"
            elif blocker:
                action, reason = BLOCKED, blocker
            else:
                after = [d.name for d in step.deps if rows[d.name].action in (RUN, WAIT)]
                if after:
                    reason += f"; after {', '.join(after)}"
        prev = previous.get(step.name)
        changed: list[dict[str, Any]] = []
        prev_hash = None
        if prev is not None and prev.hash and prev.hash != step.hash:
            prev_hash = prev.hash
            changed = attrs_diff(step, prev)
            names = ", ".join(c["field"] for c in changed) or "unknown fields"
            reason += f"; hash changed from {prev.hash} ({names})"
        rows[step.name] = PlanRow(
            asset_key=step.name, output_path=out, hash=step.hash, action=action, reason=reason,
            selected=is_selected, status=status.status.value if status else None,
            changed=changed, previous_hash=prev_hash,
        )
    return list(rows.values())


def _blocking_dep(step: Step, rows: Mapping[str, PlanRow]) -> str | None:
    for dep in step.deps:
        row = rows[dep.name]
        if row.action != BLOCKED:
            continue
        if row.selected:
            return f"dependency {dep.name} is blocked"
        state = {None: "not materialized", "FAILED": "FAILED"}.get(row.status, "RUNNING with a stale lease")
        return f"dependency {dep.name} is {state} and not in the selection"
    return None


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` → `{"a.b": 1}`; lists stay whole values."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{path}.{key}" if path else key))
        return out
    return {path: value}


def attrs_diff(step: Step, prev: PreviousMaterialization) -> list[dict[str, Any]]:
    """Field-level differences between the old materialization and `step`.

    The old attributes come from the record at the old output path, else from the
    materialization's metadata.
    """
    old_attrs, old_deps = prev.hash_attrs, prev.deps
    if prev.output_path:
        try:
            record = read_record(prev.output_path)
            old_attrs, old_deps = record.hash_attrs, record.deps
        except (RecordNotAvailableError, OSError, ValueError):
            pass
    changes: list[dict[str, Any]] = []
    if old_attrs is not None:
        old, new = flatten(old_attrs), flatten(canonical(step.hash_attrs))
        for key in sorted(set(old) | set(new)):
            if old.get(key, _MISSING) != new.get(key, _MISSING):
                changes.append({"field": key, "old": old.get(key), "new": new.get(key)})
    if old_deps is not None:
        old_d = dict(d.rsplit("_", 1) for d in old_deps)
        new_d = {d.name: d.hash for d in step.deps}
        for name in sorted(set(old_d) | set(new_d)):
            if old_d.get(name) != new_d.get(name):
                changes.append({"field": f"deps[{name}]", "old": old_d.get(name), "new": new_d.get(name)})
    return changes


_MISSING = object()
