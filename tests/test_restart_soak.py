"""Nothing lost when the daemon or the code server dies: a restart soak under the real Dagster daemon.

Each trial trains a tiny model (its checkpoints land one after another) while the daemon's checkpoint sensor
queues their evaluations; at seeded random moments — a checkpoint listed, an evaluation queued, one running,
one done, plus a seeded delay — the daemon (its whole process group: its code server and the runs it
launched, with SIGKILL or SIGTERM) or, in the last trial, a separately served code server (the server
process, as a crash or a redeploy ends it: the runs it started go on) is killed, and restarted after a
seeded pause. Each trial prints where it was killed and the runs it ended with. Every trial must end with
every checkpoint's evaluation `SUCCESS` exactly once: no partition without a successful run, none with two.
The runs join one local Ray (`marin-assets ray start`), as a user's would, so that a trial pays for its
evaluations, not for starting Ray in each of them.

On the code before this soak (no run queue retries, no run retries, no run monitoring, no resubmission) its
first trial never settles: checkpoint 5's evaluation fails at dequeue after the restart ("Caught an
unrecoverable error while dequeuing the run") and nothing asks for it again.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from marin_assets import materialize_step
from marin_assets.core.status import Status
from marin_assets.core.step import walk
from marin_assets.core.stores import read_status
from marin_assets.dagster.instance import write_instance_yaml
from marin_assets.dagster.naming import asset_key
from marin_assets.dagster.resubmit import RESUBMITTED_TAG
from marin_assets.pipeline.training.checkpoints import list_checkpoints, run_dir_of
from tests.support import soak_pipeline as soak
from tests.support.daemon_instance import daemon_settings, wait_for_ticks
from tests.support.helpers import BIN, ROOT, run_cli, subprocess_env, wait_for

SEED = 37
MODULE = ROOT / "tests" / "support" / "soak_pipeline.py"
DONE = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


class Deployment:
    """A Dagster instance with the project's settings, its daemon and (in `code_server` mode) a code server
    served apart from the daemon, all restartable; the runs they start are processes of this machine."""

    def __init__(self, tmp: Path, prefix: str):
        self.tmp, self.prefix = tmp, prefix
        self.home = tmp / "home"
        settings = daemon_settings()
        write_instance_yaml(self.home / "dagster.yaml", settings)
        self.env = subprocess_env(DAGSTER_HOME=str(self.home), MARIN_PREFIX=prefix)
        self.socket = tmp / "code.sock"
        (tmp / "daemon-owns-code.yaml").write_text(
            f"load_from:\n  - python_file:\n      relative_path: {MODULE}\n      working_directory: {ROOT}\n"
            f"      attribute: defs\n      location_name: soak\n")
        (tmp / "served-code.yaml").write_text(
            f"load_from:\n  - grpc_server:\n      socket: {self.socket}\n      location_name: soak\n")
        self.daemon: subprocess.Popen | None = None
        self.code: subprocess.Popen | None = None
        self.starts = Counter[str]()

    def _spawn(self, what: str, args: list[str]) -> subprocess.Popen:
        self.starts[what] += 1
        log = open(self.tmp / f"{what}{self.starts[what]}.log", "w")
        return subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def start_code_server(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.code = self._spawn("code", [str(BIN / "dagster"), "api", "grpc", "--socket", str(self.socket),
                                         "--python-file", str(MODULE), "--attribute", "defs",
                                         "--working-directory", str(ROOT), "--location-name", "soak"])

    def start_daemon(self, mode: str) -> None:
        workspace = self.tmp / ("served-code.yaml" if mode == "code_server" else "daemon-owns-code.yaml")
        self.daemon = self._spawn("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)])

    @staticmethod
    def kill(proc: subprocess.Popen | None, sig: int = signal.SIGKILL, group: bool = True) -> None:
        """Kill `proc` (with its process group: what it started) and reap it."""
        if proc is None or proc.poll() is not None:
            return
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        self.kill(self.daemon, signal.SIGTERM)
        self.kill(self.code, signal.SIGTERM)


def runs_of(instance: dg.DagsterInstance, trial: int) -> list[dg.DagsterRun]:
    key = asset_key(soak.evals[trial].name)
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/sensor_name": soak.SENSOR}))
    return [r for r in runs if r.asset_selection and key in r.asset_selection]


def snapshot(instance: dg.DagsterInstance, trial: int, prefix: str) -> str:
    """Where the trial stands: checkpoints on disk and its evaluation runs by status."""
    found = list_checkpoints(run_dir_of(soak.trains[trial].output_path_under(prefix)))
    by_status = Counter(r.status.value for r in runs_of(instance, trial))
    return f"checkpoints {sorted(found)}, runs {dict(sorted(by_status.items())) or 'none'}"


MOMENTS = {
    "a checkpoint written": lambda runs, found: bool(found),
    "an evaluation queued": lambda runs, found: any(r.status is dg.DagsterRunStatus.QUEUED for r in runs),
    "an evaluation running": lambda runs, found: any(r.status in (dg.DagsterRunStatus.STARTING,
                                                                   dg.DagsterRunStatus.STARTED) for r in runs),
    "an evaluation done": lambda runs, found: any(r.status is dg.DagsterRunStatus.SUCCESS for r in runs),
}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("soak")
    prefix = str(tmp / "outputs")
    for step in walk([soak.tokenized]):
        materialize_step(step, prefix=prefix)
    deployment = Deployment(tmp, prefix)
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(deployment.home)
    run_cli(BIN / "marin-assets", "ray", "start", "--num-cpus", "2", env=deployment.env)
    try:
        yield deployment
    finally:
        deployment.stop()
        run_cli(BIN / "marin-assets", "ray", "stop", env=deployment.env, check=False)
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old


def summary_of(runs: list) -> list[tuple]:
    """Each run's partition, status, whether it was resubmitted, and its retry number."""
    return sorted((r.tags.get("dagster/partition"), r.status.value, r.tags.get(RESUBMITTED_TAG),
                   r.tags.get("dagster/retry_number")) for r in runs)


