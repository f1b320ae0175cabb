"""The Dagster adapter: steps → software-defined assets.

One step → one asset: key from the name, `code_version` = identity hash, deps from the
step's deps, group from the name's first segment, kind from the step's kind, description
from the function. The body runs `materialize_step` and returns the record as metadata with
`data_version` = hash (plus the content version of a changing source, `core/versions.py`),
so Dagster's "unsynced" follows identity and upstream content exactly.
"""


import contextlib
import functools
import gc
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from marin_assets.core.checks import run_check
from marin_assets.core.drift import Drift, drifts_from_instance
from marin_assets.core.execute import StepOutcome, materialize_step
from marin_assets.core.identity import canonical
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.metadata import outcome_metadata
from marin_assets.core.paths import default_prefix, using_prefix
from marin_assets.core.ray_execution import ray_runner
from marin_assets.core.step import Step, made_by, walk
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


LARGE_GRAPH = 1000
"""From this many assets, `build_definitions` also builds the repository (asset graph, asset
job, job snapshot) right away with the garbage collector paused, and freezes what it built."""


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
    return made_by(step.fn.func if isinstance(step.fn, functools.partial) else step.fn)


def storage_settings(storage: StorageResource) -> tuple[str, LeaseSettings]:
    prefix = storage.prefix or default_prefix()
    return prefix, LeaseSettings(storage.heartbeat_interval, storage.stale_timeout, storage.poll_interval)


def forced_by_tag(tags: Mapping[str, str], step: Step) -> bool:
    value = tags.get(FORCE_TAG, "").strip()
    if value.lower() in ("true", "1", "yes", "all"):
        return True
    return step.name in {v.strip() for v in value.split(",")}


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


def check_specs(step: Step, key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(c.name, asset=key, description=c.description, blocking=c.blocking)
            for c in step.checks]


def check_results(step: Step, outcome: StepOutcome, context: dg.AssetExecutionContext) -> list[dg.AssetCheckResult]:
    """The step's checks on its output (computed or cached), those the run selected."""
    selected = {k.name for k in context.selected_asset_check_keys}
    results = []
    with using_prefix(storage_settings(getattr(context.resources, STORAGE_KEY))[0]):
        for check in step.checks:
            if check.name not in selected:
                continue
            found = run_check(check, outcome.output_path, outcome.record.result)
            results.append(dg.AssetCheckResult(check_name=check.name, passed=found.passed,
                                               severity=dg.AssetCheckSeverity.ERROR,
                                               description=found.message, metadata=dict(found.metadata)))
    return results


def materialize_asset(step: Step, context: dg.AssetExecutionContext,
                      extra_metadata: Callable[[StepOutcome], Mapping[str, Any]] | None = None
                      ) -> dg.MaterializeResult:
    """Run `step` for the asset being materialized: its metadata (plus `extra_metadata(outcome)`),
    data version and check results."""
    outcome = run_step(step, context)
    extra = extra_metadata(outcome) if extra_metadata else {}
    return dg.MaterializeResult(metadata={**outcome_metadata(outcome), **extra},
                                data_version=dg.DataVersion(data_version(outcome.step, outcome.record)),
                                check_results=check_results(step, outcome, context))


def pool_of(step: Step) -> str | None:
    """The concurrency pool of a step needing accelerators (`tpu-v5e-16`, `gpu-H100`, `gpu`):
    the instance limits how many run at once (`dagster instance concurrency set <pool> N`)."""
    resources = step.resources
    if resources.tpu_type:
        return f"tpu-{resources.tpu_type}"
    if resources.gpu:
        return f"gpu-{resources.gpu_type}" if resources.gpu_type else "gpu"
    return None


def definition_metadata(step: Step) -> dict[str, Any]:
    """What the asset's definition shows before any materialization: what identity covers."""
    resources = step.resources
    wants = [f"cpu={resources.cpu:g}"] + [f"{k}={v}" for k, v in
                                            (("memory_gb", resources.memory_gb), ("gpu", resources.gpu or None),
                                             ("gpu_type", resources.gpu_type), ("tpu_type", resources.tpu_type),
                                             ("tpu_count", resources.tpu_count or None)) if v]
    return {"identity": step.name_with_hash, "hash_attrs": dg.MetadataValue.json(canonical(step.hash_attrs)),
            "resources": " ".join(wants)}


