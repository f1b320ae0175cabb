"""Steps served as Dagster assets, materialized in process and through the real CLI."""

import functools
import json
import os

import dagster as dg
import pytest

from marin_assets import FORCE_TAG, build_assets, build_definitions, load_result
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.dagster.assets import step_of
from marin_assets.dagster.definitions import steps_of
from marin_assets.pipeline.hello import Stats, numbers_step, stats_step
from resources import StorageResource
from tests.support.helpers import BIN, calls, record_call, run_cli, subprocess_env


def hello(n=20):
    numbers = numbers_step("hello/numbers", n=n, seed=1)
    return numbers, stats_step("hello/stats", numbers)


def test_asset_shape_follows_the_step():
    numbers, stats = hello()
    defs = build_definitions([stats])
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey(["hello", "stats"])
    node = graph.get(key)
    assert node.code_version == stats.hash
    assert node.parent_keys == {dg.AssetKey(["hello", "numbers"])}
    assert node.group_name == "hello"
    assert "python" in node.kinds
    assert "Count, mean, standard deviation" in node.description
    assert steps_of(defs) == {dg.AssetKey(["hello", "numbers"]): numbers, key: stats}


def test_a_large_graph_is_prebuilt_with_the_collector_back_on(prefix, local_ray):
    """1000+ assets: the repository is built eagerly with the collector paused, then frozen;
    the collector is on again afterwards and the prebuilt job still runs its ops in order."""
    import gc

    numbers, stats = hello()
    leaves = [Step(name=f"bulk/s{i:04d}", fn=functools.partial(record_call, "bulk"), deps=[stats]) for i in range(998)]
    defs = build_definitions(leaves)
    assert gc.isenabled()
    assert len(defs.resolve_asset_graph().get_all_asset_keys()) == 1000
    job = defs.resolve_implicit_global_asset_job_def()
    plan = job.get_subset(asset_selection={dg.AssetKey(["hello", "numbers"]), dg.AssetKey(["hello", "stats"])})
    result = plan.execute_in_process()
    assert result.success
    materialized = [e.asset_key for e in result.get_asset_materialization_events()]
    assert materialized == [dg.AssetKey(["hello", "numbers"]), dg.AssetKey(["hello", "stats"])]


def test_two_steps_with_one_name_fail_at_load_and_one_step_twice_is_one_asset():
    numbers, stats = hello(n=20)
    _, other_stats = hello(n=21)
    with pytest.raises(StepDefinitionError, match="two different steps are named"):
        build_assets([stats, Step(name="x/y", fn=lambda out: None, deps=[other_stats])])
    assets = build_assets([stats, numbers, hello(n=20)[1]])
    assert [step_of(a).name for a in assets] == ["hello/numbers", "hello/stats"]


def materialized(result):
    return {e.asset_key.to_user_string(): e.materialization for e in result.get_asset_materialization_events()}


def test_materialize_then_cache_hit_with_metadata_and_data_version(prefix, local_ray, tmp_path):
    events = str(tmp_path / "events")
    numbers, stats = hello()
    counted = Step(name="hello/numbers", fn=functools.partial(record_call, events, numbers.fn),
                   hash_attrs=numbers.hash_attrs)
    defs = build_definitions([stats_step("hello/stats", counted)],
                             resources={"storage": StorageResource(stale_timeout=5, heartbeat_interval=1)})
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    first = materialized(job.execute_in_process(instance=instance))
    second = materialized(job.execute_in_process(instance=instance))
    assert len(calls(events)) == 1 and calls(events)[0] != os.getpid()  # ran once, in a Ray worker
    assert first["hello/stats"].metadata["cached"].value is False
    assert {m.metadata["cached"].value for m in second.values()} == {True}
    md = first["hello/stats"].metadata
    assert isinstance(md["output_path"], dg.PathMetadataValue)
    assert md["output_path"].value == stats.output_path == f"{prefix}/hello/stats_{stats.hash}"
    assert md["hash"].value == stats.hash
    assert md["result.count"].value == 20
    assert first["hello/stats"].tags["dagster/data_version"] == stats.hash
    assert load_result(stats, Stats).count == 20


def test_force_by_config_and_by_run_tag_recomputes(prefix, local_ray, tmp_path):
    events = str(tmp_path / "events")
    step = Step(name="t/forced", fn=functools.partial(record_call, events, lambda out: None))
    job = build_definitions([step]).resolve_implicit_global_asset_job_def()
    job.execute_in_process()
    job.execute_in_process()
    assert len(calls(events)) == 1
    res = job.execute_in_process(run_config={"ops": {"t__forced": {"config": {"force": True}}}})
    assert len(calls(events)) == 2 and materialized(res)["t/forced"].metadata["cached"].value is False
    job.execute_in_process(tags={FORCE_TAG: "t/forced"})
    job.execute_in_process(tags={FORCE_TAG: "other/asset"})
    assert len(calls(events)) == 3


def test_failed_step_fails_the_run_with_the_original_error(prefix, local_ray):
    step = Step(name="t/bad", fn=lambda out: 1 / 0)
    result = build_definitions([step]).resolve_implicit_global_asset_job_def().execute_in_process(raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure.cause.cls_name == "ZeroDivisionError"
    assert "division by zero" in failure.cause.message


def test_dagster_cli_materializes_into_a_real_dagster_home(prefix, dagster_home):
    env = subprocess_env()
    for _ in range(2):
        run_cli(BIN / "dagster", "asset", "materialize", "-f", "definitions.py", "--select", "*hello/report", env=env)
    instance = dg.DagsterInstance.get()  # DAGSTER_HOME from the fixture
    runs = instance.get_runs()
    assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    keys = [dg.AssetKey(["hello", n]) for n in ("numbers", "stats", "report")]
    for key in keys:
        events = instance.fetch_materializations(key, limit=10).records
        assert [e.asset_materialization.metadata["cached"].value for e in events] == [True, False]
    status = json.loads(run_cli(BIN / "marin-assets", "status", "--select", "*hello/report", "--json", env=env).stdout)
    assert {r["asset_key"]: (r["status"], r["cached"]) for r in status} == {
        "hello/numbers": ("SUCCESS", True), "hello/stats": ("SUCCESS", True), "hello/report": ("SUCCESS", True)}
    assert all(os.path.isdir(r["output_path"]) and r["output_path"].startswith(prefix) for r in status)


def test_workspace_yaml_loads_the_project_definitions(dagster_home):
    out = run_cli(BIN / "dagster", "definitions", "validate", "-w", "workspace.yaml", env=subprocess_env())
    assert "Validation successful for code location marin_assets" in out.stdout + out.stderr
