"""The source sensor against real sources: a local HTTP server, a local folder, the hub emulator.

Each test materializes the graph through Dagster, ticks the sensor with a real instance, runs
what it requests through Dagster, and checks what was recomputed and what stayed cached.
"""

import functools
import json
import os
from pathlib import Path

import dagster as dg
import pytest

from marin_assets import FORCE_TAG, build_definitions, read_record
from marin_assets.core.step import Step
from marin_assets.dagster import source_sensor
from marin_assets.dagster.source_sensor import SOURCE_VERSION_TAG
from marin_assets.pipeline.data.download import hf_download_step, url_download_step
from resources import StorageResource
from tests.support.helpers import calls, record_call
from tests.support.hub_server import HubRepo, release_hub, serve_hub, use_hub
from tests.support.servers import serve_directory


def count_lines(download: Step, output_path: str) -> int:
    """Lines in every file of the download: a step that reads the source's content."""
    root = Path(download.output_path)
    return sum(len(p.read_text().splitlines()) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def graph(download: Step, events: str) -> tuple[Step, Step, Step]:
    """download → lines → summary, plus an unrelated step: what a refresh must and must not touch."""
    counted = functools.partial(record_call, events, functools.partial(count_lines, download))
    lines = Step(name="derived/lines", fn=counted, deps=[download])
    summary = Step(name="derived/summary", fn=functools.partial(record_call, events, lambda out: "summary"),
                   deps=[lines])
    unrelated = Step(name="derived/unrelated", fn=functools.partial(record_call, events, lambda out: 1))
    return lines, summary, unrelated


class Harness:
    """A real instance, the definitions, and the sensor ticked with its persisted cursor."""

    def __init__(self, steps: list[Step], prefix: str):
        self.storage = StorageResource(prefix=prefix)
        self.sensor = source_sensor(steps, minimum_interval_seconds=1)
        self.defs = build_definitions(steps, resources={"storage": self.storage}, sensors=[self.sensor])
        self.instance = dg.DagsterInstance.get()
        self.cursor: str | None = None

    def tick(self) -> list[dg.RunRequest]:
        with dg.build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=self.defs,
                                     resources={"storage": self.storage}) as context:
            result = self.sensor(context)
        self.cursor = result.cursor
        return list(result.run_requests or [])

    def run(self, selection, tags=None) -> dict[str, dg.AssetMaterialization]:
        job = self.defs.resolve_implicit_global_asset_job_def()
        selection = [dg.AssetKey.from_user_string(k) if isinstance(k, str) else k for k in selection]
        result = job.execute_in_process(instance=self.instance, asset_selection=selection, tags=tags or {})
        assert result.success
        return {e.asset_key.to_user_string(): e.materialization for e in result.get_asset_materialization_events()}

    def run_request(self, request: dg.RunRequest) -> dict[str, dg.AssetMaterialization]:
        return self.run(request.asset_selection, request.tags)


def keys(request: dg.RunRequest) -> set[str]:
    return {k.to_user_string() for k in request.asset_selection}


