"""The checkpoint sensor on a real (tiny) Levanter training run, ticked against a real instance
while training writes its checkpoints; then the whole loop under the Dagster daemon."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import fsspec
import pytest

from marin_assets import cli, materialize_step
from marin_assets.core.status import Status
from marin_assets.core.step import walk
from marin_assets.core.stores import read_status
from marin_assets.dagster.checkpoint_evals import CHECKPOINT_TAG, partitions_of
from marin_assets.dagster.instance import write_instance_yaml
from marin_assets.pipeline.training.checkpoints import list_checkpoints, run_dir_of
from resources import StorageResource
from tests.support import automation_pipeline as auto
from tests.support.daemon_instance import daemon_settings, wait_for_ticks
from tests.support.helpers import BIN, ROOT, subprocess_env


@pytest.fixture
def data_ready(prefix):
    """Corpus, tokenizer and cache of the tiny pipeline, materialized (in this process)."""
    for step in walk([auto.pipeline["tokenized"]]):
        materialize_step(step, prefix=prefix)
    return prefix


def start_training(prefix: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "step_worker.py"), auto.train.name],
                            env=subprocess_env(MARIN_PREFIX=prefix), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


class Ticker:
    def __init__(self, prefix: str):
        self.storage = StorageResource(prefix=prefix)
        self.instance = dg.DagsterInstance.get()
        self.cursor: str | None = None

    def tick(self) -> dg.SensorResult:
        with dg.build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=auto.defs,
                                     resources={"storage": self.storage}) as context:
            result = auto.sensor(context)
        self.cursor = result.cursor
        return result


def test_one_evaluation_per_complete_checkpoint_while_training_runs(data_ready, dagster_home):
    prefix = data_ready
    train_out = auto.train.output_path_under(prefix)
    ticker = Ticker(prefix)
    requested: list[tuple[str, Status | None]] = []  # (partition, training status when requested)
    proc = start_training(prefix)
    try:
        while proc.poll() is None:
            result = ticker.tick()
            status = read_status(train_out)
            for request in result.run_requests:
                requested.append((request.partition_key, status and status.status))
                assert request.tags[CHECKPOINT_TAG] == request.partition_key
                assert [k.to_user_string() for k in request.asset_selection] == [auto.evals.name]
            added = [k for r in result.dynamic_partitions_requests for k in r.partition_keys]
            assert added == [r.partition_key for r in result.run_requests]
            time.sleep(0.2)
    finally:
        proc.kill()
    assert proc.wait() == 0
    requested += [(r.partition_key, Status.SUCCESS) for r in ticker.tick().run_requests]

    assert sorted(int(k) for k, _ in requested) == auto.CHECKPOINTS  # each complete checkpoint once
    assert (str(auto.CHECKPOINTS[0]), Status.RUNNING) in requested  # the first one before training ended

    # A checkpoint still being written (no metadata.json yet) and a temporary one are not evaluated.
    run_dir = Path(run_dir_of(train_out))
    (run_dir / "step-20" / "params").mkdir(parents=True)
    (run_dir / "step-21").mkdir()
    (run_dir / "step-21" / "metadata.json").write_text(json.dumps({"step": 21, "is_temporary": True}))
    for _ in range(2):
        result = ticker.tick()
        assert list(result.run_requests) == [] and result.skip_reason
    # Once complete it is evaluated, and only then.
    (run_dir / "step-20" / "metadata.json").write_text(json.dumps({"step": 20, "is_temporary": False}))
    assert [r.partition_key for r in ticker.tick().run_requests] == ["20"]
    assert list(ticker.tick().run_requests) == []


def test_checkpoint_listing_through_fsspec_reads_one_listing_and_new_metadata_only():
    fs = fsspec.filesystem("memory")
    root = "memory://bucket/run/checkpoints/run"
    fs.pipe({f"{root}/step-5/metadata.json": b'{"step": 5, "is_temporary": false}',
             f"{root}/step-5/params/0.0": b"x" * 10,
             f"{root}/step-7/metadata.json": b'{"step": 7, "is_temporary": true}',
             f"{root}/step-9/params/0.0": b"partial",
             f"{root}/step-11/metadata.json": b"",  # Levanter is writing it (seen on CI: not atomic)
             f"{root}/step-13/metadata.json": b'{"step": 13, "is_tem',
             f"{root}/not-a-step/metadata.json": b"{}"})
    assert list_checkpoints(root) == {5: False, 7: True}
    assert list_checkpoints(root, known={5, 7}) == {}
    assert list_checkpoints("memory://bucket/none") == {}
    assert run_dir_of("gs://b/x/checkpoints/tiny_abc") == "gs://b/x/checkpoints/tiny_abc/checkpoints/tiny_abc"


def runs_of_sensor(instance: dg.DagsterInstance) -> list:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={"dagster/sensor_name": auto.sensor.name})))


def wait_for(condition, timeout: float, what: str, interval: float = 0.25):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_under_the_daemon_every_checkpoint_is_evaluated_once_across_a_restart(data_ready, tmp_path, monkeypatch):
    prefix = data_ready
    home = tmp_path / "daemon_home"
    home.mkdir()
    write_instance_yaml(home / "dagster.yaml", daemon_settings())  # the project's settings, dequeued every 1 s
    workspace = tmp_path / "workspace.yaml"
    module = ROOT / "tests" / "support" / "automation_pipeline.py"
    workspace.write_text(f"load_from:\n  - python_file:\n      relative_path: {module}\n"
                         f"      working_directory: {ROOT}\n      attribute: defs\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    env = subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=prefix)
    logs = tmp_path / "logs"
    logs.mkdir()

    def start_daemon(n: int) -> subprocess.Popen:
        log = open(logs / f"daemon{n}.log", "w")
        return subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    instance = dg.DagsterInstance.get()
    daemon = start_daemon(1)
    training = subprocess.Popen(
        [str(BIN / "dagster"), "asset", "materialize", "-f", str(ROOT / "tests" / "support" / "automation_pipeline.py"),
         "--select", auto.train.name], cwd=ROOT, env=env, stdout=open(logs / "train.log", "w"),
        stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: runs_of_sensor(instance), 300, "the sensor's first evaluation run")
        stop(daemon)  # the daemon goes down while training still writes checkpoints
        assert training.wait(300) == 0, (logs / "train.log").read_text()[-3000:]
        daemon = start_daemon(2)

        def all_evaluated():  # a run lost in the restart is retried (by Dagster, or asked again by the sensor)
            runs = runs_of_sensor(instance)
            done = [r for r in runs if r.status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)]
            succeeded = {r.tags["dagster/partition"] for r in runs if r.status == dg.DagsterRunStatus.SUCCESS}
            return runs if len(succeeded) >= len(auto.CHECKPOINTS) and len(done) == len(runs) else None

        runs = wait_for(all_evaluated, 420, "every checkpoint's evaluation to finish")
        wait_for_ticks(instance, auto.sensor.name)  # a few more ticks: nothing new
        runs = runs_of_sensor(instance)
    finally:
        stop(daemon)
        training.kill()
    succeeded = sorted(int(r.tags["dagster/partition"]) for r in runs if r.status == dg.DagsterRunStatus.SUCCESS)
    # none lost across the restart, none twice
    assert succeeded == auto.CHECKPOINTS, [(r.tags["dagster/partition"], r.status) for r in runs]
    assert sorted(instance.get_dynamic_partitions(partitions_of(auto.evals).name), key=int) == [
        str(s) for s in auto.CHECKPOINTS]

    # The cursor the daemon persisted holds every checkpoint seen; the restarted daemon's ticks
    # found nothing new. (A daemon stopped in the middle of a tick may lose that tick's cursor;
    # then Dagster drops the repeated requests by their run keys, which the count above shows.)
    [state] = [s for s in instance.all_instigator_state() if s.name == auto.sensor.name]
    assert json.loads(state.instigator_data.cursor) == {partitions_of(auto.evals).name: auto.CHECKPOINTS}
    assert "no new complete checkpoints" in (logs / "daemon2.log").read_text()

    events = instance.fetch_materializations(dg.AssetKey(auto.evals.name.split("/")), limit=10).records
    by_step = {int(e.partition_key): e.asset_materialization.metadata for e in events}
    assert sorted(by_step) == auto.CHECKPOINTS
    assert all(m["checkpoint_step"].value == s for s, m in by_step.items())
    assert by_step[11]["loss"].value < by_step[5]["loss"].value  # later checkpoints of a learning model do better
    last = max(events, key=lambda e: e.timestamp).asset_materialization.metadata["all_checkpoints"]
    assert len(last.records) >= 2 and {r.data["step"] for r in last.records} <= set(auto.CHECKPOINTS)


def test_a_tick_names_what_is_wrong_before_running_anything(monkeypatch, tmp_path):
    """`marin-assets tick` (make demo's one tick): a sensor the definitions lack, or no instance to record in."""
    definitions = str(ROOT / "tests" / "support" / "automation_pipeline.py")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match=r"no sensor 'nope' in the definitions \(they have: .*marin_checkpoint_evals"):
        cli.main(["tick", "nope", "-f", definitions])
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.chdir(tmp_path)  # no ./.env to find an instance in either
    with pytest.raises(SystemExit, match="DAGSTER_HOME is not set"):
        cli.main(["tick", auto.sensor.name, "-f", definitions])
