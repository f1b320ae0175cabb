"""Steps → Dagster software-defined assets: the one way a step becomes an asset.

One step → one asset: key from the name, `code_version` = identity hash, deps from the
step's deps, group from the name's first segment, kinds from the step, description from the
function. A family of steps keyed by partition (each checkpoint of a training run) is one
partitioned asset made by the same function (`Partitioned`). From the asset to the user's
function it is four hops: the op's body → `materialize_step` (the protocol) → the execution
layer's `StepRunner` → `step.fn` on a Ray worker (a light step: in this process). The body
returns the record as metadata and `data_version` = hash (plus the content version of a changing source), so Dagster's
"unsynced" follows identity and upstream content exactly.
"""


import functools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from pydantic import Field

from marin_assets.core.checks import run_check
from marin_assets.core.identity import canonical
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.materialize import StepOutcome, materialize_step
from marin_assets.core.paths import default_prefix, using_prefix
from marin_assets.core.preemption import Preempted
from marin_assets.core.step import Step, StepDefinitionError, made_by, walk
from marin_assets.core.versions import data_version
from marin_assets.dagster.budget import check_run_budget
from marin_assets.dagster.drift import Drift
from marin_assets.dagster.metadata import metadata_or_error, outcome_metadata, safe_metadata
from marin_assets.dagster.naming import asset_key, check_unique_names, group_name, input_name, op_name
from marin_assets.execution.ray_runner import ray_runner
from resources.storage import StorageResource

FORCE_TAG = "marin/force"
PREEMPTED_TAG = "marin/preempted"
"""On a run whose step stopped on SIGTERM after saving its state (`core.preemption`): why, and that the run is
retried although it failed in a step (`dagster/retry_on_asset_or_op_failure`)."""
"""Run tag: `true` recomputes every asset of the run; a comma-separated list of asset keys
(`hello/stats,hello/numbers`) recomputes those."""

STORAGE_KEY = "storage"
RAY_KEY = "ray"


class StepConfig(dg.Config):
    """Per-materialization settings of a step asset (`ops: {op: {config: {...}}}` in run config)."""

    force: bool = Field(default=False, description="Recompute even if a successful output exists (rewrites it).")


# Built once and shared by every step asset: inferring a schema per asset is most of the
# load time of a large graph (bench/adapter_overhead.py).
_STEP_CONFIG_SCHEMA = StepConfig.to_config_schema()
_NOTHING_IN = dg.In(dg.Nothing)
"""The input standing for a dependency (ordering only). Shared, as is the output of a check below:
an `In` or `Out` resolves its type when made, 25,000 times in a 10,000-step sweep."""
_CHECK_OUT = dg.Out(dagster_type=None, is_required=True)


@dataclass(frozen=True)
class Partitioned:
    """One asset whose partitions are steps of one family: partition key → the step it makes.

    The step given to `step_asset` with it is the family's template (kind, checks, resources,
    description); each partition materializes `step_for(partition_key)`.
    """

    name: str
    """The asset's name (`evals/tiny-llama-checkpoints`)."""
    partitions_def: dg.PartitionsDefinition
    step_for: Callable[[str], Step] = field(repr=False)
    """The step a partition materializes."""
    code_version: str
    """Identity of the family (each partition's step adds its key)."""
    deps: Sequence[Step] = ()
    """Upstream assets in the lineage graph (a partition's step may read more or fewer)."""
    summary: Callable[[str, StepOutcome, dg.AssetExecutionContext], Mapping[str, Any]] | None = field(
        default=None, repr=False)
    """More metadata for a partition's materialization: `summary(partition_key, outcome, context)`."""
    follows: Step | None = None
    """The step whose run this family keeps up with (a training run, for per-checkpoint evaluations): its
    freshness policy holds while that step is unfinished (`marin_assets.dagster.freshness`)."""


def _describe(step: Step) -> str:
    """The asset's description: the step's own, else what its function's docstring says."""
    if step.description:
        return step.description
    return made_by(step.fn.func if isinstance(step.fn, functools.partial) else step.fn)


def storage_settings(storage: StorageResource) -> tuple[str, LeaseSettings]:
    """The prefix and lease timing of a storage resource."""
    prefix = storage.prefix or default_prefix()
    return prefix, LeaseSettings(storage.heartbeat_interval, storage.stale_timeout, storage.poll_interval)


def _recompute_reason(context: dg.AssetExecutionContext, step: Step) -> str | None:
    """Why this run recomputes `step` even if its output exists: the op's `force` config or the
    run's `marin/force` tag; None otherwise."""
    if StepConfig(**context.op_execution_context.op_config).force:
        return "forced by run config (force: true)"
    value = context.run.tags.get(FORCE_TAG, "").strip()
    if value.lower() in ("true", "1", "yes", "all") or step.name in {v.strip() for v in value.split(",")}:
        return f"forced by run tag {FORCE_TAG}={value}"
    return None


