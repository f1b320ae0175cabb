"""gs:// storage against a local GCS emulator (fake-gcs-server): the same definitions with a
`gs://` prefix, and the exactly-once lease kept by GCS generation preconditions."""

import json
import subprocess
import sys
import time

import fsspec
import pytest

from marin_assets import materialize_step, read_record
from marin_assets.core.lease import Lease, LeaseLostError, LeaseSettings, acquire
from marin_assets.core.status import GCSStatusStore, Status, StatusRecord, read_status, status_store
from marin_assets.core.step import Step, walk
from tests.support.gcs_emulator import emulator_env
from tests.support.helpers import BIN, ROOT, subprocess_env

FAST = LeaseSettings(heartbeat_interval=0.2, stale_timeout=1.5, poll_interval=0.05)


def test_the_demo_hello_world_materializes_to_gs_through_the_cli(gs_prefix, dagster_home, tmp_path):
    env = subprocess_env(MARIN_PREFIX=gs_prefix, DAGSTER_HOME=str(dagster_home))  # the emulator's variables too
    cmd = [str(BIN / "dagster"), "asset", "materialize", "-f", "definitions.py", "--select", "*hello/report"]
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]

    from marin_assets.experiments import hello_world

    fs = fsspec.filesystem("gs")
    for step in walk(hello_world.steps):
        out = step.output_path_under(gs_prefix)
        assert read_status(out).status is Status.SUCCESS
        assert read_record(out).provenance.run_id
    report = hello_world.report.output_path_under(gs_prefix)
    assert fs.cat_file(f"{report}/report.md").decode().startswith("# Hello, marin-assets")
    assert not list(tmp_path.glob("**/report.md")) and not (ROOT / "gs:").exists()  # nothing written locally
    first_run = read_record(report).provenance.run_id

    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert second.returncode == 0
    assert read_record(report).provenance.run_id == first_run  # a cache hit: the record is the first run's


def test_a_tokenize_step_writes_its_levanter_cache_to_gs(gs_prefix):
    from tests.support.automation_pipeline import pipeline

    outcomes = [materialize_step(step, prefix=gs_prefix, settings=FAST) for step in walk([pipeline["tokenized"]])]
    cache = outcomes[-1].record.result
    assert cache["path"].startswith(gs_prefix) and cache["splits"]["train"]["tokens"] > 0
    fs = fsspec.filesystem("gs")
    assert fs.exists(f"{cache['path']}/train/shard_ledger.json")
    from marin_assets.pipeline.tokenize import CACHE_NOT_EMPTY

    assert CACHE_NOT_EMPTY.fn(cache["path"], cache).passed
    again = materialize_step(pipeline["tokenized"], prefix=gs_prefix, settings=FAST)
    assert again.cached


def start_worker(prefix, events, sleep, env):
    worker = str(ROOT / "tests" / "support" / "lease_worker.py")
    return subprocess.Popen([sys.executable, worker, prefix, str(events), "ok", str(sleep), "0.2", "1.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_racing_processes_on_gs_compute_once(gs_prefix, tmp_path, gcs):
    events = tmp_path / "events"
    env = subprocess_env(**emulator_env(gcs))
    procs = [start_worker(gs_prefix, events, 2.0, env) for _ in range(5)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert events.read_text().split()[0::2] == ["start", "done"]  # one computation
    assert len({r["result_pid"] for r in results}) == 1
    assert sorted(r["cached"] for r in results) == [False] + [True] * 4
    assert read_status(results[0]["output_path"]).status is Status.SUCCESS


def test_a_stale_lease_on_gs_is_taken_over(gs_prefix):
    step = Step(name="gcs/stale", fn=lambda out: "fresh", hash_attrs={"n": 1})
    out = step.output_path_under(gs_prefix)
    store = status_store(out)
    assert isinstance(store, GCSStatusStore)
    dead = StatusRecord(Status.RUNNING, holder="gone:1:x", token="t", heartbeat=time.time() - 60)
    assert store.write_if(None, dead) is not None
    outcome = materialize_step(step, prefix=gs_prefix, settings=FAST)
    assert not outcome.cached and "stale RUNNING by gone:1:x" in outcome.took_over
    assert read_status(out).status is Status.SUCCESS and outcome.record.result == "fresh"


def test_generation_preconditions_refuse_a_stale_writer_and_a_robbed_holder_cannot_succeed(gs_prefix):
    out = f"{gs_prefix}/gcs/robbed_abc"
    store = GCSStatusStore(out)
    first = StatusRecord(Status.RUNNING, holder="a", token="1", heartbeat=time.time())
    version = store.write_if(None, first)
    assert version is not None
    other = StatusRecord(Status.RUNNING, holder="c", token="3", heartbeat=time.time())
    assert store.write_if(None, other) is None  # create-if-absent: it exists now
    second = StatusRecord(Status.RUNNING, holder="b", token="2", heartbeat=time.time())
    assert store.write_if(version, second) is not None
    assert store.write_if(version, other) is None  # a stale generation is refused
    assert store.read()[0] == second

    settings = LeaseSettings(heartbeat_interval=0.2, stale_timeout=0.5, poll_interval=0.05)
    victim = acquire(GCSStatusStore(f"{gs_prefix}/gcs/victim_abc"), settings, run_id="victim")
    assert isinstance(victim, Lease)
    time.sleep(0.6)  # its heartbeat is stale (no heartbeat thread started): another process takes over
    thief = acquire(GCSStatusStore(f"{gs_prefix}/gcs/victim_abc"), settings, run_id="thief")
    assert isinstance(thief, Lease) and thief.took_over is not None
    with pytest.raises(LeaseLostError):
        victim.finish(Status.SUCCESS)
    now = read_status(f"{gs_prefix}/gcs/victim_abc")
    assert now.status is Status.RUNNING and now.run_id == "thief"  # the robbed holder wrote nothing
    thief.finish(Status.SUCCESS)
    assert read_status(f"{gs_prefix}/gcs/victim_abc").status is Status.SUCCESS


def test_the_llm_pipeline_runs_on_gs_and_the_checkpoint_sensor_lists_checkpoints_there(gs_prefix):
    from tests.support.automation_pipeline import CHECKPOINTS, pipeline

    outcomes = {step.name: materialize_step(step, prefix=gs_prefix, settings=FAST)
                for step in walk([pipeline["export"], pipeline["evaluate"]])}
    outcome = outcomes[pipeline["train"].name]
    result = outcome.record.result
    assert result["checkpoint_steps"] == CHECKPOINTS and result["checkpoint_dir"].startswith(gs_prefix)
    assert result["final_train_loss"] < result["loss_curve"][0][1]
    fs = fsspec.filesystem("gs")
    assert fs.exists(f"{result['hf_dir']}/config.json")  # the Hugging Face export, on GCS
    assert fs.exists(f"{outcome.output_path}/metrics.jsonl")

    from marin_assets.pipeline.train import list_checkpoints, run_dir_of

    assert list_checkpoints(run_dir_of(outcome.output_path)) == {s: False for s in CHECKPOINTS}
    assert list_checkpoints(run_dir_of(outcome.output_path), known=set(CHECKPOINTS)) == {}

    exported = outcomes[pipeline["export"].name].record.result
    assert exported["path"].startswith(gs_prefix) and fs.exists(f"{exported['path']}/config.json")
    evaluated = outcomes[pipeline["evaluate"].name]
    assert evaluated.record.result["per_dataset"]["stories"]["loss"] > 0
    assert fs.exists(f"{evaluated.output_path}/results.json")
