"""materialize_step in one process: cache hits, records, typed results, force, errors."""

import dataclasses
import json
import os

import pytest

from marin_assets.core.lease import acquire
from marin_assets.core.materialize import DependencyNotReadyError, materialize_step
from marin_assets.core.plan import plan
from marin_assets.core.record import (
    RECORD_FILE,
    RecordNotAvailableError,
    load_result,
    read_record,
)
from marin_assets.core.results import StepResultError
from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status, status_store
from marin_assets.pipeline.hello import Stats, numbers_step, stats_step
from tests.support.helpers import FAST


@dataclasses.dataclass(frozen=True)
class Counted:
    calls: int
    label: str


def counting_step(calls: list, name="t/counted", **attrs):
    def fn(output_path):
        calls.append(output_path)
        os.makedirs(output_path, exist_ok=True)
        with open(os.path.join(output_path, f"data-{len(calls)}.txt"), "w") as f:
            f.write("x")
        return Counted(len(calls), "hi")

    return Step(name=name, fn=fn, hash_attrs=attrs)


def test_second_materialization_is_a_cache_hit(prefix):
    calls = []
    step = counting_step(calls, v=1)
    first = materialize_step(step, settings=FAST, run_id="r1")
    second = materialize_step(step, settings=FAST, run_id="r2")
    assert (first.cached, second.cached) == (False, True)
    assert len(calls) == 1
    assert second.record == first.record
    assert first.record.provenance.run_id == "r1"
    assert first.record.hash == step.hash and first.record.hash_attrs == {"v": 1}


def test_typed_result_loads_with_and_without_a_type(prefix):
    step = counting_step([], v=2)
    materialize_step(step, settings=FAST)
    assert load_result(step, Counted) == Counted(1, "hi")
    assert load_result(step) == Counted(1, "hi")  # type recorded as module:qualname


def test_downstream_reads_upstream_result_through_the_record(prefix):
    numbers = numbers_step("h/numbers", n=50, seed=3)
    stats = stats_step("h/stats", numbers)
    materialize_step(numbers, settings=FAST)
    outcome = materialize_step(stats, settings=FAST)
    result = load_result(stats, Stats)
    assert result.count == 50 and result.min <= result.mean <= result.max
    with open(os.path.join(outcome.output_path, "stats.json")) as f:
        assert json.load(f)["count"] == 50


def test_record_without_success_is_never_served(prefix):
    calls = []
    step = counting_step(calls, v=3)
    out = step.output_path
    os.makedirs(out)
    placeholder = {"name": step.name, "hash": step.hash, "result": {"calls": 99, "label": "fake"}}
    with open(os.path.join(out, RECORD_FILE), "w") as f:
        json.dump(placeholder, f)
    with pytest.raises(RecordNotAvailableError, match="no status"):
        read_record(out)
    lease = acquire(status_store(out), FAST)  # a RUNNING holder
    with pytest.raises(RecordNotAvailableError, match="RUNNING"):
        load_result(step)
    lease.finish(Status.FAILED, "gave up")
    with pytest.raises(RecordNotAvailableError, match="FAILED"):
        load_result(step)
    outcome = materialize_step(step, settings=FAST)  # FAILED → run again, real record replaces it
    assert outcome.cached is False and calls
    assert load_result(step, Counted) == Counted(1, "hi")


def test_force_recomputes_and_rewrites_the_output(prefix):
    calls = []
    step = counting_step(calls, v=4)
    first = materialize_step(step, settings=FAST)
    forced = materialize_step(step, settings=FAST, recompute="forced by the test")
    assert forced.cached is False and forced.took_over == "recompute of SUCCESS: forced by the test"
    assert len(calls) == 2
    files = sorted(os.listdir(first.output_path))
    assert "data-1.txt" not in files and "data-2.txt" in files  # old output cleared first
    assert load_result(step, Counted).calls == 2
    assert read_status(first.output_path).status is Status.SUCCESS


def test_exception_keeps_its_type_and_marks_failed(prefix):
    class Boom(Exception):
        pass

    def fn(output_path):
        raise Boom("tokenizer exploded")

    step = Step(name="t/boom", fn=fn)
    with pytest.raises(Boom, match="tokenizer exploded"):
        materialize_step(step, settings=FAST)
    status = read_status(step.output_path)
    assert status.status is Status.FAILED and "Boom: tokenizer exploded" in status.error


def test_unrecordable_result_fails_clearly(prefix):
    step = Step(name="t/weird", fn=lambda out: object())
    with pytest.raises(StepResultError, match="step 't/weird': result is of type object, which cannot be recorded"):
        materialize_step(step, settings=FAST)
    assert read_status(step.output_path).status is Status.FAILED


def test_missing_dependency_is_a_clear_error_and_touches_nothing(prefix):
    numbers = numbers_step("h/numbers", n=5)
    stats = stats_step("h/stats", numbers)
    with pytest.raises(DependencyNotReadyError, match="h/stats: dependency h/numbers has no successful output"):
        materialize_step(stats, settings=FAST)
    assert not os.path.exists(stats.output_path)


def test_plan_reports_wait_for_a_live_holder(prefix):
    numbers = numbers_step("h/numbers", n=5)
    stats = stats_step("h/stats", numbers)
    lease = acquire(status_store(numbers.output_path), FAST, run_id="other-run")
    try:
        rows = {r.asset_key: r for r in plan([stats], {"h/numbers", "h/stats"}, prefix, FAST)}
        assert rows["h/numbers"].action == "wait" and "other-run" in rows["h/numbers"].reason
        assert rows["h/stats"].action == "run" and "after h/numbers" in rows["h/stats"].reason
    finally:
        lease.finish(Status.FAILED, "test")
    assert not os.path.exists(stats.output_path)  # plan is read-only


def test_a_url_prefix_goes_through_fsspec(monkeypatch):
    import fsspec

    calls = []

    def fn(output_path):
        calls.append(output_path)
        with fsspec.open(f"{output_path}/data.txt", "w") as f:
            f.write("hello")
        return {"bytes": 5}

    step = Step(name="t/remote", fn=fn, hash_attrs={"v": 1})
    first = materialize_step(step, prefix="memory://bucket/run", settings=FAST)
    second = materialize_step(step, prefix="memory://bucket/run", settings=FAST)
    assert first.output_path == f"memory://bucket/run/t/remote_{step.hash}"
    assert (first.cached, second.cached, len(calls)) == (False, True, 1)
    assert read_status(first.output_path).status is Status.SUCCESS
    assert read_record(first.output_path).result == {"bytes": 5}
