"""Preemption: SIGTERM to a process training a model (how TPU and spot VMs announce that they are going away) saves
a checkpoint of the step it reached, records why the run stopped, fails the step (no SUCCESS), and the retry
resumes from that checkpoint; a SIGTERM with no training running ends the process as before."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from marin_assets import materialize_step
from marin_assets.core.status import Status
from marin_assets.core.step import walk
from marin_assets.core.stores import read_status
from marin_assets.pipeline.training.checkpoints import checkpoint_steps, run_dir_of
from marin_assets.pipeline.training.runner import METRICS_FILE, PREEMPTED_FILE
from tests.support import preempt_worker
from tests.support.helpers import ROOT, subprocess_env, wait_for


def logged_steps(metrics: Path) -> list[int]:
    """The steps whose training loss the run logged, once per time it trained them."""
    if not metrics.exists():
        return []
    events = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip().endswith("}")]
    return [e["step"] for e in events if e.get("event") == "log" and "train/loss" in e.get("metrics", {})]


def test_sigterm_mid_training_checkpoints_records_why_and_the_retry_resumes_there(prefix):
    pipeline = preempt_worker.pipeline()
    train = pipeline["train"]
    for step in walk([train]):
        if step is not train:
            materialize_step(step, prefix=prefix)
    out = Path(train.output_path_under(prefix))
    worker = subprocess.Popen([sys.executable, "-c", "from tests.support.preempt_worker import main; main()", prefix],
                              cwd=ROOT, env=subprocess_env(MARIN_PREFIX=prefix), stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(s >= 5 for s in logged_steps(out / METRICS_FILE)) or worker.poll() is not None,
                 "the training to log its fifth step", timeout=300)
        assert worker.poll() is None, worker.stderr.read()[-3000:]
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=300)
        stop_s = time.monotonic() - signalled
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 1, err[-3000:]
    assert "Preempted: " in err and "stopped on SIGTERM after step" in err, err[-3000:]
    why = json.loads((out / PREEMPTED_FILE).read_text())
    stopped_at = why["checkpoint_step"]
    assert why["reason"] == "SIGTERM (preemption)" and 5 <= stopped_at < preempt_worker.STEPS - 1, why
    assert checkpoint_steps(run_dir_of(str(out))) == [stopped_at], "a checkpoint of the step SIGTERM reached"
    assert read_status(str(out)).status is Status.FAILED  # no SUCCESS on a stopped run
    assert max(logged_steps(out / METRICS_FILE)) == stopped_at
    print(f"SIGTERM at step {stopped_at}: the process saved it and exited after {stop_s:.1f} s")

    resumed = materialize_step(train, prefix=prefix, settings=preempt_worker.SETTINGS)
    assert read_status(str(out)).status is Status.SUCCESS
    counts = Counter(logged_steps(out / METRICS_FILE))
    assert sorted(counts) == list(range(min(counts), preempt_worker.STEPS)), "a step missing from the curve"
    twice = {s: c for s, c in counts.items() if c > 1 and s != preempt_worker.STEPS - 1}  # (Levanter's final
    # hooks log the last step again, in any run)
    assert not twice, f"the retry resumed at the checkpoint: no step trained twice, but {twice}"
    assert resumed.record.result["steps"] == preempt_worker.STEPS


def in_a_child(*lines: str) -> subprocess.CompletedProcess:
    """`lines` in a fresh Python whose SIGTERM has the default disposition before they run (a test worker's
    children may inherit it ignored), then "survived" printed if the process is still alive. A SIGTERM the process
    sends itself is handled before `os.kill` returns (Python runs the handler at the next instruction; the
    default disposition ends it at once), so nothing needs to wait for it."""
    code = "\n".join(["import os, signal", "from marin_assets.core import preemption",
                      "signal.signal(signal.SIGTERM, signal.SIG_DFL)", *lines, "print('survived')", ""])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)


def test_sigterm_without_a_training_running_ends_the_process_as_before():
    """The handler is installed around a block; with no preemptible step inside, SIGTERM does what it did before
    (here the default: end the process; a process that ignored SIGTERM goes on ignoring it)."""
    done = in_a_child("with preemption.sigterm_preempts():",
                      "    os.kill(os.getpid(), signal.SIGTERM)")
    assert done.returncode == -signal.SIGTERM and "survived" not in done.stdout


def test_a_second_sigterm_ends_a_preemptible_step_at_once():
    done = in_a_child("with preemption.preemptible(), preemption.sigterm_preempts():",
                      "    os.kill(os.getpid(), signal.SIGTERM)",
                      "    assert preemption.requested.is_set(), 'the first asks the step to stop'",
                      "    print('asked', flush=True)",
                      "    os.kill(os.getpid(), signal.SIGTERM)")
    assert done.stdout.splitlines() == ["asked"] and done.returncode == -signal.SIGTERM, (done.stdout, done.stderr)


def test_a_preempted_step_s_run_is_retried_by_dagster_and_its_own_failure_is_not(dagster_home, prefix):
    """Through the definitions, on an instance with the project's settings (run retries skip a step's own
    failure): a step that raises `Preempted` fails its run tagged with why, and Dagster marks that run to be
    retried; a step's own error is still not retried."""
    import dagster as dg

    from marin_assets.core.preemption import Preempted
    from marin_assets.core.step import Step
    from marin_assets.dagster.assets import PREEMPTED_TAG
    from marin_assets.dagster.definitions import build_definitions

    def preempted(output_path: str) -> None:
        raise Preempted("stopped on SIGTERM after step 7, its checkpoint saved")

    def broken(output_path: str) -> None:
        raise ValueError("the step's own error")

    with dg.DagsterInstance.get() as instance:
        assert instance.run_retries_enabled and not instance.run_retries_retry_on_asset_or_op_failure
        runs = {}
        for name, fn in (("train/preempted", preempted), ("train/broken", broken)):
            job = build_definitions([Step(name=name, fn=fn)]).resolve_implicit_global_asset_job_def()
            result = job.execute_in_process(instance=instance, raise_on_error=False)
            assert not result.success
            runs[name] = instance.get_run_by_id(result.run_id)
        tags = runs["train/preempted"].tags
        assert tags["dagster/will_retry"] == "true", tags
        assert "stopped on SIGTERM after step 7" in tags[PREEMPTED_TAG]
        assert runs["train/broken"].tags["dagster/will_retry"] == "false"
        assert PREEMPTED_TAG not in runs["train/broken"].tags
