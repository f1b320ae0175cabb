"""kill -9 at random moments of a download, a tokenize and a training run, then recover.

Shared by the test (a fixed seed, a few trials) and the soak (`bench/crash_soak.py`, many).
One trial: a separate process materializes the step (in process, or on an embedded Ray);
once its function has started, the whole process group — and the Ray worker — gets SIGKILL
after a random delay. Then: no SUCCESS unless the output is
complete, no record for an unfinished step; the next materialization takes the stale lease
over after the timeout, resumes, succeeds, and its output equals the reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from marin_assets import materialize_step
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.status import Status
from marin_assets.core.step import Step, walk
from marin_assets.core.stores import read_status
from marin_assets.experiments import tiny_stories
from marin_assets.pipeline.data.download import url_download_step
from marin_assets.pipeline.training.checkpoints import list_checkpoints, run_dir_of
from marin_assets.pipeline.training.specs import OptimizerSpec

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = LeaseSettings(heartbeat_interval=0.2, stale_timeout=1.5, poll_interval=0.05)
WINDOWS = {"download": 1.5, "tokenize": 4.0, "train": 12.0}
"""Seconds after the function starts within which the kill lands: about its running time."""


def source_folder(root: Path) -> Path:
    """Eight 6 MiB files of seeded bytes: a download slow enough to be cut in the middle."""
    folder = root / "source"
    if not folder.exists():
        folder.mkdir(parents=True)
        rng = random.Random(0)
        for i in range(8):
            (folder / f"part-{i}.bin").write_bytes(rng.randbytes(6 * 2**20))
    return folder


def steps(root: Path, source_url: str) -> dict[str, Step]:
    """`source_url` serves `source_folder(root)` (over a slow local HTTP server)."""
    from tests.support.automation_pipeline import SHORT, TINY

    pipeline = tiny_stories.build(prefix="crash", train_documents=6000, validation_documents=60, vocab_size=400,
                                  model=TINY, trainer=SHORT, optimizer=OptimizerSpec(learning_rate=1e-2))
    return {"download": url_download_step("raw/crash-files", [f"{source_url}/part-{i}.bin" for i in range(8)]),
            "tokenize": pipeline["tokenized"], "train": pipeline["train"]}


def with_marker(step: Step, marker: str) -> Step:
    """The same step (same identity) whose function first writes its process id to `marker`
    (on Ray: the worker's)."""
    fn = step.fn

    def marked(output_path: str):
        Path(marker).write_text(str(os.getpid()))
        return fn(output_path)

    return replace(step, fn=marked)


@dataclass
class Report:
    trials: int = 0
    killed_running: int = 0
    """Kills that landed while the function ran (the rest: after it finished)."""
    resumed: int = 0
    """Recoveries that found partial work to continue (files, checkpoints)."""
    failures: list[str] = field(default_factory=list)


def digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def partial_work(kind: str, out: str) -> int:
    if kind == "download":
        return len([p for p in Path(out).glob("part-*.bin")]) if os.path.isdir(out) else 0
    if kind == "train":
        return len(list_checkpoints(run_dir_of(out)))
    # files a split's ledger has committed rows of (finished or under way)
    ledgers = [json.loads(p.read_text()) for p in Path(out).glob("*/shard_ledger.json")] if os.path.isdir(out) else []
    return sum(sum(1 for rows in ledger.get("shard_rows", {}).values() if rows) for ledger in ledgers)


def check(kind: str, result, root: Path) -> str | None:
    """Why a recovered output is wrong, or None."""
    if kind == "download":
        got = {f["path"]: f["sha256"] for f in result["files"]}
        want = {name: sha for name, sha in digest(source_folder(root)).items()}
        return None if got == want else f"files differ: {got} != {want}"
    if kind == "tokenize":
        splits = result["splits"]
        ok = splits["train"]["documents"] == 6000 and splits["validation"]["documents"] == 60
        return None if ok else f"document counts {splits}"
    ok = result["checkpoint_steps"] == [5, 10, 11] and result["final_train_loss"] < result["loss_curve"][0][1]
    return None if ok else f"training result {result['checkpoint_steps']}, {result['final_train_loss']}"


def trial(kind: str, root: Path, prefix: str, url: str, rng: random.Random, report: Report,
          on_ray: bool = False) -> None:
    step = steps(root, url)[kind]
    for dep in walk(step.deps):
        materialize_step(dep, prefix=prefix, settings=SETTINGS)
    out = step.output_path_under(prefix)
    shutil.rmtree(out, ignore_errors=True)  # every trial starts from nothing
    marker = root / f"{kind}.started"
    marker.unlink(missing_ok=True)
    ray_tmp = tempfile.mkdtemp(prefix="mcr-", dir="/tmp")  # short (Ray's socket paths), and marks its processes
    worker = str(ROOT / "tests" / "support" / "crash_worker.py")
    where = "ray" if on_ray else "local"
    proc = subprocess.Popen([sys.executable, worker, str(root), url, kind, prefix, str(marker), where],
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": ray_tmp}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (marker.exists() and marker.read_text()) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0, WINDOWS[kind]))
    running = proc.poll() is None
    if running:
        # The Ray worker running the function, then the Dagster-side process and everything it
        # started; either may have just exited on its own.
        targets = ([(os.kill, int(marker.read_text()))] if on_ray else []) + [(os.killpg, proc.pid)]
        for kill, pid in targets:
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
    proc.wait()
    _kill_processes_mentioning(ray_tmp)  # Ray daemons that left the process group
    shutil.rmtree(ray_tmp, ignore_errors=True)
    report.trials += 1
    report.killed_running += running

    status = read_status(out)
    if status is not None and status.status is Status.SUCCESS:
        problem = check(kind, read_record(out).result, root)  # finished before the kill: must be whole
        if problem:
            report.failures.append(f"{kind}: SUCCESS on an incomplete output: {problem}")
        return
    try:
        read_record(out)
        report.failures.append(f"{kind}: a record without SUCCESS at {out}")
    except RecordNotAvailableError:
        pass
    partial = partial_work(kind, out)
    outcome = materialize_step(step, prefix=prefix, settings=SETTINGS)  # waits out the stale lease
    if status is not None and not (outcome.took_over or "").startswith("stale RUNNING"):
        report.failures.append(f"{kind}: the stale lease was not taken over ({outcome.took_over})")
    if kind == "download" and partial:
        skipped = sum(f["skipped"] for f in outcome.record.result["files"])
        if skipped < partial:
            report.failures.append(f"{kind}: {partial} finished files before, only {skipped} skipped")
    report.resumed += partial > 0
    problem = check(kind, outcome.record.result, root)
    if problem:
        report.failures.append(f"{kind}: recovered output wrong: {problem}")


def _kill_processes_mentioning(marker: str) -> None:
    import psutil

    for process in psutil.process_iter(["pid", "cmdline"]):
        if any(marker in arg for arg in process.info["cmdline"] or []):
            try:
                process.kill()
            except psutil.Error:
                pass


def run_trials(kinds: dict[str, int], root: Path, prefix: str, seed: int = 0) -> Report:
    """`kinds`: trial counts by kind; a kind ending in `@ray` runs the function on an embedded
    Ray and kills the Ray worker too."""
    from tests.support.servers import serve_directory

    rng = random.Random(seed)
    report = Report()
    with serve_directory(source_folder(root), throttled=True) as url:
        for kind, count in kinds.items():
            for _ in range(count):
                trial(kind.removesuffix("@ray"), root, prefix, url, rng, report, on_ray=kind.endswith("@ray"))
    return report