def _materialize(step: Step, context: dg.AssetExecutionContext,
                 extra_metadata: Callable[[StepOutcome], Mapping[str, Any]] | None = None) -> dg.MaterializeResult:
    """The body of every step asset: the protocol with the run's storage and Ray, then what the UI shows."""
    storage = getattr(context.resources, STORAGE_KEY)
    prefix, settings = storage_settings(storage)
    check_run_budget(context, prefix, settings)  # tags marin/max-device-hours, marin/max-cost: before any work
    runner = ray_runner(getattr(context.resources, RAY_KEY), context.log)
    try:
        outcome = materialize_step(
            step, prefix=prefix, settings=settings, run_id=context.run.run_id,
            recompute=_recompute_reason(context, step), run_fn=runner, log=context.log,
        )
    except Preempted as e:
        # Run retries leave a step's own failure alone (`retry_on_asset_or_op_failure: false`); a preempted step
        # saved its state to be resumed, so its run asks to be retried (Dagster reads the tags when the run fails).
        context.instance.add_run_tags(context.run.run_id, {"dagster/retry_on_asset_or_op_failure": "true",
                                                           PREEMPTED_TAG: f"{step.name}: {e}"[:500]})
        raise
    # The output has succeeded whatever its result looks like: metadata that cannot be built or
    # recorded becomes text saying why, never a failure of this run and every later (cached) one.
    metadata = metadata_or_error("metadata", lambda: outcome_metadata(outcome))
    if not outcome.cached and runner.ran_in:  # where it ran, and the start-up apart from its own work
        metadata["ran_in"] = runner.ran_in
        metadata["startup_s"] = round(runner.startup_s, 3)
    if extra_metadata:
        metadata.update(metadata_or_error("summary", lambda: extra_metadata(outcome)))
    return dg.MaterializeResult(metadata=safe_metadata(metadata),
                                data_version=dg.DataVersion(data_version(outcome.step, outcome.record)),
                                check_results=_check_results(step, outcome, prefix, context))


def _check_specs(step: Step, key: dg.AssetKey,
                 partitions_def: dg.PartitionsDefinition | None = None) -> list[dg.AssetCheckSpec]:
    """The step's checks as Dagster asset checks; on a partitioned asset, partitioned like it, so each
    result belongs to the partition it checked (a failing checkpoint shows on its own partition)."""
    if partitions_def is None:
        return [dg.AssetCheckSpec(c.name, asset=key, description=c.description, blocking=c.blocking)
                for c in step.checks]
    with warnings.catch_warnings():  # a preview feature of Dagster 1.13, warned about on every load otherwise
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [dg.AssetCheckSpec(c.name, asset=key, description=c.description, blocking=c.blocking,
                                  partitions_def=partitions_def)
                for c in step.checks]


def _check_results(step: Step, outcome: StepOutcome, prefix: str,
                   context: dg.AssetExecutionContext) -> list[dg.AssetCheckResult]:
    """The step's checks on its output (computed or cached), those the run selected."""
    selected = {k.name for k in context.selected_asset_check_keys}
    results = []
    with using_prefix(prefix):
        for check in step.checks:
            if check.name not in selected:
                continue
            found = run_check(check, outcome.output_path, outcome.record.result)
            results.append(dg.AssetCheckResult(check_name=check.name, passed=found.passed,
                                               severity=dg.AssetCheckSeverity.ERROR,
                                               description=found.message,
                                               metadata=safe_metadata(dict(found.metadata))))
    return results


def _pool_of(step: Step) -> str | None:
    """The concurrency pool of a step needing accelerators (`tpu-v5e-16`, `gpu-H100`, `gpu`):
    the instance limits how many run at once (`dagster instance concurrency set <pool> N`)."""
    resources = step.resources
    if resources.tpu_type:
        return f"tpu-{resources.tpu_type}"
    if resources.gpu:
        return f"gpu-{resources.gpu_type}" if resources.gpu_type else "gpu"
    return None


def _definition_metadata(step: Step) -> dict[str, Any]:
    """What the asset's definition shows before any materialization: what identity covers."""
    resources = step.resources
    wants = [f"cpu={resources.cpu:g}"] + [f"{k}={v}" for k, v in
                                            (("memory_gb", resources.memory_gb), ("gpu", resources.gpu or None),
                                             ("gpu_type", resources.gpu_type), ("tpu_type", resources.tpu_type),
                                             ("tpu_count", resources.tpu_count or None)) if v]
    return {"identity": step.name_with_hash, "hash_attrs": dg.MetadataValue.json(canonical(step.hash_attrs)),
            "resources": " ".join(wants)}


