"""The unsynced-refresh schedule and the automation conditions, evaluated against a real instance."""

import functools
from pathlib import Path

import dagster as dg

from marin_assets import FORCE_TAG, build_definitions
from marin_assets.core.plan import plan
from marin_assets.core.step import Step
from marin_assets.dagster import automate, automation_sensor, unsynced_schedule
from marin_assets.pipeline.data.download import url_download_step
from marin_assets.pipeline.hello import numbers_step, report_step, stats_step
from resources import StorageResource

SELECTION = dg.AssetSelection.groups("hello")


def hello(n: int = 50, title: str = "T"):
    numbers = numbers_step("hello/numbers", n=n, seed=3)
    stats = stats_step("hello/stats", numbers)
    return [report_step("hello/report", stats, title=title)]


def definitions(steps, prefix, **kwargs) -> dg.Definitions:
    return build_definitions(steps, resources={"storage": StorageResource(prefix=prefix)}, **kwargs)


def tick(schedule: dg.ScheduleDefinition, defs: dg.Definitions, instance: dg.DagsterInstance):
    # As a context manager: the context enters the instance (Dagster's current state storage)
    # and must leave it, or a later Definitions load finds a dead instance.
    with dg.build_schedule_context(instance=instance, repository_def=defs.get_repository_def()) as context:
        data = schedule.evaluate_tick(context)
    return data.run_requests or [], data.skip_message


def materialize(defs: dg.Definitions, instance: dg.DagsterInstance, keys=None) -> set[str]:
    job = defs.resolve_implicit_global_asset_job_def()
    selection = [dg.AssetKey.from_user_string(k) for k in keys] if keys else None
    result = job.execute_in_process(instance=instance, asset_selection=selection)
    assert result.success
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def selected(request: dg.RunRequest) -> set[str]:
    return {k.to_user_string() for k in request.asset_selection}


def test_schedule_requests_only_unsynced_assets(prefix, dagster_home, local_ray):
    instance = dg.DagsterInstance.get()
    schedule = unsynced_schedule(SELECTION, "*/5 * * * *")
    defs = definitions(hello(), prefix, schedules=[schedule])

    [request], _ = tick(schedule, defs, instance)  # never materialized: all missing
    assert selected(request) == {"hello/numbers", "hello/stats", "hello/report"}
    materialize(defs, instance, selected(request))

    requests, skipped = tick(schedule, defs, instance)
    assert requests == [] and "up to date" in skipped  # nothing to do, no run

    changed = definitions(hello(title="New title"), prefix, schedules=[schedule])  # only the report's hash changes
    [request], _ = tick(schedule, changed, instance)
    assert selected(request) == {"hello/report"}
    materialize(changed, instance, selected(request))
    assert tick(schedule, changed, instance)[0] == []

    upstream = definitions(hello(n=60, title="New title"), prefix, schedules=[schedule])  # the root changes
    [request], _ = tick(schedule, upstream, instance)
    assert selected(request) == {"hello/numbers", "hello/stats", "hello/report"}  # identity flows downstream


def evaluate(defs, instance, cursor=None) -> tuple[set[str], object]:
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
    keys = [k for k in defs.resolve_asset_graph().get_all_asset_keys() if result.get_requested_partitions(k)]
    return {k.to_user_string() for k in keys}, result.cursor


def folder_pipeline(folder: Path, version: int = 1) -> list[Step]:
    download = url_download_step("raw/folder", [str(folder)])
    lines = Step(name="derived/lines", fn=functools.partial(count_lines, download), deps=[download],
                 hash_attrs={"version": version})
    return [lines]


def count_lines(download: Step, output_path: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in Path(download.output_path).glob("*.txt"))


def test_automation_condition_follows_identity_and_dependency_data(tmp_path, prefix, dagster_home, local_ray):
    instance = dg.DagsterInstance.get()
    folder = tmp_path / "incoming"
    folder.mkdir()
    (folder / "a.txt").write_text("1\n")

    def defs_of(steps):
        return definitions(steps, prefix, automation=automate(steps), sensors=[automation_sensor(steps)])

    defs = defs_of(folder_pipeline(folder))
    requested, cursor = evaluate(defs, instance)
    assert requested == set()  # Dagster's rule: what is missing when automation starts is not backfilled
    materialize(defs, instance)
    requested, cursor = evaluate(defs, instance, cursor)
    assert requested == set()

    # A cache-hit re-materialization keeps the data version: nothing downstream is set off.
    materialize(defs, instance, ["raw/folder"])
    requested, cursor = evaluate(defs, instance, cursor)
    assert requested == set()

    # The source changed and the download was refreshed (as the source sensor does): its data
    # version changed, so the step reading it is requested, and recomputes.
    (folder / "b.txt").write_text("2\n")
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey(["raw", "folder"])],
                                  tags={FORCE_TAG: "raw/folder"}).success
    requested, cursor = evaluate(defs, instance, cursor)
    assert requested == {"derived/lines"}
    [row] = [r for r in plan(folder_pipeline(folder), {"derived/lines"}, prefix) if r.asset_key == "derived/lines"]
    assert row.action == "run" and "inputs changed" in row.reason and "raw/folder" in row.reason
    result = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey(["derived", "lines"])])
    [event] = result.get_asset_materialization_events()
    assert event.materialization.metadata["result"].value == 2
    requested, cursor = evaluate(defs, instance, cursor)
    assert requested == set()

    # A changed hash_attr changes the identity hash, the code version: requested on the next tick.
    defs = defs_of(folder_pipeline(folder, version=2))
    requested, cursor = evaluate(defs, instance, cursor)
    assert requested == {"derived/lines"}
    materialize(defs, instance, ["derived/lines"])
    requested, cursor = evaluate(defs, instance, cursor)
    assert requested == set()