def step_asset(step: Step, automation_condition: dg.AutomationCondition | None = None, *,
               extra_kinds: Sequence[str] = (), drift: Drift | None = None) -> dg.AssetsDefinition:
    """The Dagster asset serving one step.

    `extra_kinds`: kinds from the deployment (e.g. `gcs` for a `gs://` prefix); `drift`: how
    the step differs from the asset's last materialization, shown in its description.

    Built from an `AssetSpec` and an `OpDefinition` rather than `@asset`: the decorator
    inspects the function's signature and infers types per asset, which was over half of the
    load time of a 10,000-step sweep (bench/adapter_overhead.py). The result is the same
    asset: one op named after the key, a Nothing input per dependency (so a run orders the
    ops), the `result` output plus one output per check.
    """

    def compute(context: dg.AssetExecutionContext, _inputs: Mapping[str, Any]) -> Iterator[dg.MaterializeResult]:
        yield materialize_asset(step, context)

    compute.marin_step = step  # type: ignore[attr-defined]  # read back by `step_of`
    key = asset_key(step)
    metadata = definition_metadata(step)
    description = describe(step)
    if drift is not None:
        metadata["changed_since_last_materialization"] = dg.MetadataValue.json(drift.to_json())
        description = f"{drift.markdown()}\n\n{description}"
    deps = {input_name(d): asset_key(d) for d in step.deps}
    checks = {spec.get_python_identifier(): spec for spec in check_specs(step, key)}
    op = dg.OpDefinition(
        compute_fn=compute,
        name=key.to_python_identifier(),
        ins={name: dg.In(dg.Nothing) for name in deps},
        outs={"result": dg.Out(code_version=step.hash, description=description),
              **{name: dg.Out(dagster_type=None, is_required=True) for name in checks}},
        description=description,
        config_schema=STEP_CONFIG_SCHEMA,
        required_resource_keys={STORAGE_KEY, RAY_KEY},
        code_version=step.hash,
        pool=pool_of(step),
    )
    spec = dg.AssetSpec(
        key,
        deps=list(deps.values()),
        code_version=step.hash,
        group_name=group_name(step),
        kinds={step.kind, "ray", *step.kinds, *extra_kinds},
        tags={"marin/stage": group_name(step)},
        description=description,
        metadata=metadata,
        automation_condition=automation_condition,
    )
    return dg.AssetsDefinition(keys_by_input_name=deps, keys_by_output_name={"result": key}, node_def=op,
                               check_specs_by_output_name=checks, specs=[spec])


def input_name(step: Step) -> str:
    """The op input standing for a dependency on `step` (Dagster's own naming for `deps`)."""
    return re.sub(r"[-.]", "_", "_".join(asset_key(step).path))


def build_assets(
    steps: Sequence[Step],
    automation: Mapping[Step, dg.AutomationCondition] | None = None,
    *,
    extra_kinds: Sequence[str] = (),
    drift: Mapping[str, Drift] | None = None,
) -> list[dg.AssetsDefinition]:
    """Assets for `steps` and everything they depend on, each identity once.

    `automation`: steps that materialize themselves, with their condition (see
    `marin_assets.automation.conditions.automate`); `drift`: step name → its drift."""
    automation, drift = automation or {}, drift or {}
    return [step_asset(step, automation.get(step), extra_kinds=extra_kinds, drift=drift.get(step.name))
            for step in walk(steps)]


def build_definitions(
    steps: Sequence[Step],
    resources: Mapping[str, Any] | None = None,
    *,
    automation: Mapping[Step, dg.AutomationCondition] | None = None,
    extra_assets: Sequence[dg.AssetsDefinition] = (),
    describe_drift: bool = False,
    **definitions_kwargs: Any,
) -> dg.Definitions:
    """`Definitions` serving `steps`, with default storage and Ray resources unless given.

    The default executor runs a run's steps in one process, so the run shares one embedded
    Ray (started on first use, stopped at the end); the work itself runs on Ray workers.
    `extra_assets` are assets made elsewhere, such as per-checkpoint evaluations; sensors and
    schedules go in `definitions_kwargs`. `describe_drift` reads the Dagster instance (one
    query) so that assets whose identity changed since their last materialization say how
    in their description; it is read when the definitions load (the UI's "Reload").
    """
    all_resources = {STORAGE_KEY: StorageResource(), RAY_KEY: RayResource(), **(resources or {})}
    definitions_kwargs.setdefault("executor", dg.in_process_executor)
    storage = all_resources[STORAGE_KEY]
    prefix = getattr(storage, "prefix", None) or default_prefix()
    extra_kinds = ["gcs"] if prefix.startswith("gs://") else []
    drift = drifts_from_instance(walk(steps)) if describe_drift else None
    with collector_paused():
        assets = [*build_assets(steps, automation, extra_kinds=extra_kinds, drift=drift), *extra_assets]
        definitions = dg.Definitions(assets=assets, resources=all_resources, **definitions_kwargs)
        if len(assets) >= LARGE_GRAPH:
            prebuild(definitions)
            gc.freeze()
    return definitions


@contextlib.contextmanager
def collector_paused():
    """Pause the cyclic garbage collector while definitions are built.

    A 10,000-step sweep is millions of long-lived objects and almost no garbage; each full
    collection walks all of them again, which was a third of its load time
    (bench/adapter_overhead.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def prebuild(definitions: dg.Definitions) -> None:
    """Build (and cache on `definitions`) the repository, its jobs and their snapshots — what a
    code server computes next anyway — while the collector is paused. Once frozen, later full
    collections skip these objects (they live as long as the definitions)."""
    for job in definitions.get_repository_def().get_all_jobs():
        job.get_job_index()


def step_of(assets_def: dg.AssetsDefinition) -> Step | None:
    """The step an asset serves, or None for assets not made by this adapter."""
    compute_fn = getattr(assets_def.node_def, "compute_fn", None)
    return getattr(compute_fn, "marin_step", None)


def steps_of(definitions: dg.Definitions) -> dict[dg.AssetKey, Step]:
    """Asset key → step for every step asset in `definitions`."""
    out: dict[dg.AssetKey, Step] = {}
    for assets_def in definitions.resolve_asset_graph().assets_defs:
        step = step_of(assets_def)
        if step is not None:
            out[asset_key(step)] = step
    return out
