"""s3:// storage against a local S3 (moto's server mode): the exactly-once lease kept by S3 conditional
writes (`If-None-Match: *` to create, `If-Match: <etag>` to swap) — the same contract as GCS — a step
materialized end to end, and a store that ignores conditional writes refused at first use."""

import time

import fsspec
import pytest

from marin_assets import materialize_step, read_record
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.step import Step
from marin_assets.core.stores import ConditionalWritesUnsupportedError, S3StatusStore, read_status, status_store
from tests.support.helpers import FAST, subprocess_env
from tests.support.lease_contract import (
    racing_processes_compute_once,
    simultaneous_creates_have_one_winner,
    stale_lease_is_taken_over,
    stale_writer_refused_and_robbed_holder_cannot_succeed,
)
from tests.support.s3_server import header_dropping_proxy, s3_env


def test_racing_processes_on_s3_compute_once(s3_prefix, tmp_path, s3):
    racing_processes_compute_once(s3_prefix, tmp_path / "events", subprocess_env(**s3_env(s3)))


def test_writers_released_together_on_s3_create_one_status(s3_prefix):
    simultaneous_creates_have_one_winner(s3_prefix, S3StatusStore)


def test_a_stale_lease_on_s3_is_taken_over(s3_prefix):
    stale_lease_is_taken_over(s3_prefix, S3StatusStore)


def test_conditional_writes_refuse_a_stale_writer_and_a_robbed_holder_cannot_succeed(s3_prefix):
    stale_writer_refused_and_robbed_holder_cannot_succeed(s3_prefix, S3StatusStore)


def test_a_status_is_deleted_only_if_unchanged(s3_prefix):
    store = S3StatusStore(f"{s3_prefix}/objects/doomed_abc")
    first = store.write_if(None, StatusRecord(Status.SUCCESS, holder="a", token="1", heartbeat=time.time()))
    second = store.write_if(first, StatusRecord(Status.RUNNING, holder="b", token="2", heartbeat=time.time()))
    assert not store.delete_if(first)  # someone wrote since: the garbage collector must not delete it
    assert store.read()[1] == second
    assert store.delete_if(second)
    assert store.read() == (None, None)


def produce(out: str) -> dict:
    with fsspec.open(f"{out}/data/part-0.txt", "w") as f:
        f.write("hello s3")
    return {"parts": 1}


def summarize(source_step: Step):
    def fn(out: str) -> dict:
        from marin_assets import load_result

        parts = load_result(source_step)["parts"]  # the dependency's record, read from S3
        with fsspec.open(f"{out}/summary.txt", "w") as f:
            f.write(f"{parts} part(s)")
        return {"summary_of": parts}

    return fn


def test_steps_materialize_end_to_end_on_s3_and_are_reused(s3_prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = Step(name="s3/source", fn=produce, hash_attrs={"v": 1})
    summary = Step(name="s3/summary", fn=summarize(source), deps=[source], hash_attrs={"v": 1})
    first = [materialize_step(step, prefix=s3_prefix, settings=FAST, run_id="first") for step in (source, summary)]
    assert [o.cached for o in first] == [False, False]
    out = summary.output_path_under(s3_prefix)
    assert out.startswith(f"{s3_prefix}/s3/summary_") and isinstance(status_store(out), S3StatusStore)
    assert read_status(out).status is Status.SUCCESS
    record = read_record(out)
    assert record.result == {"summary_of": 1} and record.deps == [source.name_with_hash]
    fs = fsspec.filesystem("s3")
    assert fs.cat_file(f"{out}/summary.txt") == b"1 part(s)"
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(out, detail=False)) == [
        ".artifact.json", ".status.json", "summary.txt"]  # no probe object left behind
    assert not list(tmp_path.iterdir())  # nothing written locally

    again = materialize_step(summary, prefix=s3_prefix, settings=FAST, run_id="second")
    assert again.cached and again.record.provenance.run_id == "first"

    # a forced recompute lists the old output on S3 and clears it before running again
    fs.pipe_file(f"{source.output_path_under(s3_prefix)}/data/stale.txt", b"old")
    redone = materialize_step(source, prefix=s3_prefix, settings=FAST, run_id="third", recompute="forced by test")
    assert not redone.cached and "recompute" in redone.took_over
    fs.invalidate_cache()
    assert not fs.exists(f"{redone.output_path}/data/stale.txt")
    assert fs.exists(f"{redone.output_path}/data/part-0.txt")
    assert read_record(redone.output_path).provenance.run_id == "third"


@pytest.mark.parametrize("drop, call, failed", [
    (("if-none-match", "if-match"), "write",
     "conditional writes: a second PutObject with If-None-Match: * replaced the object instead of failing (412)"),
    (("if-match",), "write",
     "conditional writes: a PutObject with If-Match: <a wrong ETag> replaced the object instead of failing (412)"),
    (("if-match",), "delete",
     "conditional deletes: a DeleteObject with If-Match: <a wrong ETag> deleted the object instead of failing (412)"),
])
def test_a_store_that_ignores_conditional_requests_is_refused_at_first_use(s3, s3_prefix, monkeypatch, drop, call,
                                                                           failed):
    with header_dropping_proxy(s3, drop) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy)  # the same data, through a store that drops the headers
        step = Step(name="s3/unsafe", fn=produce, hash_attrs={"v": 1})
        out = step.output_path_under(s3_prefix)
        with pytest.raises(ConditionalWritesUnsupportedError) as caught:
            if call == "write":
                materialize_step(step, prefix=s3_prefix, settings=FAST)
            else:
                S3StatusStore(out).delete_if('"0"')
    assert str(caught.value) == (
        f"S3 endpoint {proxy} (bucket 'marin') does not honour {failed}; exactly-once for {out} needs"
        f" If-None-Match and If-Match{' on DeleteObject' if call == 'delete' else ''} (AWS S3 has them;"
        " for an S3-compatible store, use a version that does)")
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert not fs.exists(out)  # no status, no data, and the probe object was removed
