"""Freshness policies, only where time means something.

A step's output is content-addressed: it never goes stale by age, and a freshness policy on it would only
raise false alarms. Two kinds of asset are different, and get a freshness policy — by default Dagster's time
window (`dg.FreshnessPolicy.time_window`; any `dg.FreshnessPolicy` may be set). Dagster's freshness daemon
(part of `dg dev`) evaluates it every 30 s; the asset's page shows Passing / Warning / Failed and the windows:

- **a followed source** — a download of a branch or a URL watched by the source sensor
  (`source_sensor(steps, freshness=...)`, default `FOLLOWED_SOURCE_FRESHNESS`): it is expected to bring a new
  version of its source within the window. Failing says the sensor is off, a refresh failed, or the source
  stopped moving — each worth a look for a source one chose to follow.
- **per-checkpoint evaluations of a training run** (`checkpoint_evals_asset(evals, freshness=...)`, default
  `CHECKPOINT_EVALS_FRESHNESS`): while the run trains, some checkpoint is evaluated within the window.
  Failing says the checkpoint sensor is off, evaluations fail, or training stalled. Once the run has
  finished (its output SUCCESS when the definitions load), the family has no policy: nothing more is due.

Pass `freshness=None` to either to leave the asset without a policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import dagster as dg

from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores.registry import read_status

FOLLOWED_SOURCE_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=7),
                                                           warn_window=timedelta(days=1))
"""A followed source: warn after a day without a new version, fail after a week."""

CHECKPOINT_EVALS_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=24),
                                                            warn_window=timedelta(hours=6))
"""Per-checkpoint evaluations of a running training: warn after 6 hours without an evaluated checkpoint,
fail after a day (Marin keeps a permanent checkpoint every few hours of a long run)."""

FOLLOWED_METADATA_KEY = "marin/freshness_of_followed_sources"
"""Sensor metadata of a source sensor: the sources it follows and their policy, which `build_definitions`
puts on those assets (and the sensor's page shows)."""


def _as_json(policy: dg.FreshnessPolicy) -> dict[str, Any]:
    """A policy as plain JSON (seconds, a cron string), readable on the sensor's page."""
    kind: Any = policy  # each kind's fields are on its own class, which Dagster does not export
    if hasattr(kind, "fail_window"):
        warn = kind.warn_window
        return {"fail_window_s": kind.fail_window.to_timedelta().total_seconds(),
                "warn_window_s": warn.to_timedelta().total_seconds() if warn else None}
    return {"deadline_cron": kind.deadline_cron, "lower_bound_delta_s": kind.lower_bound_delta.total_seconds(),
            "timezone": kind.timezone}


def _from_json(value: Mapping[str, Any]) -> dg.FreshnessPolicy:
    """The policy `_as_json` wrote."""
    if "fail_window_s" in value:
        warn = value["warn_window_s"]
        return dg.FreshnessPolicy.time_window(fail_window=timedelta(seconds=value["fail_window_s"]),
                                              warn_window=timedelta(seconds=warn) if warn else None)
    return dg.FreshnessPolicy.cron(deadline_cron=value["deadline_cron"],
                                   lower_bound_delta=timedelta(seconds=value["lower_bound_delta_s"]),
                                   timezone=value["timezone"])


def followed_metadata(sources: Sequence[Step], policy: dg.FreshnessPolicy | None) -> dict[str, Any]:
    """The metadata a source sensor carries: which sources follow `policy` (none when it is None) — a time
    window or a cron deadline."""
    if policy is None:
        return {}
    return {FOLLOWED_METADATA_KEY: dg.MetadataValue.json({"sources": sorted(s.name for s in sources),
                                                          "policy": _as_json(policy)})}


def followed_freshness(sensors: Sequence[Any]) -> dict[str, dg.FreshnessPolicy]:
    """Step name → freshness policy, from the source sensors among `sensors` (others are ignored)."""
    out: dict[str, dg.FreshnessPolicy] = {}
    for sensor in sensors:
        entry = getattr(sensor, "metadata", {}).get(FOLLOWED_METADATA_KEY)
        if isinstance(entry, dg.JsonMetadataValue) and isinstance(entry.value, Mapping):
            out.update(dict.fromkeys(entry.value["sources"], _from_json(entry.value["policy"])))
    return out


def finished(step: Step, prefix: str) -> bool:
    """Whether `step`'s output is complete under `prefix`; an unreadable status counts as unfinished."""
    try:
        status = read_status(step.output_path_under(prefix))
    except Exception:  # unreachable storage at load time: keep the policy, never fail the load
        return False
    return status is not None and status.status == Status.SUCCESS


def without_finished_runs(assets: Sequence[dg.AssetsDefinition], prefix: str) -> list[dg.AssetsDefinition]:
    """`assets`, where a partitioned family keeping up with a step that has finished (`Partitioned.follows`,
    a training run) loses its freshness policy: nothing more is due from it. One status read per such family."""
    out = []
    for assets_def in assets:
        family = getattr(getattr(assets_def.node_def, "compute_fn", None), "marin_partitioned", None)
        follows = getattr(family, "follows", None)
        has_policy = any(spec.freshness_policy is not None for spec in assets_def.specs)
        if follows is not None and has_policy and finished(follows, prefix):
            assets_def = assets_def.map_asset_specs(lambda spec: spec.replace_attributes(freshness_policy=None))
        out.append(assets_def)
    return out


def policies_of(definitions: dg.Definitions) -> Mapping[dg.AssetKey, dg.FreshnessPolicy]:
    """Asset key → freshness policy of every asset of `definitions` that has one."""
    return {node.key: node.freshness_policy for node in definitions.resolve_asset_graph().asset_nodes
            if node.freshness_policy is not None}


__all__ = ["CHECKPOINT_EVALS_FRESHNESS", "FOLLOWED_METADATA_KEY", "FOLLOWED_SOURCE_FRESHNESS", "finished",
           "followed_freshness", "followed_metadata", "policies_of", "without_finished_runs"]
