"""Light steps: run in the Dagster process, never starting Ray, with logs, environment and errors as on Ray."""

import functools
import json
import logging
import os
import signal
import sys
import threading

import dagster as dg
import pytest

from marin_assets import Resources, Step, build_definitions
from marin_assets.core.light import is_light, light
from marin_assets.core.materialize import materialize_step
from marin_assets.core.record import ArtifactRecord, read_record
from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from marin_assets.execution.ray_runner import StepRunner, ray_runner, runs_in_process
from marin_assets.execution.relay import StepCall, call_relaying
from marin_assets.pipeline.hello import numbers_step
from resources import RayResource
from tests.support.helpers import FAST

log = logging.getLogger("test")


@light
def report(output_path):
    """Prints and logs a line, then reports where it ran and what it saw."""
    print("hello from a light step")
    logging.getLogger("light.fake").info("halfway there")
    os.makedirs(output_path, exist_ok=True)
    return {"pid": os.getpid(), "flag": os.environ.get("MARIN_TEST_FLAG"), "prefix": os.environ.get("MARIN_PREFIX")}


def no_ray(*args, **kwargs):
    raise AssertionError("Ray was started or joined for a light step")


def test_a_light_step_runs_in_the_dagster_process_without_starting_ray(prefix, monkeypatch):
    monkeypatch.setattr(RayResource, "connect", no_ray)
    monkeypatch.delenv("MARIN_TEST_FLAG", raising=False)
    step = Step(name="light/report", fn=report)
    defs = build_definitions([step], resources={"ray": RayResource(env_vars={"MARIN_TEST_FLAG": "on"})})
    instance = dg.DagsterInstance.ephemeral()
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
    assert result.success
    assert read_record(step.output_path).result == {"pid": os.getpid(), "flag": "on", "prefix": prefix}
    assert "MARIN_TEST_FLAG" not in os.environ  # the step's environment was put back
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["ran_in"].value == "process"
    assert metadata["startup_s"].value == 0.0
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any(m.endswith("[light/report] hello from a light step") for m in messages)
    assert any(m.endswith("[light/report] INFO light.fake: halfway there") for m in messages)
    # Cached the second time: no placement, no start-up to show.
    again = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
    cached = again.get_asset_materialization_events()[0].materialization.metadata
    assert cached["cached"].value is True and "ran_in" not in cached


def test_which_steps_run_in_process():
    embedded, default = RayResource(), Resources()

    def here(fn=report, resources=default, resource=embedded):
        return runs_in_process(Step(name="light/x", fn=fn, resources=resources), resource)

    assert here()
    assert here(fn=functools.partial(report))  # a partial of a light function is light
    assert here(fn=light(functools.partial(lambda seconds, out: None, 1)))
    assert not here(fn=lambda out: None)  # unmarked: Ray
    for heavier in (Resources(cpu=2), Resources(memory_gb=4), Resources(gpu=1), Resources(tpu_type="v4-8")):
        assert not here(resources=heavier), heavier
    assert not here(resource=RayResource(address="auto"))  # a cluster: every step is a Ray task
    assert not here(resource=RayResource(light_steps_in_process=False))
    # The hello world's unmarked steps keep running on Ray.
    assert not is_light(numbers_step("hello/numbers", n=3, seed=1).fn)


def parse(output_path):
    print("reading row 7", end="")  # no newline: still relayed
    raise ValueError("bad JSON on row 7")


def test_a_failing_light_step_keeps_its_exception_and_is_marked_failed(prefix, monkeypatch):
    monkeypatch.setattr(RayResource, "connect", no_ray)
    step = Step(name="light/parse", fn=light(parse))
    lines = []
    runner = ray_runner(RayResource(), type("Log", (), {"info": lambda self, m: lines.append(m)})())
    stdout, handlers = sys.stdout, list(logging.getLogger().handlers)
    with pytest.raises(ValueError, match="bad JSON on row 7"):
        materialize_step(step, settings=FAST, run_fn=runner)
    status = read_status(step.output_path)
    assert status.status is Status.FAILED and "ValueError: bad JSON on row 7" in status.error
    assert "[light/parse] reading row 7" in lines
    assert sys.stdout is stdout and logging.getLogger().handlers == handlers  # nothing left behind


def interrupted(output_path):
    """Interrupts the process it runs in (as terminating a run does), then would sleep on."""
    os.kill(os.getpid(), signal.SIGINT)
    threading.Event().wait(60)
    return "finished"


def test_interrupting_a_run_stops_a_light_step_inside_its_function(prefix, monkeypatch):
    monkeypatch.setattr(RayResource, "connect", no_ray)
    step = Step(name="light/interrupted", fn=light(interrupted))
    # Python's own SIGINT handler, as a fresh `dagster` process has it: a handler another test installed in this
    # worker process (Dagster's interrupt capture) may linger and swallow the signal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            materialize_step(step, settings=FAST, run_fn=ray_runner(RayResource(), log))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "interrupted" in [entry.name for entry in caught.traceback]  # raised inside the function, not beside it
    assert read_status(step.output_path).status is Status.FAILED


def test_in_process_relay_passes_on_the_functions_own_lines_once():
    """What `emit` itself prints or logs (Dagster's log does) is not relayed again, and other threads'
    output is not the step's."""
    emitted: list[str] = []

    def emit(lines):
        emitted.extend(lines)
        print(f"echo {lines}")
        logging.getLogger("dagster.fake").warning("logged %s", lines)

    def fn(output_path):
        other = threading.Thread(target=print, args=("from another thread",))
        other.start()
        other.join()
        print("one\ntwo")
        logging.getLogger("step.fake").info("three")
        return output_path

    result = call_relaying(StepCall("x", fn), "/out", "/prefix", {}, emit)
    assert result == "/out"
    assert emitted == ["one", "two", "INFO step.fake: three"]


class CountingConnection:
    """A Ray connection that only counts and takes a moment to connect."""

    fail_fast = True
    embedded = True
    light_steps_in_process = True

    def __init__(self):
        self.connects = 0

    def connect(self):
        self.connects += 1
        threading.Event().wait(0.05)

    def worker_env(self):
        return {}


def test_start_up_is_timed_apart_and_only_for_steps_that_need_ray(tmp_path):
    connection = CountingConnection()
    runner = StepRunner(connection, log)
    step = Step(name="light/a", fn=light(functools.partial(lambda seconds, out: threading.Event().wait(seconds), 0.05)))
    assert runner.prepare(step) == 0.0
    runner(step, str(tmp_path / "a"), str(tmp_path), threading.Event())
    startup, work = runner.timing()
    assert connection.connects == 0 and runner.ran_in == "process" and startup == 0.0 and work >= 0.05
    seconds = runner.prepare(Step(name="ray/b", fn=lambda out: None))
    assert connection.connects == 1 and seconds >= 0.05


def test_a_record_written_before_start_up_was_recorded_still_reads():
    record = ArtifactRecord(name="a/b", hash="h", hash_attrs={}, deps=[], output_path="/x", result=None,
                            result_type=None, provenance=None, duration_s=1.5)  # type: ignore[arg-type]
    data = json.loads(record.to_json())
    data.pop("startup_s")
    data["provenance"] = {"run_id": None, "user": "u", "host": "h", "git_commit": None, "created_at": "t",
                          "command_line": []}
    old = ArtifactRecord.from_json(json.dumps(data))
    assert (old.duration_s, old.startup_s) == (1.5, 0.0)
