"""A training step spanning two hosts: two Ray nodes on one machine (a head and a worker, each started with
`ray start`, one CPU each), one JAX process on each, joined by the runner into one JAX program (CPU collectives
over gloo). Its loss curve is the one-process run's with the same global batch; its checkpoints load in a
one-process evaluation; a host lost mid-run fails the step at once, and the retry resumes from the last
checkpoint to the uninterrupted run's final loss. The reference log-probs, DPO and a loss evaluation on two hosts
compute what one process computes. Steps are materialized by separate driver processes
(`support/multihost_driver.py`, `support/multihost_methods_driver.py`), through `materialize_step` and `ray_runner`
as the Dagster asset does.
"""

import json
import os
import re
import subprocess
import time

import pytest

from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from marin_assets.pipeline.training.checkpoints import checkpoint_steps
from tests.support.helpers import BIN, ROOT, corpus_and_tokenizer, subprocess_env
from tests.support.multihost_pause import MARKER, PAUSE_ENV
from tests.test_ray_cluster import kill_ray_processes_under
from tests.test_ray_two_nodes import running_cluster

DRIVER = ROOT / "tests" / "support" / "multihost_driver.py"
METHODS_DRIVER = ROOT / "tests" / "support" / "multihost_methods_driver.py"
LOSS_TOLERANCE = 1e-5
"""Two hosts against one process, per step: measured at most 9.5e-7 (float32 sums in another order: each host
reduces its half of the batch, then the hosts add the halves)."""
DPO_TOLERANCE = 1e-4
"""Two hosts against one process on the DPO path: summed log-probs of up to 256 tokens (values in the hundreds,
float32 spacing about 3e-5) and the losses built on them. Measured: at most 3.1e-5 on the reference's summed
log-probs, 4.2e-7 on the DPO losses, the evaluation's loss equal."""


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node, one CPU each: a two-host step takes one from each (its placement group)."""
    with running_cluster(worker_cpus=1) as nodes:
        nodes.wait_for_worker_node("present")
        yield nodes


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    raw, tok = corpus_and_tokenizer(root, train_documents=300, validation_documents=30, seed=1, shards=1)
    return root, raw, tok


def driver(address: str, prefix, raw, tok, hosts: int, evaluate: bool = False, pause: str | None = None,
           layout: str | None = None, **env_extra: str) -> subprocess.Popen:
    """`address`: a Ray cluster, or `here` (no Ray: one process). `pause`: `step:folder` (`support/multihost_pause`);
    `layout`: `replica,model` (a `DeviceLayout`)."""
    env = subprocess_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", **({PAUSE_ENV: pause} if pause else {}),
                         **env_extra)
    return subprocess.Popen([BIN / "python", DRIVER, address, str(prefix), raw, tok, str(hosts),
                             *(["eval"] if evaluate else []), *([f"layout={layout}"] if layout else [])],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 480) -> tuple[dict, str]:
    out, _ = proc.communicate(timeout=timeout)  # a bound against a hang, never a timing assertion
    lines = [line for line in out.splitlines() if line.startswith('{"ok"')]
    assert lines, out[-4000:]
    return json.loads(lines[-1]), out


@pytest.fixture(scope="module")
def one_process(data):
    root, raw, tok = data
    done, out = finish(driver("here", root / "one", raw, tok, hosts=1, evaluate=True))
    assert done["ok"], out[-4000:]
    return done


@pytest.fixture(scope="module")
def two_hosts(cluster, data):
    root, raw, tok = data
    done, out = finish(driver(cluster.address, root / "two", raw, tok, hosts=2, evaluate=True))
    assert done["ok"], out[-4000:]
    return done, out


def test_two_hosts_train_as_one_jax_program_with_the_one_process_loss_curve(one_process, two_hosts):
    two, out = two_hosts
    assert (one_process["devices"], two["devices"]) == (1, 2)  # the record counts both hosts' devices
    assert (one_process["hosts"], two["hosts"]) == (1, 2) and two["device_mesh"] == {"data": 2}
    assert one_process["hash"] == two["hash"]  # hosts are how, not what: one identity
    for host in (0, 1):  # each host joined the program the runner set up, and knows it holds half the devices
        assert f"host {host} of 2 joined: 2 devices in all, 1 here" in out, out[-4000:]
    assert "JAX coordinator at " in out
    steps = [s for s, _ in one_process["loss_curve"]]
    assert steps == [s for s, _ in two["loss_curve"]] == list(range(12))
    gaps = [abs(a - b) for (_, a), (_, b) in zip(one_process["loss_curve"], two["loss_curve"], strict=True)]
    print("step  one process  two hosts   |gap|")
    for (s, a), (_, b), gap in zip(one_process["loss_curve"], two["loss_curve"], gaps, strict=True):
        print(f"{s:>4}  {a:.7f}  {b:.7f}  {gap:.1e}")
    assert max(gaps) <= LOSS_TOLERANCE, gaps
    assert two["checkpoint_steps"] == one_process["checkpoint_steps"] == [4, 8, 11]
    # the checkpoint both hosts wrote, loaded by one process, scores what the one-process run's checkpoint scores
    one_eval, two_eval = one_process["eval"]["result"], two["eval"]["result"]
    assert two_eval["checkpoint"].startswith(two["checkpoint_dir"]) and two_eval["step"] == 11
    assert abs(one_eval["loss"] - two_eval["loss"]) <= LOSS_TOLERANCE, (one_eval, two_eval)
    print(f"evaluation in one process: one-process checkpoint {one_eval['loss']:.7f},"
          f" two-host checkpoint {two_eval['loss']:.7f}")


def test_a_host_lost_mid_run_fails_the_step_at_once_and_the_retry_resumes_to_the_same_loss(cluster, data, two_hosts):
    root, raw, tok = data
    proc = driver(cluster.address, root / "lost", raw, tok, hosts=2, pause=f"4:{root / 'pause'}")
    deadline = time.time() + 420
    while not (root / "pause" / MARKER).exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert (root / "pause" / MARKER).exists(), proc.stdout.read()[-4000:] if proc.poll() is not None else "no pause"
    (output,) = (root / "lost" / "checkpoints").glob("multihost_*")
    run_dir = next(p for p in (output / "checkpoints").iterdir() if p.is_dir())
    assert checkpoint_steps(str(run_dir)) == [4]  # the paused host waits after step 4's checkpoint, the other for it
    killed_at = time.monotonic()
    kill_ray_processes_under(cluster.worker_dir)  # host 1's node dies: raylet, worker, its JAX process
    failed, out = finish(proc)
    failed_after = time.monotonic() - killed_at
    assert not failed["ok"] and "HostLostError" in failed["error"], failed
    lost = (root / "pause" / MARKER).read_text()  # the host id on the killed node
    assert f"host {lost} of 2 was lost" in failed["error"] and "checkpoints/multihost" in failed["error"], failed
    print(failed["error"])
    status = read_status(str(output))
    assert status is not None and status.status is Status.FAILED  # no SUCCESS on the partial run
    assert checkpoint_steps(str(run_dir)) == [4]
    cluster.start_worker()  # a replacement node
    cluster.wait_for_worker_node("present")
    retried = time.monotonic()
    resumed, out = finish(driver(cluster.address, root / "lost", raw, tok, hosts=2))
    assert resumed["ok"], out[-4000:]
    assert "Resuming training from step 5" in out, out[-4000:]
    assert resumed["checkpoint_steps"] == [4, 8, 11]
    uninterrupted = two_hosts[0]["loss_curve"]
    assert abs(resumed["loss_curve"][-1][1] - uninterrupted[-1][1]) <= LOSS_TOLERANCE, (resumed, uninterrupted)
    print(f"host lost: the step failed {failed_after:.1f} s after the kill; the retry resumed from step 4 and"
          f" finished in {time.monotonic() - retried:.1f} s; final loss {resumed['loss_curve'][-1][1]:.7f}"
          f" (uninterrupted {uninterrupted[-1][1]:.7f})")


def test_more_hosts_than_distinct_nodes_fails_at_once_naming_the_request(cluster, data):
    root, raw, tok = data
    failed, out = finish(driver(cluster.address, root / "three", raw, tok, hosts=3))
    assert not failed["ok"] and "InfeasibleRequestError" in failed["error"], failed
    assert "on each of 3 distinct nodes (2 of its nodes can hold one)" in failed["error"], failed["error"]
    assert os.path.isdir(root / "three" / "tokenized")  # what came before the step is done and kept


def test_a_device_layout_changes_how_four_devices_split_not_the_loss_nor_the_identity(data, one_process):
    """Four XLA host devices in one process: two pure data-parallel replicas of two-way FSDP, and two-way tensor
    parallelism (Levanter's default, FSDP over every device, is the two-host test's): the mesh each run recorded,
    one identity, and loss curves equal to the one-device run's within float32 summation order."""
    root, raw, tok = data
    four = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    runs = {}
    for name, layout in (("replicas", "2,1"), ("tensor", "1,2")):
        done, out = finish(driver("here", root / f"layout-{name}", raw, tok, hosts=1, layout=layout, **four))
        assert done["ok"], out[-4000:]
        runs[name] = done
    assert runs["replicas"]["device_mesh"] == {"data": 2, "replica": 2}
    assert runs["tensor"]["device_mesh"] == {"data": 2, "model": 2}
    assert {run["devices"] for run in runs.values()} == {4}
    assert {run["hash"] for run in runs.values()} == {one_process["hash"]}
    reference = one_process["loss_curve"]
    for name, run in runs.items():
        gap = max(abs(a - b) for (_, a), (_, b) in zip(reference, run["loss_curve"], strict=True))
        print(f"layout {name} {run['device_mesh']}: largest loss gap to one device {gap:.1e}")
        assert gap <= LOSS_TOLERANCE, (name, gap)


