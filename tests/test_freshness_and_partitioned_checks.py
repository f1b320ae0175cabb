"""Freshness policies and partitioned asset checks, read back through Dagster's GraphQL — what the UI shows.

A followed source and the per-checkpoint evaluations of a training run carry a freshness policy; a step's
own output never does (it is content-addressed, it cannot go stale by age). The freshness daemon's
evaluation is run here as the daemon runs it, at chosen times. The checks of the per-checkpoint evaluation
asset are partitioned: a checkpoint whose evaluation fails a check shows the failure on its own partition.
"""

import contextlib
import csv
import datetime
import json
import math
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import InProcessTestWorkspaceLoadTarget, freeze_time
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._daemon.freshness import FreshnessDaemon
from dagster_graphql.test.utils import execute_dagster_graphql

from marin_assets import build_definitions, materialize_step
from marin_assets.core.step import walk
from marin_assets.dagster import checkpoint_evals_asset, source_sensor
from marin_assets.dagster.freshness import (
    CHECKPOINT_EVALS_FRESHNESS,
    FOLLOWED_METADATA_KEY,
    FOLLOWED_SOURCE_FRESHNESS,
    followed_freshness,
    policies_of,
)
from marin_assets.pipeline.training.checkpoints import run_dir_of
from resources import StorageResource
from tests.support import freshness_definitions as fd
from tests.support.helpers import ROOT

DEFINITIONS = ROOT / "tests" / "support" / "freshness_definitions.py"

ASSET = """query ($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) { ... on AssetNode {
  internalFreshnessPolicy { ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } }
  freshnessStatusInfo { freshnessStatus }
  assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } }
  assetChecksOrError { ... on AssetChecks { checks {
    name partitionDefinition { description }
    partitionStatuses { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } }
  } } }
} } }"""

EXECUTIONS = """query ($path: [String!]!, $check: String!, $partition: String) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $check, partition: $partition, limit: 10) {
    partition status evaluation { success description }
  }
}"""


@contextlib.contextmanager
def served(attribute: str) -> Iterator[WorkspaceProcessContext]:
    """The definitions `attribute` of tests/support/freshness_definitions.py, loaded as the webserver loads a
    code location (in this process), on the current instance."""
    origin = LoadableTargetOrigin(python_file=str(DEFINITIONS), attribute=attribute, working_directory=str(ROOT))
    with WorkspaceProcessContext(dg.DagsterInstance.get(),
                                 InProcessTestWorkspaceLoadTarget(InProcessCodeLocationOrigin(origin))) as workspace:
        yield workspace


def query(workspace: WorkspaceProcessContext, text: str, **variables) -> dict:
    with workspace.create_request_context() as context:  # as the webserver serves a request
        return execute_dagster_graphql(context, text, variables).data


def asset(workspace: WorkspaceProcessContext, name: str) -> dict:
    return query(workspace, ASSET, path=name.split("/"))["assetNodeOrError"]


def status_of(workspace: WorkspaceProcessContext, name: str) -> str:
    """The asset's freshness status (HEALTHY, WARNING, DEGRADED, UNKNOWN: the page's Passing, Warning, Failed,
    Not evaluated)."""
    return asset(workspace, name)["freshnessStatusInfo"]["freshnessStatus"]


def materialized_at(step) -> datetime.datetime:
    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey(step.name.split("/")))
    return datetime.datetime.fromtimestamp(event.timestamp, datetime.UTC)


def evaluate_freshness(workspace: WorkspaceProcessContext, at: datetime.datetime) -> None:
    """One iteration of Dagster's freshness daemon (`dg dev` runs it every 30 s), as if run at `at`."""
    with freeze_time(at):
        for _ in FreshnessDaemon().run_iteration(workspace):
            pass


def window(fail: datetime.timedelta, warn: datetime.timedelta) -> dg.FreshnessPolicy:
    return dg.FreshnessPolicy.time_window(fail_window=fail, warn_window=warn)


def run(definitions: dg.Definitions, selection, partition: str | None = None, tags=None) -> dg.ExecuteInProcessResult:
    job = definitions.resolve_implicit_global_asset_job_def()
    keys = [dg.AssetKey.from_user_string(k) if isinstance(k, str) else k for k in selection]
    result = job.execute_in_process(instance=dg.DagsterInstance.get(), asset_selection=keys, partition_key=partition,
                                    tags=tags or {}, raise_on_error=False)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    return result


