"""The Dagster adapter: steps → software-defined assets.

One step → one asset: key from the name, `code_version` = identity hash, deps from the
step's deps, group from the name's first segment, kind from the step's kind, description
from the function. The body runs `materialize_step` and returns the record as metadata with
`data_version` = hash (plus the content version of a changing source, `core/versions.py`),
so Dagster's "unsynced" follows identity and upstream content exactly.
"""


import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from marin_assets.core.execute import StepOutcome, materialize_step
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.paths import default_prefix
from marin_assets.core.ray_execution import ray_runner
from marin_assets.core.step import Step, walk
from marin_assets.core.versions import data_version
from resources.ray import RayResource
from resources.storage import StorageResource

FORCE_TAG = "marin/force"
"""Run tag: `true` recomputes every asset of the run; a comma-separated list of asset keys
(`hello/stats,hello/numbers`) recomputes those."""

STORAGE_KEY = "storage"
RAY_KEY = "ray"


class StepConfig(dg.Config):
    """Per-materialization settings of a step asset (`ops: {op: {config: {...}}}` in run config)."""

    force: bool = Field(default=False, description="Recompute even if a successful output exists (rewrites it).")


# Built once and shared by every step asset: inferring a schema per asset is most of the
# load time of a large graph (bench/adapter_overhead.py).
STEP_CONFIG_SCHEMA = StepConfig.to_config_schema()


def asset_key(step: Step) -> dg.AssetKey:
    return dg.AssetKey(step.name.split("/"))


def group_name(step: Step) -> str:
    """The stage: the name's first segment (`raw/x` → `raw`); single-segment names → `default`."""
    if "/" not in step.name:
        return "default"
    return re.sub(r"[^A-Za-z0-9_]", "_", step.name.split("/", 1)[0])


def describe(step: Step) -> str:
    if step.description:
        return step.description
    fn = step.fn.func if isinstance(step.fn, functools.partial) else step.fn
    doc = inspect.getdoc(fn)
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    return f"{doc}\n\nMade by `{where}`." if doc else f"Made by `{where}`."


def storage_settings(storage: StorageResource) -> tuple[str, LeaseSettings]:
    prefix = storage.prefix or default_prefix()
    return prefix, LeaseSettings(storage.heartbeat_interval, storage.stale_timeout, storage.poll_interval)


def forced_by_tag(tags: Mapping[str, str], step: Step) -> bool:
    value = tags.get(FORCE_TAG, "").strip()
    if value.lower() in ("true", "1", "yes", "all"):
        return True
    return step.name in {v.strip() for v in value.split(",")}


def outcome_metadata(outcome: StepOutcome) -> dict[str, Any]:
    record = outcome.record
    metadata: dict[str, Any] = {
        "output_path": dg.MetadataValue.path(outcome.output_path),
        "hash": record.hash,
        "cached": outcome.cached,
        "duration_s": round(outcome.duration_s, 3),
        "compute_s": record.duration_s,
        "hash_attrs": dg.MetadataValue.json(record.hash_attrs),
        "deps": dg.MetadataValue.json(record.deps),
        "computed_by_run": record.provenance.run_id or "",
        "git_commit": record.provenance.git_commit or "",
    }
    if record.content_version is not None:
        metadata["content_version"] = record.content_version
    if outcome.waited_s >= 0.5:
        metadata["waited_s"] = round(outcome.waited_s, 3)
    if outcome.took_over:
        metadata["took_over"] = outcome.took_over
    result = record.result
    if isinstance(result, dict):
        for key, value in result.items():
            if isinstance(value, (bool, int, float, str)) and value is not None:
                metadata[f"result.{key}"] = value
    if isinstance(result, (dict, list)):
        metadata["result"] = dg.MetadataValue.json(result)
    elif result is not None:
        metadata["result"] = result  # a number or text, shown (and plotted) as itself
    return metadata