def run_trial(deployment: Deployment, trial: int, mode: str, rng: random.Random) -> list[str]:
    """Train trial `trial` while killing `mode` ('daemon' or 'code_server') at seeded moments; wait until
    every checkpoint's evaluation has settled. Returns what the trial printed."""
    instance = dg.DagsterInstance.get()
    prefix = deployment.prefix
    kills = 1 + (rng.random() < 0.5)
    moments = rng.sample(sorted(MOMENTS), kills)
    printed = []
    train_out = soak.trains[trial].output_path_under(prefix)
    training = subprocess.Popen([sys.executable, "-m", "tests.support.soak_pipeline", str(trial)], cwd=ROOT,
                                env=deployment.env, stdout=open(deployment.tmp / f"train{trial}.log", "w"),
                                stderr=subprocess.STDOUT)
    try:
        for k, moment in enumerate(moments):
            extra = round(rng.uniform(0.0, 2.0), 2)
            down = round(rng.uniform(0.5, 6.0), 2)
            sig = signal.SIGKILL if mode == "code_server" or rng.random() < 0.5 else signal.SIGTERM

            def reached(moment=moment):
                found = list_checkpoints(run_dir_of(train_out))
                return MOMENTS[moment](runs_of(instance, trial), found)
            try:
                wait_for(reached, f"trial {trial}: {moment}", timeout=240, interval=0.2)
            except AssertionError:
                if training.poll() is None or len([r for r in runs_of(instance, trial) if r.status in DONE]) < 3:
                    raise
                moment = "everything evaluated"  # noqa: PLW2901  the moment passed unseen: kill now
            time.sleep(extra)
            where = snapshot(instance, trial, prefix)
            target = deployment.daemon if mode == "daemon" else deployment.code
            deployment.kill(target, sig, group=mode == "daemon")
            line = (f"trial {trial} ({mode}) kill {k + 1}/{kills}: {signal.Signals(sig).name} at '{moment}'"
                    f" + {extra} s — {where}; down {down} s")
            print(line)
            printed.append(line)
            time.sleep(down)
            if mode == "daemon":
                deployment.start_daemon(mode)
            else:
                deployment.start_code_server()
        assert training.wait(300) == 0, (deployment.tmp / f"train{trial}.log").read_text()[-3000:]

        def settled():
            runs = runs_of(instance, trial)
            succeeded = {r.tags.get("dagster/partition") for r in runs if r.status is dg.DagsterRunStatus.SUCCESS}
            busy = [r for r in runs if r.status not in DONE]
            return runs if succeeded >= {str(c) for c in soak.CHECKPOINTS} and not busy else None

        try:
            wait_for(settled, f"trial {trial}: every checkpoint's evaluation to succeed", timeout=900, interval=0.5)
        except AssertionError as e:  # say whether work was lost (no run left for a partition) or only slow
            raise AssertionError(f"{e}; {printed}; runs (partition, status, resubmitted, retry):"
                                 f" {summary_of(runs_of(instance, trial))}") from None
        # A few more ticks: a late resubmission or retry of a partition that already succeeded would show here.
        wait_for_ticks(instance, soak.SENSOR)
    finally:
        training.kill()
    runs = runs_of(instance, trial)
    summary = summary_of(runs)
    printed.append(f"trial {trial} runs (partition, status, resubmitted, retry): {summary}")
    print(printed[-1])
    successes = Counter(r.tags["dagster/partition"] for r in runs if r.status is dg.DagsterRunStatus.SUCCESS)
    assert successes == Counter({str(c): 1 for c in soak.CHECKPOINTS}), summary  # each exactly once
    for checkpoint in soak.CHECKPOINTS:
        status = read_status(soak.evals[trial].step(checkpoint).output_path_under(prefix))
        assert status is not None and status.status is Status.SUCCESS, (checkpoint, status)
    return printed


@pytest.mark.timeout(1500)  # the trial's own waits (training, up to 2 kills, 900 s to settle) bound it first
@pytest.mark.parametrize("trial, mode", [(0, "daemon"), (1, "daemon"), (2, "code_server")])
def test_restarts_at_random_moments_lose_no_evaluation_and_repeat_none(deployment, trial, mode):
    rng = random.Random(f"{SEED}-{trial}")
    deployment.stop()
    if mode == "code_server":
        deployment.start_code_server()
    deployment.start_daemon(mode)
    run_trial(deployment, trial, mode, rng)