def test_only_followed_sources_and_checkpoint_evaluations_get_a_policy_and_it_is_the_one_set(tmp_path):
    """Where the defaults apply, where a setting replaces them, and that `freshness=None` leaves none."""
    f = fd.followed_graph(str(tmp_path))
    t = fd.training_graph()
    assert policies_of(f.definitions) == {dg.AssetKey(["raw", "followed-docs"]): FOLLOWED_SOURCE_FRESHNESS}
    assert FOLLOWED_SOURCE_FRESHNESS == window(datetime.timedelta(days=7), datetime.timedelta(days=1))
    assert f.sensor.metadata[FOLLOWED_METADATA_KEY].value["sources"] == ["raw/followed-docs"]  # on the sensor's page
    # Per-checkpoint evaluations of a training not yet run: the family's policy; no step of the graph has one.
    assert policies_of(t.definitions) == {dg.AssetKey(["evals", "fresh-llama-checkpoints"]): CHECKPOINT_EVALS_FRESHNESS}
    assert CHECKPOINT_EVALS_FRESHNESS == window(datetime.timedelta(hours=24), datetime.timedelta(hours=6))

    hourly = window(datetime.timedelta(hours=2), datetime.timedelta(minutes=30))
    deadline = dg.FreshnessPolicy.cron(deadline_cron="0 9 * * *", lower_bound_delta=datetime.timedelta(hours=1))
    for policy in (hourly, deadline):  # a setting of either kind reaches the asset as given
        sensor = source_sensor([f.lines], freshness=policy)
        assert followed_freshness([sensor]) == {"raw/followed-docs": policy}
        served_defs = build_definitions([f.lines], sensors=[sensor],
                                        extra_assets=[checkpoint_evals_asset(t.evals, freshness=policy)])
        assert set(policies_of(served_defs).values()) == {policy} and len(policies_of(served_defs)) == 2
    none = build_definitions([f.lines], sensors=[source_sensor([f.lines], freshness=None)],
                             extra_assets=[checkpoint_evals_asset(t.evals, freshness=None)])
    assert policies_of(none) == {}


def test_a_followed_source_passes_warns_fails_as_it_ages_and_passes_again_when_its_source_moves(
        tmp_path, prefix, dagster_home, local_ray, monkeypatch):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "json.txt").write_text(json.__doc__)  # real text: the standard library's documentation
    monkeypatch.setenv("MARIN_FOLLOWED_FOLDER", str(folder))
    f = fd.followed_graph(str(folder))
    storage = StorageResource(prefix=prefix)
    with served("followed") as workspace:
        # What the asset page asks before it shows a status at all: is the freshness daemon on (the default).
        assert query(workspace, "{ instance { freshnessEvaluationEnabled } }")["instance"] == {
            "freshnessEvaluationEnabled": True}
        source, lines = asset(workspace, "raw/followed-docs"), asset(workspace, "derived/followed-lines")
        assert source["internalFreshnessPolicy"] == {"failWindowSeconds": 7 * 86400, "warnWindowSeconds": 86400}
        assert lines["internalFreshnessPolicy"] is None  # content-addressed: never stale by age
        assert source["freshnessStatusInfo"]["freshnessStatus"] == "UNKNOWN"  # "Not evaluated"
        assert lines["freshnessStatusInfo"] is None

        first = run(f.definitions, ["raw/followed-docs", "derived/followed-lines"])
        assert first.asset_materializations_for_node("derived__followed_lines")[0].metadata["result"].value == len(
            json.__doc__.splitlines())
        t1 = materialized_at(f.download)
        for after, status in ((datetime.timedelta(hours=1), "HEALTHY"), (datetime.timedelta(days=2), "WARNING"),
                              (datetime.timedelta(days=8), "DEGRADED")):  # Passing, Warning, Failed
            evaluate_freshness(workspace, t1 + after)
            assert status_of(workspace, "raw/followed-docs") == status, after

        (folder / "csv.txt").write_text(csv.__doc__)  # the source moves: the sensor refreshes it
        with dg.build_sensor_context(instance=dg.DagsterInstance.get(), definitions=f.definitions,
                                     resources={"storage": storage}) as context:
            [request] = f.sensor(context).run_requests
        refreshed = run(f.definitions, request.asset_selection, tags=request.tags)
        assert refreshed.asset_materializations_for_node("derived__followed_lines")[0].metadata["result"].value == (
            len(json.__doc__.splitlines()) + len(csv.__doc__.splitlines()))
        t2 = materialized_at(f.download)
        assert t2 > t1
        # Between a week after the first version and a week after the refresh: failed without the refresh,
        # only warning with it.
        evaluate_freshness(workspace, t1 + datetime.timedelta(days=7) + (t2 - t1) / 2)
        assert status_of(workspace, "raw/followed-docs") == "WARNING"
        evaluate_freshness(workspace, t2 + datetime.timedelta(hours=1))
        assert status_of(workspace, "raw/followed-docs") == "HEALTHY"