@pytest.mark.timeout(2000)  # two drivers of five steps each, bounded by `finish` first
def test_dpo_its_reference_log_probs_an_evaluation_and_rl_span_two_hosts_as_one_process_computes_them(cluster,
                                                                                                        tmp_path):
    """The other methods and kinds take the same path: the reference log-probs step, a DPO run, a loss evaluation of
    its checkpoint and an RL run, each on two hosts, compute what one process computes — per pair, per step, the
    loss, every RL sample written."""
    env = subprocess_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    runs = {}
    for name, address, hosts in (("one", "here", 1), ("two", cluster.address, 2)):
        done, out = finish(subprocess.Popen([BIN / "python", METHODS_DRIVER, address, str(tmp_path / name), str(hosts)],
                                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            text=True), timeout=900)
        assert done["ok"], out[-4000:]
        runs[name] = (done, out)
    (one, _), (two, out) = runs["one"], runs["two"]
    assert one["hashes"] == two["hashes"]  # hosts are not identity
    assert (one["hosts"], two["hosts"], one["devices"], two["devices"]) == (1, 2, 1, 2)
    for who in ("reference log-probs", "training", "evaluation"):  # each step joined both hosts into one program
        for host in (0, 1):
            assert re.search(rf"{who} at \S+: host {host} of 2 joined: 2 devices in all", out), (who, out[-4000:])
    assert out.count("of 2 joined: 2 devices in all") == 8, out[-4000:]  # 4 steps × 2 hosts
    gaps = {}
    for split in ("train", "validation"):
        for side, (a, b) in zip(("chosen", "rejected"), zip(one["reference"][split], two["reference"][split],
                                                               strict=True), strict=True):
            assert len(a) == len(b) > 0
            gaps[f"reference {split} {side}"] = max(abs(x - y) for x, y in zip(a, b, strict=True))
    for curve in ("loss_curve", "eval_curve"):
        assert [s for s, _ in one[curve]] == [s for s, _ in two[curve]] and one[curve]
        gaps[curve] = max(abs(a - b) for (_, a), (_, b) in zip(one[curve], two[curve], strict=True))
    gaps["evaluation loss"] = abs(one["eval_loss"] - two["eval_loss"])
    for what, gap in gaps.items():
        print(f"{what}: largest gap between one process and two hosts {gap:.1e}")
    assert max(gaps.values()) <= DPO_TOLERANCE, gaps
    assert one["validation_accuracy"] == two["validation_accuracy"]
    assert two["eval_checkpoint"].startswith(str(tmp_path / "two"))
    # RL: every host wrote the same rollouts (one seed, the gathered weights), the updates are the program's
    assert one["rl_hash"] == two["rl_hash"] and (one["rl_hosts"], two["rl_hosts"]) == (1, 2)
    assert [s for s, _ in one["rl_loss_curve"]] == [s for s, _ in two["rl_loss_curve"]] == [0, 1, 2, 3]
    rl_gap = max(abs(a - b) for (_, a), (_, b) in zip(one["rl_loss_curve"], two["rl_loss_curve"], strict=True))
    print(f"RL loss: largest gap between one process and two hosts {rl_gap:.1e}")
    assert rl_gap <= DPO_TOLERANCE, (one["rl_loss_curve"], two["rl_loss_curve"])
    assert one["rl_held_out_pass_rate"] == two["rl_held_out_pass_rate"] and one["rl_held_out_pass_rate"]
    assert one["rl_samples"] == two["rl_samples"] and {r["split"] for r in two["rl_samples"]} == {"train", "held_out"}
