"""gs:// storage against a local GCS emulator (fake-gcs-server): the same definitions with a
`gs://` prefix, and the exactly-once lease kept by GCS generation preconditions."""

import subprocess

import fsspec

from marin_assets import materialize_step, read_record
from marin_assets.core.status import Status
from marin_assets.core.step import walk
from marin_assets.core.stores import GCSStatusStore, read_status
from tests.support.gcs_emulator import emulator_env
from tests.support.helpers import BIN, FAST, ROOT, subprocess_env
from tests.support.lease_contract import (
    racing_processes_compute_once,
    simultaneous_creates_have_one_winner,
    stale_lease_is_taken_over,
    stale_writer_refused_and_robbed_holder_cannot_succeed,
)


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
    from marin_assets.pipeline.tokens.tokenize import CACHE_NOT_EMPTY

    assert CACHE_NOT_EMPTY.fn(cache["path"], cache).passed
    again = materialize_step(pipeline["tokenized"], prefix=gs_prefix, settings=FAST)
    assert again.cached


def test_racing_processes_on_gs_compute_once(gs_prefix, tmp_path, gcs):
    racing_processes_compute_once(gs_prefix, tmp_path / "events", subprocess_env(**emulator_env(gcs)))


def test_writers_released_together_on_gs_create_one_status(gs_prefix):
    simultaneous_creates_have_one_winner(gs_prefix, GCSStatusStore)


def test_a_stale_lease_on_gs_is_taken_over(gs_prefix):
    stale_lease_is_taken_over(gs_prefix, GCSStatusStore)


def test_generation_preconditions_refuse_a_stale_writer_and_a_robbed_holder_cannot_succeed(gs_prefix):
    stale_writer_refused_and_robbed_holder_cannot_succeed(gs_prefix, GCSStatusStore)


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

    from marin_assets.pipeline.training.checkpoints import list_checkpoints, run_dir_of

    assert list_checkpoints(run_dir_of(outcome.output_path)) == {s: False for s in CHECKPOINTS}
    assert list_checkpoints(run_dir_of(outcome.output_path), known=set(CHECKPOINTS)) == {}

    exported = outcomes[pipeline["export"].name].record.result
    assert exported["path"].startswith(gs_prefix) and fs.exists(f"{exported['path']}/config.json")
    evaluated = outcomes[pipeline["evaluate"].name]
    assert evaluated.record.result["per_dataset"]["stories"]["loss"] > 0
    assert fs.exists(f"{evaluated.output_path}/results.json")
