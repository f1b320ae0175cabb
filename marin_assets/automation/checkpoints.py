"""Evaluate every checkpoint as it lands: a per-checkpoint evaluation asset and its sensor.

`CheckpointEvals` names a training step and its validation sets. Its asset has one dynamic
partition per checkpoint step; the sensor lists the training run's checkpoint folder once
per tick (local or `gs://`, through fsspec) and, for each new complete permanent checkpoint,
adds the partition and requests its evaluation — while training is still running, since a
checkpoint is read from its folder, not from the training step's record. Each partition is
a step of its own (`{name}/step-N`), so evaluations are cached and leased like any output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from marin_assets.core.adapter import (
    RAY_KEY,
    STEP_CONFIG_SCHEMA,
    STORAGE_KEY,
    asset_key,
    check_specs,
    group_name,
    materialize_asset,
    storage_settings,
)
from marin_assets.core.execute import StepOutcome
from marin_assets.core.identity import identity_hash
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.step import Step
from marin_assets.pipeline.evaluate import checkpoint_eval_step
from marin_assets.pipeline.train import list_checkpoints, run_dir_of
from resources.storage import StorageResource

CHECKPOINT_TAG = "marin/checkpoint"


@dataclass(frozen=True)
class CheckpointEvals:
    """Evaluate each checkpoint of `train` on `validation`, one partition per checkpoint step."""

    name: str
    """Asset name (`evals/tiny-llama-checkpoints`); checkpoint N's output is `{name}/step-N_{hash}`."""
    train: Step
    """The training step whose checkpoints are evaluated."""
    validation: Mapping[str, Step]
    """Validation set name → tokenized cache step."""
    max_eval_batches: int | None = None
    """Batches per validation set; None for all of it."""

    @property
    def key(self) -> dg.AssetKey:
        return dg.AssetKey(self.name.split("/"))

    @property
    def partitions_def(self) -> dg.DynamicPartitionsDefinition:
        """Partitions per training identity: a retrained model starts a fresh set."""
        return dg.DynamicPartitionsDefinition(name=re.sub(r"[^A-Za-z0-9_]", "_", self.train.name_with_hash))

    @property
    def hash(self) -> str:
        """Identity of the evaluation setup, the asset's code version (each checkpoint adds its step)."""
        return identity_hash(self.name, {"checkpoint_of": self.train.name_with_hash,
                                         "max_eval_batches": self.max_eval_batches,
                                         "validation": sorted(self.validation)},
                             sorted(v.name_with_hash for v in self.validation.values()))

    def step(self, checkpoint: int) -> Step:
        return checkpoint_eval_step(f"{self.name}/step-{checkpoint}", self.train, dict(self.validation), checkpoint,
                                    self.max_eval_batches)


def results_table(evals: CheckpointEvals, checkpoints: Sequence[int], prefix: str) -> dg.TableMetadataValue:
    """Loss and bits per byte of every evaluated checkpoint, one row per step."""
    sets = sorted(evals.validation)
    rows = []
    for checkpoint in sorted(checkpoints):
        try:
            result = read_record(evals.step(checkpoint).output_path_under(prefix)).result
        except RecordNotAvailableError:
            continue  # not evaluated yet
        row: dict[str, Any] = {"step": checkpoint, "loss": result["loss"], "bpb": result.get("bpb")}
        for name in sets:
            row[f"{name}/loss"] = result["per_dataset"].get(name, {}).get("loss")
            row[f"{name}/bpb"] = result["per_dataset"].get(name, {}).get("bpb")
        rows.append(dg.TableRecord({k: v for k, v in row.items() if v is not None}))
    columns = [dg.TableColumn("step", "int"), dg.TableColumn("loss", "float"), dg.TableColumn("bpb", "float")]
    columns += [dg.TableColumn(f"{n}/{m}", "float") for n in sets for m in ("loss", "bpb")]
    return dg.MetadataValue.table(rows, schema=dg.TableSchema(columns))


def checkpoint_evals_asset(evals: CheckpointEvals) -> dg.AssetsDefinition:
    """The partitioned asset: partition `N` evaluates checkpoint step N."""

    def body() -> dg.MaterializeResult:
        context = dg.AssetExecutionContext.get()
        checkpoint = int(context.partition_key)
        prefix, _ = storage_settings(getattr(context.resources, STORAGE_KEY))
        known = {int(k) for k in context.instance.get_dynamic_partitions(evals.partitions_def.name)}

        def summary(outcome: StepOutcome) -> dict[str, Any]:
            result = outcome.record.result
            return {  # numbers per partition: Dagster plots them against the partitions
                "checkpoint_step": checkpoint, "loss": result["loss"],
                **({"bpb": result["bpb"]} if result.get("bpb") is not None else {}),
                "all_checkpoints": results_table(evals, sorted(known | {checkpoint}), prefix),
            }

        return materialize_asset(evals.step(checkpoint), context, summary)

    return dg.asset(
        key=evals.key,
        deps=[asset_key(evals.train), *(asset_key(v) for v in evals.validation.values())],
        partitions_def=evals.partitions_def,
        code_version=evals.hash,
        group_name=group_name(evals.step(0)),
        kinds={"eval", "levanter", "ray"},
        description=f"Loss and bits per byte of every checkpoint of `{evals.train.name}` on"
                    f" {', '.join(sorted(evals.validation))}, one partition per checkpoint step, added by the"
                    " checkpoint sensor as each lands. Made by `marin_assets.pipeline.evaluate.evaluate_lm`.",
        check_specs=check_specs(evals.step(0), evals.key),
        config_schema=STEP_CONFIG_SCHEMA,
        required_resource_keys={STORAGE_KEY, RAY_KEY},
    )(body)


def checkpoint_sensor(
    evals: Sequence[CheckpointEvals],
    *,
    name: str = "marin_checkpoint_evals",
    minimum_interval_seconds: int = 60,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """Request one evaluation per new complete, permanent checkpoint of each watched training run.

    The cursor keeps the checkpoint steps seen per training identity, so a restarted daemon
    neither repeats nor misses one; run keys make a repeat impossible even without it.
    Temporary checkpoints (saved by time, deleted at the next save) are seen but not evaluated.
    """

    @dg.sensor(
        name=name,
        asset_selection=dg.AssetSelection.assets(*[e.key for e in evals]),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Evaluates each checkpoint of a training run as soon as it is completely written.",
    )
    def evaluate_new_checkpoints(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult:
        prefix, _ = storage_settings(storage)
        seen: dict[str, list[int]] = json.loads(context.cursor) if context.cursor else {}
        runs, partitions = [], []
        for e in evals:
            partitions_name = e.partitions_def.name
            known = set(seen.get(partitions_name, []))
            found = list_checkpoints(run_dir_of(e.train.output_path_under(prefix)), known)
            new = sorted(step for step, temporary in found.items() if not temporary)
            if new:
                partitions.append(e.partitions_def.build_add_request([str(s) for s in new]))
                runs += [dg.RunRequest(run_key=f"{partitions_name}:{s}", asset_selection=[e.key], partition_key=str(s),
                                       tags={CHECKPOINT_TAG: str(s)}) for s in new]
            if found:
                seen[partitions_name] = sorted(known | set(found))
        return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=partitions,
                               cursor=json.dumps(seen, sort_keys=True),
                               skip_reason=None if runs else "no new complete checkpoints")

    return evaluate_new_checkpoints