def diverge(checkpoint: Path) -> None:
    """Make `checkpoint` what a diverged step writes: the model's final norm weights NaN (tensorstore, the
    layout its manifest declares), so every loss computed from it is NaN."""
    import tensorstore as ts

    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert (manifest["array_driver"], manifest["kvstore_driver"]) == ("zarr3", "ocdbt")
    [entry] = [a for a in manifest["arrays"] if a["path"] == "model/transformer/norm/weight"]
    array = ts.open({"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{checkpoint}",
                                                    "path": entry["path"] + "/"}}, open=True).result()
    array.write(np.full(entry["shape"], np.nan, dtype=entry["dtype"])).result()


def test_a_diverged_checkpoint_fails_its_check_on_its_own_partition_and_a_finished_run_has_no_policy(
        prefix, dagster_home, local_ray):
    t = fd.training_graph()
    key, check = "evals/fresh-llama-checkpoints", "every_set_evaluated"
    with served("training") as workspace:  # loaded before the run: its evaluations are due while it trains
        family = asset(workspace, key)
        assert family["internalFreshnessPolicy"] == {"failWindowSeconds": 86400, "warnWindowSeconds": 6 * 3600}
        assert asset(workspace, t.pipeline["train"].name)["internalFreshnessPolicy"] is None
        [spec] = family["assetChecksOrError"]["checks"]
        assert spec["name"] == check and "Dynamic partitions" in spec["partitionDefinition"]["description"]

    for step in walk([t.pipeline["train"]]):
        materialize_step(step, prefix=prefix)
    run_dir = Path(run_dir_of(t.pipeline["train"].output_path))
    diverge(run_dir / "step-3")

    instance = dg.DagsterInstance.get()
    with dg.build_sensor_context(instance=instance, definitions=t.definitions,
                                 resources={"storage": StorageResource(prefix=prefix)}) as context:
        result = t.sensor(context)  # the checkpoint sensor: a partition and a run per checkpoint
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    assert sorted(int(r.partition_key) for r in result.run_requests) == fd.CHECKPOINTS
    for request in result.run_requests:
        evaluated = run(t.definitions, request.asset_selection, request.partition_key, request.tags)
        [evaluation] = evaluated.get_asset_check_evaluations()
        assert evaluation.partition == request.partition_key
        loss = evaluated.asset_materializations_for_node("evals__fresh_llama_checkpoints")[0].metadata["loss"].value
        assert math.isnan(loss) == (request.partition_key == "3")

    with served("training") as workspace:  # loaded after the run finished: nothing more is due
        family = asset(workspace, key)
        assert family["internalFreshnessPolicy"] is None and family["freshnessStatusInfo"] is None
        # Both checkpoints were evaluated (materialized); the check failed on the diverged one only.
        assert sorted(family["assetPartitionStatuses"]["materializedPartitions"]) == ["3", "5"]
        assert family["assetPartitionStatuses"]["failedPartitions"] == []
        [statuses] = [c["partitionStatuses"] for c in family["assetChecksOrError"]["checks"]]
        assert statuses == {"succeededPartitions": ["5"], "failedPartitions": ["3"]}
        for partition, status in (("3", "FAILED"), ("5", "SUCCEEDED")):
            [execution] = query(workspace, EXECUTIONS, path=key.split("/"), check=check,
                                partition=partition)["assetCheckExecutions"]
            assert execution["partition"] == partition and execution["status"] == status
        [failed] = query(workspace, EXECUTIONS, path=key.split("/"), check=check, partition="3")["assetCheckExecutions"]
        assert failed["evaluation"] == {"success": False, "description": "no finite loss for stories"}


def test_an_unstarted_or_unreadable_training_keeps_the_policy(prefix):
    """Only a readable SUCCESS status removes it: no output yet, or a status that cannot be read, keeps it
    (and never fails the load)."""
    t = fd.training_graph()
    family = dg.AssetKey(["evals", "fresh-llama-checkpoints"])
    assert family in policies_of(t.definitions)  # not started
    status_dir = Path(t.pipeline["train"].output_path)
    status_dir.mkdir(parents=True)
    (status_dir / ".status.json").write_text("{not json")
    assert family in policies_of(fd.training_graph().definitions)


@pytest.mark.parametrize("freshness", [None, CHECKPOINT_EVALS_FRESHNESS])
def test_partitioned_checks_need_no_policy(freshness):
    """The checks are partitioned with their asset whether or not the family has a freshness policy."""
    t = fd.training_graph()
    assets_def = checkpoint_evals_asset(t.evals, freshness=freshness)
    [spec] = assets_def.check_specs
    assert spec.partitions_def is assets_def.partitions_def is not None
