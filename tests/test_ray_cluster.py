"""A separately started Ray head (`ray start --head` on loopback), reached by address.

The head imitates a TPU host on CPU: it advertises `TPU: 8`, a slice name resource and the
`TPU-v4-16-head` / `TPU-v4-8-head` resources, and its workers see `TPU_NAME`, as Ray's TPU
nodes do. Materializations go through the real `dagster asset materialize` CLI.
"""

import json
import os
import signal
import socket
import subprocess
import textwrap
import uuid

import fsspec
import psutil
import pytest

from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from tests.support.helpers import BIN, ROOT, run_cli, subprocess_env, wait_for
from tests.support.servers import free_port

DEFS = textwrap.dedent(
    """
    import os
    from marin_assets import Resources, Step, build_definitions
    from resources import RayResource
    from tests.support.cluster_steps import on_each_host, sleepy, where, write_here
    from tests.support.gcs_emulator import emulator_env

    steps = [
        Step(name="cluster/where", fn=where),
        Step(name="cluster/sleepy", fn=sleepy),
        Step(name="cluster/tpu-host", fn=on_each_host, resources=Resources(tpu_type="v4-8")),
        Step(name="cluster/tpu-slice", fn=on_each_host, resources=Resources(tpu_type="v4-16")),
        Step(name="cluster/write-here", fn=write_here),
    ]
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")  # the workers reach the test's GCS emulator
    env_vars = {"PID_DIR": os.environ["PID_DIR"], **(emulator_env(emulator) if emulator else {})}
    ray = RayResource(address=os.environ["TEST_RAY_ADDRESS"], env_vars=env_vars)
    defs = build_definitions(steps, resources={"ray": ray})
    """
)



def kill_ray_processes_under(marker: str) -> None:
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid != os.getpid() and any(marker in arg for arg in proc.info["cmdline"] or []):
            proc.kill()


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    port = free_port()
    temp_dir = f"/tmp/mrt-{uuid.uuid4().hex[:8]}"  # short: Ray's socket paths have a length limit
    resources = {"TPU": 8, "test-slice": 2, "TPU-v4-16-head": 1, "TPU-v4-8-head": 1, "accelerator_type:TPU-V4": 1}
    env = subprocess_env(TPU_NAME="test-slice", MARIN_TEST_HEAD="yes", RAY_AUTH_MODE="disabled",
                         RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.Popen(
        [BIN / "ray", "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp_dir}", f"--resources={json.dumps(resources)}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    def registered() -> bool:
        """The head's raylet has registered with the GCS, with its resources (what a job needs to be placed)."""
        assert head.poll() is None, f"ray start exited {head.returncode}: {head.stdout.read().decode()[-3000:]}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return False
        status = subprocess.run([BIN / "ray", "status", f"--address=127.0.0.1:{port}"], env=env,
                                capture_output=True, text=True, timeout=120)
        return status.returncode == 0 and "test-slice" in status.stdout

    try:
        wait_for(registered, "the Ray head's node registered with its resources", timeout=300, interval=0.5)
    except BaseException:
        head.kill()
        raise
    yield f"127.0.0.1:{port}"
    head.terminate()
    kill_ray_processes_under(temp_dir)
    head.wait(10)


@pytest.fixture
def project(tmp_path, prefix, dagster_home, ray_head):
    (tmp_path / "defs.py").write_text(DEFS)
    env = subprocess_env(TEST_RAY_ADDRESS=ray_head, PID_DIR=str(tmp_path))
    env.pop("MARIN_TEST_HEAD", None)
    return tmp_path, env


def materialize(project, key, check=True):
    path, env = project
    return run_cli(BIN / "dagster", "asset", "materialize", "-f", path / "defs.py", "--select", key, env=env,
                   check=check)


def result_of(prefix, key):
    (name,) = [n for n in os.listdir(os.path.join(prefix, "cluster")) if n.startswith(key + "_")]
    with open(os.path.join(prefix, "cluster", name, ".artifact.json")) as f:
        return json.load(f)["result"], os.path.join(prefix, "cluster", name)


def test_a_step_runs_on_the_cluster_reached_by_address(project, prefix):
    materialize(project, "cluster/where")
    result, out = result_of(prefix, "where")
    assert result["head"] == "yes"  # only the head's workers have this variable
    assert read_status(out).status is Status.SUCCESS


def test_tpu_host_and_multi_host_slice_are_scheduled_with_ray_tpu_resources(project, prefix):
    materialize(project, "cluster/tpu-host")
    result, _ = result_of(prefix, "tpu-host")
    assert result["hosts_seen"] == 1 and result["tpu_ids"]  # Ray assigned TPU chips to the task

    materialize(project, "cluster/tpu-slice")
    result, out = result_of(prefix, "tpu-slice")
    host_files = sorted(n for n in os.listdir(out) if n.startswith("host-"))
    assert len(host_files) == 2  # one task per host of the 2-host v4-16 slice
    assert result["pod"] == "test-slice"


def test_interrupting_the_run_cancels_the_ray_task_and_never_marks_success(project, prefix):
    path, env = project
    proc = subprocess.Popen([BIN / "dagster", "asset", "materialize", "-f", path / "defs.py", "--select",
                             "cluster/sleepy"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    pid_file = path / "sleepy.pid"
    wait_for(lambda: pid_file.exists() or proc.poll() is not None, "the sleepy step's worker to start", timeout=300)
    assert pid_file.exists(), proc.communicate(timeout=30)[0][-3000:]
    worker = int(pid_file.read_text())
    assert psutil.pid_exists(worker)

    proc.send_signal(signal.SIGINT)  # Ctrl-C on the CLI
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "cancelled its Ray task" in out

    def gone() -> bool:
        try:
            return psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, "the cancelled step's Ray worker to end", timeout=120)
    (name,) = os.listdir(os.path.join(prefix, "cluster"))
    status = read_status(os.path.join(prefix, "cluster", name))
    assert status.status is Status.FAILED  # never SUCCESS; the lease is released
    assert not (path / "sleepy.done").exists()


def test_a_step_on_the_cluster_writes_to_gs_with_the_lease_on_gs(project, gs_prefix):
    path, env = project
    env = dict(env, MARIN_PREFIX=gs_prefix)
    run_cli(BIN / "dagster", "asset", "materialize", "-f", path / "defs.py", "--select", "cluster/write-here", env=env)
    from marin_assets.core.record import read_record

    [out] = [f"gs://{p}" for p in fsspec.filesystem("gs").ls(f"{gs_prefix}/cluster", refresh=True)]
    assert read_status(out).status is Status.SUCCESS  # status and record on GCS, by the Dagster process
    record = read_record(out)
    assert record.result["head"] == "yes"  # the function ran on the head's worker
    written = fsspec.filesystem("gs").cat_file(f"{out}/written-by.txt").decode()
    assert written == f"yes:{record.result['pid']}"  # and wrote its output to GCS from there
