"""Steps on a real local Ray: workers, CPU requests, env, fail-fast, tracebacks, live logs."""

import functools
import json
import logging
import os
import threading
import time

import dagster as dg
import pytest

from marin_assets import Resources, Step, StepDefinitionError, build_definitions
from marin_assets.core.lease import LeaseLostError
from marin_assets.core.materialize import materialize_step
from marin_assets.core.record import read_record
from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from marin_assets.execution.ray_runner import RemoteTraceback, run_on_ray
from marin_assets.execution.requests import InfeasibleRequestError, RayRequest, check_feasible
from resources import RayResource
from tests.support.helpers import FAST

log = logging.getLogger("test")


def ray_fn(resource=None):
    resource = resource or RayResource()
    return lambda step, out, prefix, stop: run_on_ray(step, out, prefix, stop, resource, log)


def report_env(output_path):
    return {"pid": os.getpid(), "flag": os.environ.get("MARIN_TEST_FLAG"), "prefix": os.environ.get("MARIN_PREFIX"),
            "jax": os.environ.get("JAX_PLATFORMS")}


def test_step_runs_in_a_ray_worker_and_gets_its_environment(prefix, local_ray, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    step = Step(name="ray/env", fn=report_env)
    outcome = materialize_step(step, settings=FAST, run_fn=ray_fn(RayResource(env_vars={"MARIN_TEST_FLAG": "on"})))
    result = outcome.record.result
    assert result["pid"] != os.getpid()
    assert result == {"pid": result["pid"], "flag": "on", "prefix": prefix, "jax": "cpu"}


def interval(seconds, output_path):
    start = time.time()
    time.sleep(seconds)
    return [start, time.time()]


def run_concurrently(steps):
    results = {}

    def go(step):
        results[step.name] = materialize_step(step, settings=FAST, run_fn=ray_fn()).record.result

    threads = [threading.Thread(target=go, args=(s,)) for s in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return [results[s.name] for s in steps]


def overlap(a, b):
    return min(a[1], b[1]) - max(a[0], b[0])


def rendezvous(folder, me, other, output_path):
    """Marks this step as running, then waits (up to a minute) to see the other running too."""
    open(os.path.join(folder, me), "w").close()
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(os.path.join(folder, other)):
            return True
        time.sleep(0.05)
    return False


def test_requested_cpus_are_honoured(prefix, local_ray, tmp_path):
    two_cpu = [Step(name=f"ray/two-cpu-{i}", fn=functools.partial(interval, 1.5), resources=Resources(cpu=2))
               for i in range(2)]
    a, b = run_concurrently(two_cpu)
    assert overlap(a, b) <= 0, "two 2-CPU steps ran at once on a 2-CPU Ray"
    # Two 1-CPU steps share a 2-CPU Ray: each waits to see the other running (timing-free, so a slow
    # worker start on a busy CI machine cannot fail it).
    one_cpu = [Step(name=f"ray/one-cpu-{i}", resources=Resources(cpu=1),
                    fn=functools.partial(rendezvous, str(tmp_path), f"s{i}", f"s{1 - i}")) for i in range(2)]
    assert run_concurrently(one_cpu) == [True, True], "two 1-CPU steps should share a 2-CPU Ray"


@pytest.mark.parametrize(
    "resources, needs",
    [
        (Resources(cpu=8), "needs {CPU=8} on one node"),
        (Resources(cpu=1, memory_gb=100_000), "memory=100000.0GiB"),
        (Resources(gpu=1), "GPU=1"),
        (Resources(tpu_type="v4-8"), "TPU-v4-8-head=1"),
        (Resources(tpu_type="v4-32"), "needs a TPU-v4-32-head resource (a 4-host slice)"),
    ],
)
def test_unsatisfiable_request_fails_fast_naming_step_request_and_offer(prefix, local_ray, resources, needs):
    step = Step(name="ray/too-big", fn=report_env, resources=resources)
    raised: list[BaseException] = []

    def materialize():
        try:
            materialize_step(step, settings=FAST, run_fn=ray_fn())
        except BaseException as error:  # noqa: BLE001  (handed to the test thread)
            raised.append(error)

    # Without fail-fast the request would wait forever (the next test): a bound of minutes tells the two
    # apart without timing anything a loaded machine could stretch.
    worker = threading.Thread(target=materialize, daemon=True)
    worker.start()
    worker.join(180)
    assert not worker.is_alive(), "an unsatisfiable request waited instead of failing at once"
    assert len(raised) == 1 and isinstance(raised[0], InfeasibleRequestError), raised
    message = str(raised[0])
    assert "step 'ray/too-big'" in message and needs in message
    assert "Nodes offer: {CPU=2" in message
    assert read_status(step.output_path).status is Status.FAILED


def test_without_fail_fast_a_pending_request_waits_and_a_lost_lease_cancels_it(prefix, local_ray):
    step = Step(name="ray/pending", fn=report_env, resources=Resources(cpu=8))
    stop = threading.Event()
    threading.Timer(2.0, stop.set).start()
    started = time.monotonic()
    with pytest.raises(LeaseLostError):
        run_on_ray(step, step.output_path, prefix, stop, RayResource(fail_fast=False), log)
    assert time.monotonic() - started >= 2.0  # it waited (autoscaler-friendly) until told to stop


def parse_shard(output_path):
    def _inner_parse(line_number):
        raise ValueError(f"bad JSON on line {line_number} of shard 3")

    print("parsing shard 3")
    _inner_parse(17)


def test_exception_keeps_type_message_and_remote_traceback(prefix, local_ray):
    step = Step(name="ray/bad", fn=parse_shard)
    with pytest.raises(ValueError, match="bad JSON on line 17 of shard 3") as e:
        materialize_step(step, settings=FAST, run_fn=ray_fn())
    assert type(e.value) is ValueError
    assert isinstance(e.value.__cause__, RemoteTraceback)
    assert "_inner_parse" in str(e.value.__cause__) and "line 17" in str(e.value.__cause__)
    status = read_status(step.output_path)
    assert status.status is Status.FAILED and "ValueError: bad JSON on line 17" in status.error


def chatty(relayed: str, output_path):
    """Prints a line, then waits (up to two minutes) until the test has seen it in the Dagster run log."""
    print("progress 1/2", flush=True)
    deadline = time.time() + 120
    while not os.path.exists(relayed) and time.time() < deadline:
        time.sleep(0.05)
    logging.getLogger("levanter.fake").info("halfway there")
    print("progress 2/2")
    return {"line 1 was in the run log before line 2 was printed": os.path.exists(relayed)}


def test_worker_output_reaches_the_dagster_run_log_while_it_runs(prefix, local_ray, tmp_path, monkeypatch):
    instance = dg.DagsterInstance.ephemeral()
    relayed = tmp_path / "line-1-relayed"
    store = instance.handle_new_event

    def handle_new_event(event, *args, **kwargs):  # every run-log entry passes here as it is logged
        store(event, *args, **kwargs)
        if event.user_message.endswith("[ray/chatty] progress 1/2"):
            relayed.touch()

    monkeypatch.setattr(instance, "handle_new_event", handle_new_event)
    step = Step(name="ray/chatty", fn=functools.partial(chatty, str(relayed)))
    job = build_definitions([step]).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance)
    assert result.success
    # Relayed as printed, not all at the end: the step went on only once its first line was in the log.
    assert read_record(step.output_path).result == {"line 1 was in the run log before line 2 was printed": True}
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    order = [next(i for i, m in enumerate(messages) if m.endswith(f"[ray/chatty] {line}"))
             for line in ("progress 1/2", "INFO levanter.fake: halfway there", "progress 2/2")]
    assert order == sorted(order)


def test_tpu_request_mapping_follows_ray_semantics():
    single = RayRequest.of(Resources(tpu_type="v4-8"))
    assert (single.hosts, single.resources) == (1, {"TPU": 4.0, "TPU-v4-8-head": 1.0})
    multi = RayRequest.of(Resources(tpu_type="v4-32"))
    assert (multi.hosts, multi.resources, multi.slice_head) == (4, {"TPU": 4.0}, "TPU-v4-32-head")
    assert RayRequest.of(Resources(tpu_type="v6e-8")).resources == {"TPU": 8.0, "TPU-v6e-8-head": 1.0}
    assert RayRequest.of(Resources(tpu_type="v5litepod-16")).hosts == 4
    gpu = RayRequest.of(Resources(cpu=4, gpu=2, gpu_type="H100", memory_gb=8))
    assert gpu.task_options() == {"num_cpus": 4, "max_retries": 0, "num_gpus": 2, "memory": 8 * 2**30,
                                  "accelerator_type": "H100"}


def test_a_multi_host_request_is_placed_on_distinct_nodes_or_refused_naming_how_many_fit():
    two = RayRequest.of(Resources(cpu=2, gpu=1, hosts=2))
    assert (two.hosts, two.placed, two.slice_head) == (2, True, None)
    assert two.describe() == "{CPU=2, GPU=1} on each of 2 distinct nodes"
    assert not RayRequest.of(Resources(tpu_type="v4-32")).placed  # a TPU slice has its own driver
    step = Step(name="train/wide", fn=lambda out: None, resources=Resources(cpu=2, gpu=1, hosts=2))
    big, small = {"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0}
    check_feasible(step, two, [big, big, small])  # two nodes can hold one host each
    with pytest.raises(InfeasibleRequestError, match=r"'train/wide' needs \{CPU=2, GPU=1\} on each of 2 distinct"
                                                     r" nodes \(1 of its nodes can hold one\)"):
        check_feasible(step, two, [big, small, small])
    with pytest.raises(StepDefinitionError, match="hosts must be at least 1"):
        Resources(hosts=0)
    with pytest.raises(StepDefinitionError, match=r"a TPU slice's hosts come from its type \(v4-32\)"):
        Resources(tpu_type="v4-32", hosts=2)


def test_result_is_json_roundtrip(prefix, local_ray):
    step = Step(name="ray/json", fn=lambda out: {"nested": {"xs": [1, 2.5]}})
    outcome = materialize_step(step, settings=FAST, run_fn=ray_fn())
    assert json.loads(json.dumps(outcome.record.result)) == {"nested": {"xs": [1, 2.5]}}


def test_a_function_the_worker_cannot_import_gets_a_clear_error(prefix, local_ray, tmp_path):
    import importlib
    import sys

    (tmp_path / "only_here.py").write_text("def make(output_path):\n    return 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("only_here")
        step = Step(name="ray/unimportable", fn=module.make)
        with pytest.raises(ModuleNotFoundError, match="step 'ray/unimportable': its function cannot be imported"):
            materialize_step(step, settings=FAST, run_fn=ray_fn())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_here", None)


def import_levanter(output_path):
    """Import Levanter's training entry point; report whether this worker had already paid for it."""
    import sys

    already = "levanter.main.train_lm" in sys.modules
    start = time.perf_counter()
    import levanter.main.train_lm  # noqa: F401

    return {"pid": os.getpid(), "already": already, "seconds": time.perf_counter() - start}


def test_a_worker_pays_levanters_import_once_not_per_step(prefix, local_ray):
    """Workers are reused across steps (no `max_calls`, one runtime environment per job): three Levanter steps
    in a row on two CPUs import Levanter at most once per worker, and a later step finds it imported."""
    results = [materialize_step(Step(name=f"ray/levanter-{i}", fn=import_levanter), settings=FAST,
                                run_fn=ray_fn()).record.result for i in range(3)]
    pids = [r["pid"] for r in results]
    assert len(set(pids)) < len(pids), f"every step ran in a fresh worker: {pids}"
    first_of = {}
    for r in results:
        first_of.setdefault(r["pid"], r)
    assert all(r["already"] for r in results if first_of[r["pid"]] is not r), results
    print(f"\nLevanter import per worker: {[round(r['seconds'], 2) for r in results]} s ({pids})")


def test_a_light_step_runs_on_ray_when_in_process_is_turned_off(prefix, local_ray):
    """`light_steps_in_process=False`: every step is a Ray task, the light ones too; the metadata says
    where it ran and how long Ray took to be ready (here it was up already)."""
    from marin_assets.core.light import light

    step = Step(name="ray/light-env", fn=light(report_env))
    defs = build_definitions([step], resources={"ray": RayResource(light_steps_in_process=False)})
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process()
    assert result.success
    assert read_record(step.output_path).result["pid"] != os.getpid()
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["ran_in"].value == "ray"
    assert 0 <= metadata["startup_s"].value < metadata["duration_s"].value


def test_the_record_keeps_the_start_up_apart_from_the_steps_own_work(prefix, local_ray):
    """A step's `duration_s` is its function's own time where it ran; joining Ray and waiting for a worker to
    start it is `startup_s`, kept apart (how long either takes is bench/'s business)."""
    from marin_assets.core.light import light
    from marin_assets.execution.ray_runner import ray_runner

    runner = ray_runner(RayResource(), log)
    for step, ran_in in ((Step(name="ray/sleeps", fn=functools.partial(interval, 0.3)), "ray"),
                         (Step(name="light/sleeps", fn=light(functools.partial(interval, 0.3))), "process")):
        outcome = materialize_step(step, settings=FAST, run_fn=runner)
        record = outcome.record
        assert runner.ran_in == ran_in
        # the record holds what the runner measured, each part apart: the function's own work where it ran,
        # and the start-up before it
        startup, work = runner.timing()
        assert work is not None and record.duration_s == round(work, 3)
        assert record.startup_s == round(startup, 3)
        assert (record.startup_s > 0) == (ran_in == "ray")  # a task's wait for its worker; nothing in process