def test_changed_file_at_an_http_url_refreshes_the_download_and_what_reads_it(tmp_path, prefix, dagster_home,
                                                                              local_ray):
    served = tmp_path / "served"
    served.mkdir()
    (served / "data.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    events = str(tmp_path / "events")
    with serve_directory(served) as url:
        download = url_download_step("raw/web", [f"{url}/data.jsonl"])
        lines, summary, unrelated = graph(download, events)
        h = Harness([summary, unrelated], prefix)
        first = h.run(["raw/web", "derived/lines", "derived/summary", "derived/unrelated"])
        assert first["derived/lines"].metadata["result"].value == 2
        assert len(calls(events)) == 3

        assert h.tick() == []  # nothing changed upstream: no run
        assert h.tick() == []

        (served / "data.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n')
        [request] = h.tick()
        assert keys(request) == {"raw/web", "derived/lines", "derived/summary"}  # not the unrelated step
        assert request.tags[FORCE_TAG] == "raw/web" and request.tags[SOURCE_VERSION_TAG]
        assert h.tick() == []  # requested once, not again on the next tick

        refreshed = h.run_request(request)
        assert refreshed["raw/web"].metadata["cached"].value is False
        assert refreshed["derived/lines"].metadata["cached"].value is False  # its input's content changed
        assert refreshed["derived/lines"].metadata["result"].value == 3
        assert refreshed["derived/summary"].metadata["cached"].value is False  # built from the changed one
        assert len(calls(events)) == 3 + 2  # lines and summary ran again; unrelated did not
        assert read_record(download.output_path).content_version == request.tags[SOURCE_VERSION_TAG]
        # Dagster's data version follows content: the download's changed, so its children were unsynced.
        assert first["raw/web"].tags["dagster/data_version"] != refreshed["raw/web"].tags["dagster/data_version"]
        assert h.tick() == []  # up to date again


def test_new_file_in_a_local_folder_is_a_change_and_a_rewritten_one_too(tmp_path, prefix, dagster_home, local_ray):
    folder = tmp_path / "incoming"
    folder.mkdir()
    (folder / "one.txt").write_text("1\n")
    events = str(tmp_path / "events")
    download = url_download_step("raw/folder", [str(folder)])
    lines, summary, unrelated = graph(download, events)
    h = Harness([lines], prefix)
    h.run(["raw/folder", "derived/lines"])
    assert h.tick() == []

    (folder / "two.txt").write_text("2\n2\n")
    [request] = h.tick()
    assert keys(request) == {"raw/folder", "derived/lines"}
    assert h.run_request(request)["derived/lines"].metadata["result"].value == 3
    assert h.tick() == []

    os.utime(folder / "one.txt", (1, 1))  # same size, new mtime: rewritten
    assert len(h.tick()) == 1


def a_changed_folder(tmp_path, prefix) -> tuple[Step, Harness, dg.RunRequest]:
    """A folder download materialized, then a file added to it: the download, the harness, the tick's request."""
    folder = tmp_path / "incoming"
    folder.mkdir()
    (folder / "one.txt").write_text("1\n")
    download = url_download_step("raw/folder", [str(folder)])
    h = Harness([download], prefix)
    h.run(["raw/folder"])
    (folder / "two.txt").write_text("2\n")
    [request] = h.tick()
    return download, h, request


def test_a_restarted_sensor_does_not_request_a_change_twice(tmp_path, prefix, dagster_home, local_ray):
    download, h, request = a_changed_folder(tmp_path, prefix)
    persisted = h.cursor
    restarted = Harness([download], prefix)  # a new daemon process reads the cursor it persisted
    restarted.cursor = persisted
    assert restarted.tick() == []
    assert json.loads(persisted) == {download.name_with_hash: request.tags[SOURCE_VERSION_TAG]}


def test_a_refresh_lost_before_it_ran_is_asked_again_with_its_tags(tmp_path, prefix, dagster_home, local_ray):
    """The daemon made the run of a refresh and lost it at dequeue: the next tick asks again (tagged), once."""
    from dagster._core.test_utils import create_run_for_test

    from marin_assets.dagster.resubmit import RESUBMITTED_AFTER_TAG, RESUBMITTED_TAG

    download, h, request = a_changed_folder(tmp_path, prefix)
    lost = create_run_for_test(h.instance, asset_selection=frozenset(request.asset_selection), tags={
        **request.tags, "dagster/sensor_name": h.sensor.name, "dagster/run_key": request.run_key,
        "dagster/max_retries": "0"})  # as the daemon made it; Dagster's own retries used up
    h.instance.report_run_failed(lost, "Caught an unrecoverable error while dequeuing the run")
    [again] = h.tick()
    assert again.run_key == f"{request.run_key}#resubmit-1" and keys(again) == keys(request)
    assert again.tags[FORCE_TAG] == request.tags[FORCE_TAG]
    assert again.tags[SOURCE_VERSION_TAG] == request.tags[SOURCE_VERSION_TAG]
    assert again.tags[RESUBMITTED_TAG] == "1" and again.tags[RESUBMITTED_AFTER_TAG] == lost.run_id
    tags = {**again.tags, "dagster/sensor_name": h.sensor.name, "dagster/run_key": again.run_key}
    h.run(again.asset_selection, tags)
    assert read_record(download.output_path_under(prefix)).content_version == request.tags[SOURCE_VERSION_TAG]
    assert h.tick() == []  # it succeeded: nothing more


def test_a_new_commit_on_a_followed_branch_refreshes_and_a_pinned_commit_is_never_watched(
        tmp_path, prefix, dagster_home, local_ray, monkeypatch):
    repo = HubRepo("user/stories", {"data/a.txt": "one\n"})
    pinned_sha = repo.head
    with serve_hub(repo) as server:
        use_hub(monkeypatch, server.url)
        try:
            branch = hf_download_step("raw/hf-main", "user/stories", "main")
            pinned = hf_download_step("raw/hf-pinned", "user/stories", pinned_sha)
            assert pinned.source_version is None
            h = Harness([branch, pinned], prefix)
            h.run(["raw/hf-main", "raw/hf-pinned"])
            assert read_record(branch.output_path).content_version == pinned_sha
            assert h.tick() == []

            new_sha = repo.commit({"data/b.txt": "two\n"})
            [request] = h.tick()
            assert keys(request) == {"raw/hf-main"} and request.tags[SOURCE_VERSION_TAG] == new_sha
            h.run_request(request)
            assert sorted(os.listdir(Path(branch.output_path) / "data")) == ["a.txt", "b.txt"]
            assert os.listdir(Path(pinned.output_path) / "data") == ["a.txt"]
            assert h.tick() == []
        finally:
            release_hub()


def test_the_sensor_needs_a_changing_source():
    with pytest.raises(ValueError, match="no.*changing source"):
        source_sensor([Step(name="x/y", fn=lambda out: None)])