def run_step(step: Step, context: dg.AssetExecutionContext) -> StepOutcome:
    """Materialize `step` with the run's storage, Ray, force settings and log."""
    config = StepConfig(**context.op_execution_context.op_config)
    prefix, settings = storage_settings(getattr(context.resources, STORAGE_KEY))
    return materialize_step(
        step,
        prefix=prefix,
        settings=settings,
        run_id=context.run.run_id,
        force=config.force or forced_by_tag(context.run.tags, step),
        run_fn=ray_runner(getattr(context.resources, RAY_KEY), context.log),
        log=context.log,
    )


def materialize_result(outcome: StepOutcome, extra_metadata: Mapping[str, Any] | None = None) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={**outcome_metadata(outcome), **(extra_metadata or {})},
                                data_version=dg.DataVersion(data_version(outcome.step, outcome.record)))


def step_asset(step: Step, automation_condition: dg.AutomationCondition | None = None) -> dg.AssetsDefinition:
    """The Dagster asset serving one step."""

    def body() -> dg.MaterializeResult:
        # The context by accessor, not parameter: Dagster inspects every asset function's
        # parameters at definition time, a measurable share of loading 1000 assets.
        return materialize_result(run_step(step, dg.AssetExecutionContext.get()))

    body.marin_step = step  # type: ignore[attr-defined]  # read back by `step_of`
    return dg.asset(
        key=asset_key(step),
        name=None,
        deps=[asset_key(d) for d in step.deps],
        code_version=step.hash,
        group_name=group_name(step),
        kinds={step.kind},
        description=describe(step),
        config_schema=STEP_CONFIG_SCHEMA,
        required_resource_keys={STORAGE_KEY, RAY_KEY},
        automation_condition=automation_condition,
    )(body)


def build_assets(
    steps: Sequence[Step],
    automation: Mapping[Step, dg.AutomationCondition] | None = None,
) -> list[dg.AssetsDefinition]:
    """Assets for `steps` and everything they depend on, each identity once.

    `automation`: steps that materialize themselves, with their condition (see
    `marin_assets.automation.conditions.automate`)."""
    automation = automation or {}
    return [step_asset(step, automation.get(step)) for step in walk(steps)]


def build_definitions(
    steps: Sequence[Step],
    resources: Mapping[str, Any] | None = None,
    *,
    automation: Mapping[Step, dg.AutomationCondition] | None = None,
    extra_assets: Sequence[dg.AssetsDefinition] = (),
    **definitions_kwargs: Any,
) -> dg.Definitions:
    """`Definitions` serving `steps`, with default storage and Ray resources unless given.

    The default executor runs a run's steps in one process, so the run shares one embedded
    Ray (started on first use, stopped at the end); the work itself runs on Ray workers.
    `extra_assets` are assets made elsewhere, such as per-checkpoint evaluations; sensors and
    schedules go in `definitions_kwargs`.
    """
    all_resources = {STORAGE_KEY: StorageResource(), RAY_KEY: RayResource(), **(resources or {})}
    definitions_kwargs.setdefault("executor", dg.in_process_executor)
    return dg.Definitions(assets=[*build_assets(steps, automation), *extra_assets], resources=all_resources,
                          **definitions_kwargs)


def step_of(assets_def: dg.AssetsDefinition) -> Step | None:
    """The step an asset serves, or None for assets not made by this adapter."""
    compute_fn = getattr(assets_def.op, "compute_fn", None)
    fn = getattr(compute_fn, "decorated_fn", None)
    return getattr(fn, "marin_step", None)


def steps_of(definitions: dg.Definitions) -> dict[dg.AssetKey, Step]:
    """Asset key → step for every step asset in `definitions`."""
    out: dict[dg.AssetKey, Step] = {}
    for assets_def in definitions.resolve_asset_graph().assets_defs:
        step = step_of(assets_def)
        if step is not None:
            out[asset_key(step)] = step
    return out