def step_asset(step: Step, automation_condition: dg.AutomationCondition | None = None, *,
               partitioned: Partitioned | None = None, extra_kinds: Sequence[str] = (),
               drift: Drift | None = None, freshness: dg.FreshnessPolicy | None = None) -> dg.AssetsDefinition:
    """The Dagster asset serving one step — or, with `partitioned`, a family of steps, one per partition.

    `extra_kinds`: kinds from the deployment (e.g. `gcs` for a `gs://` prefix); `drift`: how
    the step differs from the asset's last materialization, shown in its description; `freshness`:
    how recently it should have materialized (only where that means something: see
    `marin_assets.dagster.freshness`). A partitioned asset's checks are partitioned with it.

    Built from an `AssetSpec` and an `OpDefinition` rather than `@asset`: the decorator
    inspects the function's signature and infers types per asset, which was over half of the
    load time of a 10,000-step sweep (bench/adapter_overhead.py). The result is the same
    asset: one op named after the key, a Nothing input per dependency (so a run orders the
    ops), the `result` output plus one output per check.
    """
    if partitioned is None:
        key, code_version, deps = asset_key(step.name), step.hash, list(step.deps)

        def compute(context: dg.AssetExecutionContext, _inputs: Mapping[str, Any]) -> Iterator[dg.MaterializeResult]:
            yield _materialize(step, context)
    else:
        family = partitioned
        key, code_version, deps = asset_key(family.name), family.code_version, list(family.deps)

        def compute(context: dg.AssetExecutionContext, _inputs: Mapping[str, Any]) -> Iterator[dg.MaterializeResult]:
            partition = context.partition_key
            summary = family.summary
            yield _materialize(family.step_for(partition), context,
                               (lambda outcome: summary(partition, outcome, context)) if summary else None)

    compute.marin_step = step  # type: ignore[attr-defined]  # read back by `step_of`
    compute.marin_partitioned = partitioned  # type: ignore[attr-defined]
    metadata = _definition_metadata(step) if partitioned is None else {}
    description = _describe(step)
    if drift is not None:
        metadata["changed_since_last_materialization"] = dg.MetadataValue.json(drift.to_json())
        description = f"{drift.markdown()}\n\n{description}"
    ins = {input_name(d.name): asset_key(d.name) for d in deps}
    if len(ins) != len(deps):
        check_unique_names(deps)  # raises, naming the two steps
    partitions_def = partitioned.partitions_def if partitioned else None
    checks = {spec.get_python_identifier(): spec for spec in _check_specs(step, key, partitions_def)}
    op = dg.OpDefinition(
        compute_fn=compute,
        name=op_name(key),
        ins=dict.fromkeys(ins, _NOTHING_IN),
        outs={"result": dg.Out(code_version=code_version, description=description),
              **dict.fromkeys(checks, _CHECK_OUT)},
        description=description,
        config_schema=_STEP_CONFIG_SCHEMA,
        required_resource_keys={STORAGE_KEY, RAY_KEY},
        code_version=code_version,
        pool=_pool_of(step),
    )
    spec = dg.AssetSpec(
        key,
        deps=list(ins.values()),
        code_version=code_version,
        group_name=group_name(step.name),
        kinds={step.kind, "ray", *step.kinds, *extra_kinds},
        tags={"marin/stage": group_name(step.name)},
        description=description,
        metadata=metadata,
        automation_condition=automation_condition,
        partitions_def=partitions_def,
        freshness_policy=freshness,
    )
    return dg.AssetsDefinition(keys_by_input_name=ins, keys_by_output_name={"result": key}, node_def=op,
                               check_specs_by_output_name=checks, specs=[spec])


def build_assets(
    steps: Sequence[Step],
    automation: Mapping[Step, dg.AutomationCondition] | None = None,
    *,
    extra_kinds: Sequence[str] = (),
    drift: Mapping[str, Drift] | None = None,
    other_names: Sequence[str] = (),
    freshness: Mapping[str, dg.FreshnessPolicy] | None = None,
) -> list[dg.AssetsDefinition]:
    """Assets for `steps` and everything they depend on, each identity once.

    Two names Dagster would turn into one op or input name — among the steps, or a step and one
    of `other_names` (other assets served beside them) — are a `StepDefinitionError` naming both.
    `automation`: steps that materialize themselves, with their condition (see
    `marin_assets.dagster.conditions.automate`); `drift`: step name → its drift; `freshness`: step
    name → its freshness policy (the sources a source sensor follows)."""
    automation, drift, freshness = automation or {}, drift or {}, freshness or {}
    steps = walk(steps)
    check_unique_names(steps, other_names)
    return [step_asset(step, automation.get(step), extra_kinds=extra_kinds, drift=drift.get(step.name),
                       freshness=freshness.get(step.name))
            for step in steps]


def step_of(assets_def: dg.AssetsDefinition) -> Step | None:
    """The step an (unpartitioned) asset serves, or None for other assets."""
    compute_fn = getattr(assets_def.node_def, "compute_fn", None)
    if getattr(compute_fn, "marin_partitioned", None) is not None:
        return None
    return getattr(compute_fn, "marin_step", None)


__all__ = ["FORCE_TAG", "Partitioned", "StepDefinitionError", "build_assets", "step_asset", "step_of",
           "storage_settings"]
