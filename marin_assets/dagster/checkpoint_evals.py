"""Evaluate every checkpoint as it lands: the per-checkpoint evaluation asset and its sensor.

A family of per-checkpoint evaluations (pipeline library, `CheckpointEvals`) names a training
step and an evaluation kind: validation losses (`loss_checkpoint_evals`) or lm-eval tasks
(`harness_checkpoint_evals`). Its asset is made by `step_asset` like every step asset, partitioned:
one dynamic partition per checkpoint step, each the step `{name}/step-N`, so evaluations are
cached and leased like any output; every materialization shows a table of all checkpoints so
far. The sensor lists the training run's checkpoint folder once per tick (local or `gs://`,
through fsspec) and, for each new complete permanent checkpoint, adds the partition and
requests its evaluation — while training is still running, since a checkpoint is read from its
folder, not from the training step's record.

The step's checks are partitioned asset checks: a checkpoint whose evaluation fails a check shows the
failure on its own partition. While the run trains, the asset carries a freshness policy (`freshness=`,
default: warn after 6 hours without an evaluated checkpoint, fail after a day;
`marin_assets.dagster.freshness`), dropped once the run has finished.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import dagster as dg

from marin_assets.core.materialize import StepOutcome
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.dagster.assets import Partitioned, step_asset, storage_settings
from marin_assets.dagster.freshness import CHECKPOINT_EVALS_FRESHNESS
from marin_assets.dagster.naming import asset_key
from marin_assets.dagster.resubmit import MAX_ATTEMPTS, resubmit_lost
from marin_assets.pipeline.evals.steps import CheckpointEvals
from marin_assets.pipeline.training.checkpoints import list_checkpoints, run_dir_of
from resources.storage import StorageResource

CHECKPOINT_TAG = "marin/checkpoint"


def partitions_name(evals: CheckpointEvals) -> str:
    """Partitions per training identity: a retrained model starts a fresh set."""
    return re.sub(r"[^A-Za-z0-9_]", "_", evals.train.name_with_hash)


def partitions_of(evals: CheckpointEvals) -> dg.DynamicPartitionsDefinition:
    """The dynamic partitions of `evals`' asset, one per evaluated checkpoint step."""
    return dg.DynamicPartitionsDefinition(name=partitions_name(evals))


def results_table(evals: CheckpointEvals, checkpoints: Sequence[int], prefix: str) -> dg.TableMetadataValue:
    """The results of every evaluated checkpoint (loss and bits per byte; each task's accuracies), one row per step."""
    rows = []
    for checkpoint in sorted(checkpoints):
        try:
            result = read_record(evals.step(checkpoint).output_path_under(prefix)).result
        except RecordNotAvailableError:
            continue  # not evaluated yet
        row: dict[str, Any] = {"step": checkpoint, **evals.row(result)}
        rows.append(dg.TableRecord({k: v for k, v in row.items() if v is not None}))
    columns = [dg.TableColumn("step", "int")] + [dg.TableColumn(c, "float") for c in evals.columns()]
    return dg.MetadataValue.table(rows, schema=dg.TableSchema(columns))


def checkpoint_evals_asset(evals: CheckpointEvals,
                           freshness: dg.FreshnessPolicy | None = CHECKPOINT_EVALS_FRESHNESS) -> dg.AssetsDefinition:
    """The partitioned asset: partition `N` evaluates checkpoint step N (made by `step_asset`), its checks
    partitioned with it. `freshness`: how recently some checkpoint should have been evaluated while the
    training runs (None: no policy); `build_definitions` drops it once the training has finished."""
    def summary(partition: str, outcome: StepOutcome, context: dg.AssetExecutionContext) -> dict[str, Any]:
        checkpoint = int(partition)
        prefix, _ = storage_settings(context.resources.storage)
        known = {int(k) for k in context.instance.get_dynamic_partitions(partitions_name(evals))}
        return {  # numbers per partition: Dagster plots them against the partitions
            "checkpoint_step": checkpoint, **evals.numbers(outcome.record.result),
            "all_checkpoints": results_table(evals, sorted(known | {checkpoint}), prefix),
        }

    template = dataclasses.replace(evals.step(0), description=evals.description)
    family = Partitioned(name=evals.name, partitions_def=partitions_of(evals),
                         step_for=lambda key: evals.step(int(key)), code_version=evals.hash,
                         deps=[evals.train, *evals.deps], summary=summary, follows=evals.train)
    return step_asset(template, partitioned=family, freshness=freshness)


def checkpoint_sensor(
    evals: Sequence[CheckpointEvals],
    *,
    name: str = "marin_checkpoint_evals",
    minimum_interval_seconds: int = 60,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    max_resubmits: int = MAX_ATTEMPTS,
) -> dg.SensorDefinition:
    """Request one evaluation per new complete, permanent checkpoint of each watched training run.

    The cursor keeps the checkpoint steps seen per training identity, so a restarted daemon
    neither repeats nor misses one; run keys make a repeat impossible even without it. A request
    whose run was lost before its evaluation ran (the daemon or the code server went down while it
    was dequeued or launched, its run worker died) is asked again, at most `max_resubmits` times,
    tagged `marin/resubmitted` (`marin_assets.dagster.resubmit`); a failed evaluation is not.
    Temporary checkpoints (saved by time, deleted at the next save) are seen but not evaluated.
    Families evaluating one training run (its losses and its lm-eval tasks) share its partitions
    and get one run per checkpoint that materializes all of them.
    """
    watched: dict[str, list[CheckpointEvals]] = {}  # per training identity
    for e in evals:
        watched.setdefault(partitions_name(e), []).append(e)

    @dg.sensor(
        name=name,
        asset_selection=dg.AssetSelection.assets(*[asset_key(e.name) for e in evals]),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Evaluates each checkpoint of a training run as soon as it is completely written.",
    )
    def evaluate_new_checkpoints(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult:
        prefix, _ = storage_settings(storage)
        seen: dict[str, list[int]] = json.loads(context.cursor) if context.cursor else {}
        runs, partitions = [], []
        for name, families in watched.items():
            e = families[0]
            known = set(seen.get(name, []))
            found = list_checkpoints(run_dir_of(e.train.output_path_under(prefix)), known)
            new = sorted(step for step, temporary in found.items() if not temporary)
            if new:
                partitions.append(partitions_of(e).build_add_request([str(s) for s in new]))
                runs += [dg.RunRequest(run_key=f"{name}:{s}", asset_selection=[asset_key(f.name) for f in families],
                                       partition_key=str(s), tags={CHECKPOINT_TAG: str(s)}) for s in new]
            if found:
                seen[name] = sorted(known | set(found))
        runs += resubmit_lost(context, name, max_resubmits)
        return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=partitions,
                               cursor=json.dumps(seen, sort_keys=True),
                               skip_reason=None if runs else "no new complete checkpoints")

    return evaluate_new_checkpoints
