"""Two Ray nodes on one machine (a head and a worker, each started with `ray start`), losing the worker.

The head has 1 CPU, the worker 2 CPUs and a `worker-node` resource. A tokenize step fans its files out
across both nodes; the worker node is killed mid-step; the step then finishes on the head alone (the
claims held on the dead node are taken over at once, not after the stale timeout) and its cache is
identical to one made without Ray. A request the surviving node cannot satisfy fails at once, naming
the request and what the nodes offer. Steps are materialized by a separate driver process
(`support/two_node_driver.py`), through `materialize_step` and `ray_runner` as the Dagster asset does.
"""

import contextlib
import json
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import numpy as np
import psutil
import pytest

from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from marin_assets.pipeline.tokens.tokenize import tokenize
from tests.support.helpers import BIN, ROOT, corpus_and_tokenizer, subprocess_env
from tests.support.servers import free_port
from tests.support.two_node_gate import GATE_ENV, MARKER
from tests.test_ray_cluster import kill_ray_processes_under
from tests.test_tokenize import read_tokens

DRIVER = ROOT / "tests" / "support" / "two_node_driver.py"


class Cluster:
    """A head (1 CPU) and, while `worker_dir` has processes, a worker node (`worker_cpus` CPUs, `worker-node: 1`),
    each started with `ray start`. A test asks for the nodes it needs (`two_nodes`, `head_only`), so none relies on
    what an earlier test did to the worker."""

    def __init__(self, port: int, tag: str, worker_cpus: int = 2):
        self.address, self.tag, self.worker_cpus = f"127.0.0.1:{port}", tag, worker_cpus
        self.head_dir = f"/tmp/mrh-{tag}"  # short: Ray's socket paths have a length limit
        self.worker_dirs: list[str] = []
        self.worker_reported_dead = False
        """Whether Ray has reported the last worker node dead (a step's feasibility check no longer sees it)."""

    @property
    def worker_dir(self) -> str:
        return self.worker_dirs[-1]

    def start_worker(self) -> None:
        """A fresh worker node, in a fresh temp dir (the dead one's sockets stay behind in its own)."""
        self.worker_dirs.append(f"/tmp/mrw-{self.tag}-{len(self.worker_dirs)}")
        ray_start(f"--address={self.address}", f"--num-cpus={self.worker_cpus}", '--resources={"worker-node": 1}',
                  temp_dir=self.worker_dir)
        self.worker_reported_dead = False

    def wait_for_worker_node(self, want: str) -> None:
        """Until Ray's alive nodes do (`present`) or do not (`absent`) include the worker node."""
        env = subprocess_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        seen = subprocess.run([BIN / "python", ROOT / "tests" / "support" / "ray_nodes.py", self.address, "worker-node",
                               want, "120"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        assert seen.returncode == 0, f"the worker node is not {want} in Ray: {seen.stdout}{seen.stderr[-3000:]}"


HEALTH_CHECKS = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
                 "RAY_health_check_failure_threshold": "3"}
"""The head's checks of its nodes (Ray's system config, read from the environment when the head starts): a
killed node is reported dead ~3 s after it dies instead of ~15 s (Ray's defaults: every 3 s, 5 failures). The
tests wait for that report, and what they assert does not depend on when it comes."""


def ray_start(*args: str, temp_dir: str, **env_extra: str) -> None:
    env = subprocess_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", **env_extra)
    subprocess.run([BIN / "ray", "start", *args, "--node-ip-address=127.0.0.1", "--object-store-memory=100000000",
                    f"--temp-dir={temp_dir}"], env=env, check=True, capture_output=True, timeout=120)


def processes_under(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if any(marker in a for a in p.info["cmdline"] or [])]


@pytest.fixture(scope="module")
def cluster():
    """The module's Ray cluster: its head, and a worker node to begin with."""
    with running_cluster() as nodes:
        yield nodes
    assert not any(processes_under(folder) for folder in [*nodes.worker_dirs, nodes.head_dir])  # no Ray is left


@contextlib.contextmanager
def running_cluster(worker_cpus: int = 2) -> Iterator[Cluster]:
    """A head (1 CPU) and a worker node (`worker_cpus`), each started with `ray start`; every node's processes
    killed and folders removed afterwards."""
    nodes = Cluster(free_port(), uuid.uuid4().hex[:6], worker_cpus=worker_cpus)
    try:
        ray_start("--head", f"--port={nodes.address.rsplit(':', 1)[1]}", "--num-cpus=1", "--include-dashboard=false",
                  temp_dir=nodes.head_dir, **HEALTH_CHECKS)
        nodes.start_worker()
        yield nodes
    finally:
        dirs = [*nodes.worker_dirs, nodes.head_dir]
        for folder in dirs:
            kill_ray_processes_under(folder)
        deadline = time.time() + 20
        while any(processes_under(folder) for folder in dirs) and time.time() < deadline:
            time.sleep(0.2)
        for folder in dirs:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def two_nodes(cluster) -> Cluster:
    """The head and a live worker node (started again if an earlier test killed it)."""
    if cluster.worker_reported_dead or not processes_under(cluster.worker_dir):
        kill_ray_processes_under(cluster.worker_dir)  # whatever is left of a killed one
        cluster.start_worker()
        cluster.wait_for_worker_node("present")
    return cluster


@pytest.fixture
def head_only(cluster) -> Cluster:
    """The head alone: the worker node killed (if a test before did not) and reported dead by Ray."""
    if processes_under(cluster.worker_dir):
        kill_ray_processes_under(cluster.worker_dir)
        cluster.worker_reported_dead = False
    if not cluster.worker_reported_dead:
        cluster.wait_for_worker_node("absent")
        cluster.worker_reported_dead = True
    return cluster


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-nodes")
    raw, tok = corpus_and_tokenizer(root, train_documents=16000, validation_documents=200, seed=7, shards=8)
    return root, raw, tok


def driver(address, prefix, raw, tok, workers: int, cpu: float = 1, lease: str | None = None,
           gate: bool = False) -> subprocess.Popen:
    """`lease`: the step lease's `heartbeat,stale` seconds (default: LeaseSettings()). `gate`: the head's process
    begins its first file only once a task on the worker node has begun one (`support/two_node_gate.py`)."""
    env = subprocess_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                         **({GATE_ENV: f"{prefix}-gate"} if gate else {}))
    return subprocess.Popen([BIN / "python", DRIVER, address, prefix, raw, tok, str(workers), str(cpu),
                             *([lease] if lease else [])], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def claimed_on(node_dir: str, prefix) -> bool:
    """Whether a process of the node started under `node_dir` holds the claim of a file of the fan-out."""
    pids = set(processes_under(node_dir))
    for claim in prefix.glob("tokenized/*/.parts/train/*.claim"):
        status = read_status(str(claim))
        if status is not None and status.status is Status.RUNNING:
            with contextlib.suppress(psutil.NoSuchProcess):
                holder = psutil.Process(int(status.holder.split(":")[1]))
                if {holder.pid, *(p.pid for p in holder.parents())} & pids:  # a Ray worker of that node's raylet
                    return True
    return False


def finish(proc: subprocess.Popen) -> tuple[dict, str]:
    out, _ = proc.communicate(timeout=240)  # a bound against a hang, never a timing assertion
    lines = [line for line in out.splitlines() if line.startswith('{"ok"')]
    assert lines, out[-4000:]
    return json.loads(lines[-1]), out


def test_files_spread_over_both_nodes_then_losing_one_mid_step_still_finishes_identically(two_nodes, inputs):
    address, worker_dir = two_nodes.address, two_nodes.worker_dir
    root, raw, tok = inputs
    reference = tokenize(str(root / "reference"), raw, tok)  # no Ray, one process
    expected = read_tokens(str(root / "reference" / "train"), tok)

    both, out = finish(driver(address, str(root / "both"), raw, tok, workers=3, gate=True))
    assert both["ok"], out[-4000:]
    assert "by Ray tasks" in out and ", 0 by Ray tasks" not in out  # tasks did some files, not the step alone
    assert (root / "both-gate" / MARKER).exists()  # the gate was installed and opened by a worker-node task
    assert both["result"]["splits"]["train"]["tokens"] == reference.splits["train"].tokens

    proc = driver(address, str(root / "lost"), raw, tok, workers=3, gate=True)
    deadline = time.time() + 180
    while not claimed_on(worker_dir, root / "lost") and time.time() < deadline:
        time.sleep(0.1)
    assert claimed_on(worker_dir, root / "lost")  # a task on the worker node is tokenizing a file
    kill_ray_processes_under(worker_dir)  # the worker node dies: raylet, its workers, their tasks
    lost, out = finish(proc)
    assert lost["ok"], out[-4000:]  # finished on the head alone
    takeovers = [line for line in out.splitlines() if "tokenize 8 files: taking over" in line]
    # the dead node's claims are taken over once Ray reports the node dead, not after 90 s of silence
    assert takeovers and all("is dead" in line for line in takeovers), out[-4000:]
    two_nodes.worker_reported_dead = True  # the step was told so: a later test needing the head alone waits no more
    print("\n".join(takeovers))
    (cache,) = (root / "lost" / "tokenized").glob("two-node_*")
    assert all(np.array_equal(a, b) for a, b in zip(expected, read_tokens(str(cache / "train"), tok), strict=True))
    print(f"tokens/s: two nodes {both['result']['tokens_per_second']}, losing one mid-step"
          f" {lost['result']['tokens_per_second']}")


def test_with_the_worker_gone_the_step_holding_the_only_cpu_does_its_fan_out_itself(head_only, inputs):
    """The hang of issue 18: the step holds the head's only CPU, its tasks could only run on the dead node."""
    address = head_only.address
    root, raw, tok = inputs
    alone, out = finish(driver(address, str(root / "alone"), raw, tok, workers=3))
    assert alone["ok"], out[-4000:]
    assert ", 0 by Ray tasks, 8 in this process" in out, out[-4000:]
    print(f"tokens/s: one node {alone['result']['tokens_per_second']}")


def test_after_the_loss_a_request_no_surviving_node_offers_fails_at_once_naming_it(head_only, inputs):
    address = head_only.address
    root, raw, tok = inputs
    failed, out = finish(driver(address, str(root / "too-big"), raw, tok, workers=3, cpu=2))
    assert not failed["ok"]
    assert "InfeasibleRequestError" in failed["error"] and "tokenized/two-node" in failed["error"]
    assert "needs {CPU=2}" in failed["error"] and "Nodes offer: {CPU=1" in failed["error"], failed["error"]
    assert "worker-node" not in failed["error"]  # the dead node is not offered


def test_killing_the_materializing_process_stops_its_ray_task(head_only, inputs):
    """The heartbeat stays honest: when the driver dies its lease goes silent, and Ray stops the work too."""
    address = head_only.address
    root, raw, tok = inputs
    proc = driver(address, str(root / "orphan"), raw, tok, workers=3)
    deadline = time.time() + 120
    while not (holders := running_holders(root / "orphan")) and time.time() < deadline:
        time.sleep(0.1)
    assert holders, proc.stdout.read()[-3000:] if proc.poll() is not None else "no claim within 120 s"
    proc.kill()  # the materializing process dies without a word
    proc.wait(30)
    deadline = time.time() + 60
    while any(psutil.pid_exists(pid) for pid in holders) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(psutil.pid_exists(pid) for pid in holders)  # the step's Ray task no longer writes


def test_with_short_leases_no_lease_goes_stale_while_its_work_still_writes(head_only, inputs):
    """1 s heartbeats, a 20 s stale timeout (the default's is 90 s). The driver killed, its step lease goes
    silent; the step's Ray task and its file tasks must stop before that silence lets anyone take the lease
    over. The next materialization does take it over, as stale, and finishes. (How soon Ray stops the work
    is a figure for bench/, not a bound here: 20 s is far past it even on a loaded machine.)"""
    address = head_only.address
    root, raw, tok = inputs
    prefix, stale = root / "short", 20.0
    proc = driver(address, str(prefix), raw, tok, workers=3, lease=f"1,{stale}")
    deadline = time.time() + 120
    while not (holders := running_holders(prefix)) and time.time() < deadline:
        time.sleep(0.1)
    assert holders, proc.stdout.read()[-3000:] if proc.poll() is not None else "no claim within 120 s"
    [step_out] = prefix.glob("tokenized/two-node_*")
    workers = holders | set(processes_under("ray::tokenized.two-node"))  # file tasks and the step's own task
    proc.kill()
    proc.wait(30)
    last_beat = read_status(str(step_out)).heartbeat  # the driver's last: nobody renews it now
    while any(psutil.pid_exists(pid) for pid in workers) and time.time() < last_beat + 60:
        time.sleep(0.05)
    stopped_after = time.time() - last_beat
    print(f"\nwork stopped {stopped_after:.2f} s after the lease's last heartbeat (stale after {stale} s)")
    assert stopped_after < stale, f"the work went on {stopped_after:.1f} s after the lease's last heartbeat"
    assert read_status(str(step_out)).status is Status.RUNNING  # nothing was marked done

    again, out = finish(driver(address, str(prefix), raw, tok, workers=3, lease=f"1,{stale}"))
    assert again["ok"], out[-3000:]
    assert re.search(r"taking over .* \(stale RUNNING", out), out[-3000:]


def running_holders(prefix) -> set[int]:
    found = set()
    for claim in prefix.glob("tokenized/*/.parts/train/*.claim"):
        status = read_status(str(claim))
        if status is not None and status.status is Status.RUNNING:
            found.add(int(status.holder.split(":")[1]))
    return found
