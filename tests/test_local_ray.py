"""A local Ray that outlives one run (`marin-assets ray start|stop|status`): runs join it while it lives, and
fall back to an embedded Ray, saying why, once it is stopped or its address file is stale."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from marin_assets.execution import local_ray
from resources import RayResource

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

WHERE = '''
import os


def where(output_path):
    """Where the step ran: Ray's node and the worker's process."""
    import ray

    os.makedirs(output_path, exist_ok=True)
    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
'''

DEFINITIONS = '''
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from where import where

from marin_assets import Step, build_definitions
from resources import RayResource

defs = build_definitions([Step(name="local/where", fn=where)],
                         resources={"ray": RayResource(runtime_env={"env_vars": {"PYTHONPATH": os.path.dirname(
                             os.path.abspath(__file__))}})})
'''


@pytest.fixture
def project(tmp_path):
    """A definitions file with one unmarked step (a Ray task) that reports where it ran, and a Dagster home."""
    (tmp_path / "where.py").write_text(WHERE)
    (tmp_path / "defs.py").write_text(textwrap.dedent(DEFINITIONS))
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = dict(os.environ, DAGSTER_HOME=str(home), RAY_AUTH_MODE="disabled", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT))
    yield tmp_path, env
    subprocess.run([str(BIN / "marin-assets"), "ray", "stop"], env=env, cwd=tmp_path, capture_output=True)


def ray_command(action, env, cwd):
    return subprocess.run([str(BIN / "marin-assets"), "ray", action], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def materialize(root, env, run):
    """`dagster asset materialize` of the step on a fresh prefix: where it ran, and the run's output."""
    prefix = root / f"outputs-{run}"
    proc = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-f", str(root / "defs.py"), "--select",
                           "local/where"], env={**env, "MARIN_PREFIX": str(prefix)}, cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(next(prefix.rglob(".artifact.json")).read_text())
    return record["result"], proc.stdout + proc.stderr


def test_runs_join_the_local_ray_until_it_stops_then_start_their_own(project):
    root, env = project
    assert ray_command("status", env, root).returncode == 1  # nothing running yet
    started = ray_command("start", env, root)
    assert started.returncode == 0, started.stderr
    info = local_ray.read(Path(env["DAGSTER_HOME"]) / local_ray.FILE_NAME)
    assert local_ray.why_stale(info) is None
    again = ray_command("start", env, root)
    assert again.stdout.startswith("already running: ") and info.address in again.stdout
    assert local_ray.read(Path(env["DAGSTER_HOME"]) / local_ray.FILE_NAME) == info
    status = ray_command("status", env, root)
    assert status.returncode == 0 and info.address in status.stdout

    first, first_log = materialize(root, env, 1)
    second, second_log = materialize(root, env, 2)
    assert first["node"] == second["node"] == info.node_id  # both runs on the one local Ray
    assert first["pid"] != second["pid"]  # each run's job has its own worker
    for log in (first_log, second_log):
        assert "joined the local Ray at" in log and "Started a local Ray instance" not in log

    stopped = ray_command("stop", env, root)
    assert stopped.returncode == 0 and "stopped the local Ray" in stopped.stdout
    assert not (Path(env["DAGSTER_HOME"]) / local_ray.FILE_NAME).exists()
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # the holder exits once its Ray is down
            os.kill(info.pid, 0)
            time.sleep(0.1)

    third, third_log = materialize(root, env, 3)
    assert third["node"] != info.node_id and "joined the local Ray" not in third_log  # an embedded Ray again
    assert ray_command("status", env, root).returncode == 1


def stale_file(home, **changes):
    """An address file in `home` for a Ray that is not there (this process, a closed port), with `changes`."""
    fields = dict(address="127.0.0.1:9", node_id="0" * 56, pid=os.getpid(),
                  process_start=local_ray._process_start(os.getpid()), boot_id=local_ray._boot_id(),
                  started_at=time.time(), num_cpus=1)
    fields.update(changes)
    path = home / local_ray.FILE_NAME
    path.write_text(json.dumps(fields))
    return path


def finished_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(("changes", "reason"), [
    ({"boot_id": "another-boot"}, "rebooted"),
    ({"pid": finished_pid()}, "is not running"),
    ({}, "is not running"),  # this process is alive but is no holder: its command line says so
])
def test_a_stale_address_file_is_named_and_ignored(tmp_path, monkeypatch, caplog, changes, reason):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    path = stale_file(tmp_path, **changes)
    found, stale = local_ray.find()
    assert found is None and reason in stale and str(path) in stale
    with caplog.at_level(logging.WARNING):
        assert RayResource().local() is None  # connect() starts an embedded Ray
    assert any(reason in r.getMessage() and "starting an embedded Ray" in r.getMessage() for r in caplog.records)
    assert "removed a stale address file" in local_ray.stop() and not path.exists()


def test_a_holder_whose_ray_does_not_answer_is_stale(tmp_path, monkeypatch):
    """A live holder (a stand-in with the holder's command line) whose GCS port is closed."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    stand_in = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", local_ray.HOLDER],
                                stdin=subprocess.PIPE)  # lives until it is signalled (or its stdin closes)
    try:
        while not local_ray._is_holder(stand_in.pid):  # until it has exec'd: its command line says holder
            time.sleep(0.01)
        stale_file(tmp_path, pid=stand_in.pid, process_start="1")  # the pid reused by another process
        found, stale = local_ray.find()
        assert found is None and "is now another process" in stale
        assert "removed a stale address file" in local_ray.stop() and stand_in.poll() is None  # not signalled
        stale_file(tmp_path, pid=stand_in.pid, process_start=local_ray._process_start(stand_in.pid))
        found, stale = local_ray.find()
        assert found is None and "does not answer" in stale
        assert "stopped the local Ray" in local_ray.stop(timeout=10)  # a live holder is told to stop all the same
        stand_in.wait(10)  # ended (already reaped by `stop`, which waits for it)
    finally:
        stand_in.kill()


def test_a_sized_or_cluster_resource_never_joins_the_local_ray(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setattr(local_ray, "find", lambda home=None: pytest.fail("looked for a local Ray"))
    for resource in (RayResource(num_cpus=1), RayResource(custom_resources={"TPU": 4}),
                     RayResource(address="auto"), RayResource(use_local_ray=False)):
        assert resource.local() is None
