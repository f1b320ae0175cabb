"""kill -9 at chosen and at random moments of a download, a tokenize and a training run, then recover.

Shared by the test (a fixed seed, a few trials) and the soak (`bench/crash_soak.py`, many).
One trial: a separate process materializes the step (in process, or on an embedded Ray); once its
function has started, the whole process group — and the Ray worker — gets SIGKILL at the trial's
moment. Then: no SUCCESS unless the output is complete, no record for an unfinished step; the next
materialization (in this process) takes the stale lease over after the timeout, resumes and succeeds.

What is compared is what lies on disk, not what the record claims: the downloaded files' bytes
against the source's, the token arrays of the Levanter cache and its ledger against an uninterrupted
run's, the complete checkpoints and the loss curve against an uninterrupted run's. The uninterrupted
run is the kind's first trial, whose moment is `finish` (killed only once SUCCESS is written).

Each trial is filed under the interleaving it hit (`Report.interleavings`, `kind/branch`):

- `fresh`: killed before anything was committed; the recovery recomputed from nothing;
- `resumed`: killed with committed work (finished files, ledger rows, checkpoints); the recovery
  continued from it, shown on disk or by what it did (files not rewritten, checkpoints not
  rewritten, ledger-finished files not tokenized again);
- `cached`: SUCCESS was written before the kill; the rerun was a cache hit.

Moments: `finish`, then `first-commit` (killed as soon as the first piece of work is committed, so the
`resumed` branch runs in every run of the trials, not only when a random delay happens to land
there) for the first trials of a kind; `random` (a seeded delay within the function's running time)
for the rest, and for every `@ray` trial.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
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
from typing import Any

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
WINDOWS = {"download": 1.5, "tokenize": 4.0, "train": 20.0}
"""Seconds after the function starts within which a random kill lands: about its running time (training's
includes importing Levanter, ~6-10 s, and compiling its steps)."""
SPLITS = {"train": 6000, "validation": 60}
"""Documents of the tokenized corpus, by split."""
CHECKPOINTS = [5, 10, 11]
"""What the training run saves (every 5 steps, and the last)."""


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

    pipeline = tiny_stories.build(prefix="crash", train_documents=SPLITS["train"],
                                  validation_documents=SPLITS["validation"], vocab_size=400,
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
    """Kills that landed while the function ran (the rest: after SUCCESS was written)."""
    resumed: int = 0
    """Recoveries that found partial work to continue (files, ledger rows, checkpoints)."""
    interleavings: dict[str, int] = field(default_factory=dict)
    """Trials by `kind/branch` (`download@ray/resumed`…): see the module's docstring."""
    leftovers: int = 0
    """Hidden partial files (`.part-N.bin.*.part`) of killed downloads still in a recovered output."""
    failures: list[str] = field(default_factory=list)


# --- what lies on disk --------------------------------------------------------------------------

def digest(path: Path) -> dict[str, str]:
    """sha256 of every visible file under `path`, read from disk."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def _ledger(cache_dir: Path) -> dict[str, Any]:
    """A split's committed ledger ({} while none, or while it is being rewritten)."""
    try:
        return json.loads((cache_dir / "shard_ledger.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def token_arrays(cache_dir: Path) -> tuple[Any, Any]:
    """(end offset of each row, every token) of a Levanter cache: the arrays a trainer reads, through the
    same store `cache_writer` writes (only the committed, visible rows)."""
    import numpy as np

    from marin_assets.pipeline.tokens import levanter_cache as lc

    ids = lc.open_store({"input_ids": np.zeros((0,), dtype=np.int32)}, str(cache_dir), mode="r").tree["input_ids"]
    rows = ids.num_rows
    return ids.offsets[1:rows + 1].read().result(), ids.data[:ids.data_size].read().result()


def on_disk(kind: str, out: Path) -> dict[str, Any]:
    """What a finished output holds, read from its files (never from its record)."""
    if kind == "download":
        return {"files": digest(out)}
    if kind == "tokenize":
        found: dict[str, Any] = {}
        for split in SPLITS:
            ledger = _ledger(out / split)
            offsets, tokens = token_arrays(out / split)
            found[split] = {"rows": int(len(offsets)), "tokens": tokens, "offsets": offsets,
                            "ledger": (ledger.get("is_finished"), ledger.get("total_num_rows"),
                                       sorted(ledger.get("finished_shards", [])), ledger.get("shard_rows"))}
        return found
    return {"checkpoints": list_checkpoints(run_dir_of(str(out)))}


def differences(kind: str, got: dict[str, Any], want: dict[str, Any], result: dict) -> list[str]:
    """How a recovered output (`got`, on disk; `result`, its record) differs from the uninterrupted one
    (`want`, on disk; for training, `want["result"]` its record)."""
    import numpy as np

    problems = []
    if kind == "download":
        if got["files"] != want["files"]:
            differing = sorted(got["files"].items() ^ want["files"].items())
            problems.append(f"files on disk differ from the source: {differing}")
        recorded = {f["path"]: f["sha256"] for f in result["files"]}
        if recorded != got["files"]:
            problems.append("the record's checksums are not those of the files on disk")
    elif kind == "tokenize":
        for split in SPLITS:
            g, w = got[split], want[split]
            if g["ledger"] != w["ledger"]:
                problems.append(f"{split}: ledger {g['ledger'][:3]} != uninterrupted {w['ledger'][:3]}")
            if not (np.array_equal(g["offsets"], w["offsets"]) and np.array_equal(g["tokens"], w["tokens"])):
                problems.append(f"{split}: token arrays differ from the uninterrupted run's ({g['rows']} rows,"
                                f" {len(g['tokens'])} tokens vs {w['rows']}, {len(w['tokens'])})")
            recorded = result["splits"][split]
            if (recorded["documents"], recorded["tokens"]) != (g["rows"], len(g["tokens"])):
                problems.append(f"{split}: the record says {recorded['documents']} documents, {recorded['tokens']}"
                                f" tokens; the cache holds {g['rows']}, {len(g['tokens'])}")
    else:
        if got["checkpoints"] != want["checkpoints"] or result["checkpoint_steps"] != sorted(got["checkpoints"]):
            problems.append(f"checkpoints on disk {got['checkpoints']} (record {result['checkpoint_steps']}),"
                            f" uninterrupted {want['checkpoints']}")
        curve, reference = dict(map(tuple, result["loss_curve"])), dict(map(tuple, want["result"]["loss_curve"]))
        if curve.keys() != reference.keys():
            problems.append(f"losses logged at steps {sorted(curve)}, uninterrupted {sorted(reference)}")
        # Equal to the last bit, and why that much is deterministic: the same step (same seed; the same data order,
        # Levanter's loader picking a step's batch from the step number) runs the same XLA program on the same CPU
        # (JAX_PLATFORMS=cpu), and a resumed attempt starts from a checkpoint holding exactly, in float32, the
        # parameters, optimizer state and random key the killed attempt saved. Identical inputs to an identical
        # program give identical floats: in this process, in a Ray worker and after a resumption alike (seen: all
        # 12 losses equal to the last bit). A tolerance would hide what this is here to catch: a resumption that
        # restored another state or replayed other batches.
        off = {s: (curve[s], reference[s]) for s in sorted(curve.keys() & reference.keys()) if curve[s] != reference[s]}
        final, reference_final = result["final_train_loss"], want["result"]["final_train_loss"]
        if off or final != reference_final:
            problems.append(f"losses differ from the uninterrupted run's: {off}; final {final} vs {reference_final}")
    return problems


def sane(kind: str, found: dict[str, Any], result: dict) -> list[str]:
    """Facts known without any run, checked on the uninterrupted output (tokenize, train): every document
    tokenized, the checkpoints the trainer spec asks for, a falling loss."""
    if kind == "tokenize":
        rows = {split: found[split]["rows"] for split in SPLITS}
        return [] if rows == SPLITS else [f"rows on disk {rows}, documents {SPLITS}"]
    ok = sorted(found["checkpoints"]) == CHECKPOINTS and result["final_train_loss"] < result["loss_curve"][0][1]
    return [] if ok else [f"checkpoints {found['checkpoints']}, final loss {result['final_train_loss']}"]


def committed(kind: str, out: Path) -> dict[str, Any]:
    """The work a killed attempt committed: finished files (with their inode and mtime), ledger rows and
    finished files by split, complete checkpoints (with their metadata's inode and mtime)."""
    def stamp(p: Path) -> tuple[int, int]:
        s = p.stat()
        return s.st_ino, s.st_mtime_ns

    if kind == "download":
        return {p.name: stamp(p) for p in sorted(out.glob("part-*.bin"))}
    if kind == "tokenize":  # straight into each split's cache, in this step (workers=1)
        return {split: ledger for split in SPLITS
                if (ledger := _ledger(out / split)) and any(ledger.get("shard_rows", {}).values())}
    run_dir = Path(run_dir_of(str(out)))
    return {step: stamp(run_dir / f"step-{step}" / "metadata.json") for step in list_checkpoints(str(run_dir))}


@contextlib.contextmanager
def files_tokenized(calls: list[tuple[str, str, int]]):
    """Records (cache folder's name — the split —, shard, documents skipped) for each file this process
    tokenizes into a cache meanwhile. An observer only: it wraps `cache_writer._append_file` (the function that
    reads, tokenizes and appends one file, after the documents its ledger already committed) and passes every
    call through."""
    from marin_assets.pipeline.tokens import cache_writer

    original = cache_writer._append_file  # noqa: SLF001
    signature = inspect.signature(original)

    def observed(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        pipeline = bound["pipeline"]
        calls.append((pipeline.cache_dir.rstrip("/").rsplit("/", 1)[-1], bound["shard"], pipeline.skips[bound["file"]]))
        return original(*args, **kwargs)

    cache_writer._append_file = observed  # noqa: SLF001
    try:
        yield calls
    finally:
        cache_writer._append_file = original  # noqa: SLF001


def continued(kind: str, before: dict[str, Any], out: Path, result: dict,
              tokenized: list[tuple[str, str, int]]) -> list[str]:
    """Why the recovery did not continue from the committed work `before` (empty: it did)."""
    after = committed(kind, out)
    if kind == "download":
        skipped = sorted(f["path"] for f in result["files"] if f["skipped"])
        problems = [] if skipped == sorted(before) else [f"finished before {sorted(before)}, skipped {skipped}"]
        rewritten = sorted(name for name, stamp in before.items() if after.get(name) != stamp)
        return problems + ([f"finished files rewritten: {rewritten}"] if rewritten else [])
    if kind == "tokenize":
        finished = {(split, shard) for split, ledger in before.items() for shard in ledger["finished_shards"]}
        again = sorted(f"{split}/{shard}" for split, shard, _ in tokenized if (split, shard) in finished)
        partial = {(split, shard): rows for split, ledger in before.items()
                   for shard, rows in ledger["shard_rows"].items() if (split, shard) not in finished}
        restarted = sorted(f"{split}/{shard}" for split, shard, skip in tokenized
                           if partial.get((split, shard), 0) > skip)
        return ([f"files the ledger had finished tokenized again: {again}"] if again else []) + (
            [f"files restarted before their committed rows: {restarted}"] if restarted else [])
    rewritten = sorted(step for step, stamp in before.items() if after.get(step) != stamp)
    return [f"checkpoints rewritten instead of resumed from: {rewritten}"] if rewritten else []


# --- one trial ----------------------------------------------------------------------------------

def _started(marker: Path) -> bool:
    return marker.exists() and bool(marker.read_text())


def _wait_for_moment(moment: str, kind: str, out: Path, proc: subprocess.Popen, rng: random.Random) -> None:
    if moment == "random":
        time.sleep(rng.uniform(0, WINDOWS[kind]))
        return
    deadline = time.time() + 30 * WINDOWS[kind]  # a bound against a hang, not a timing assertion
    while proc.poll() is None and time.time() < deadline:
        status = read_status(str(out))
        if status is not None and status.status is Status.SUCCESS:
            return
        if moment == "first-commit" and committed(kind, out):
            return
        time.sleep(0.01)


def trial(kind: str, root: Path, prefix: str, url: str, rng: random.Random, report: Report,
          on_ray: bool = False, moment: str = "random", oracles: dict[str, dict] | None = None) -> None:
    """One kill and recovery. `moment`: `finish`, `first-commit` or `random`; `oracles`: the uninterrupted
    outputs by kind, filled by a `finish` trial (downloads compare with the source)."""
    oracles = {} if oracles is None else oracles
    label = f"{kind}@ray" if on_ray else kind
    step = steps(root, url)[kind]
    for dep in walk(step.deps):
        materialize_step(dep, prefix=prefix, settings=SETTINGS)
    out = Path(step.output_path_under(prefix))
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
    while not _started(marker) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    started = _started(marker)
    _wait_for_moment(moment, kind, out, proc, rng)
    alive = proc.poll() is None
    if alive:
        # The Ray worker running the function, then the Dagster-side process and everything it
        # started; either may have just exited on its own.
        targets = ([(os.kill, int(marker.read_text()))] if on_ray and started else []) + [(os.killpg, proc.pid)]
        for kill, pid in targets:
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
    proc.wait()
    _kill_processes_mentioning(ray_tmp)  # Ray daemons that left the process group
    shutil.rmtree(ray_tmp, ignore_errors=True)
    report.trials += 1
    if not started:
        report.failures.append(f"{label}: the function never started (worker exit status {proc.returncode})")
        return

    status = read_status(str(out))
    finished = status is not None and status.status is Status.SUCCESS
    report.killed_running += alive and not finished
    before = {} if finished else committed(kind, out)
    if not finished:
        try:
            read_record(str(out))
            report.failures.append(f"{label}: a record without SUCCESS at {out}")
        except RecordNotAvailableError:
            pass
    branch = "cached" if finished else "resumed" if before else "fresh"
    report.interleavings[f"{label}/{branch}"] = report.interleavings.get(f"{label}/{branch}", 0) + 1
    report.resumed += branch == "resumed"

    tokenized: list[tuple[str, str, int]] = []
    with files_tokenized(tokenized):
        outcome = materialize_step(step, prefix=prefix, settings=SETTINGS)  # waits out a stale lease
    result = outcome.record.result
    problems = []
    if finished and not outcome.cached:
        problems.append(f"SUCCESS before the kill, but the rerun was not a cache hit ({outcome.took_over})")
    if not finished and not (outcome.took_over or "").startswith("stale RUNNING"):
        problems.append(f"the stale lease was not taken over ({outcome.took_over})")
    if branch == "resumed":
        problems += continued(kind, before, out, result, tokenized)
    found = on_disk(kind, out)
    if kind == "download":
        leftovers = sorted(p.name for p in out.rglob(".*.part"))
        report.leftovers += len(leftovers)
        if leftovers:
            problems.append(f"partial files of a killed attempt left in the output: {leftovers}")
        oracles.setdefault(kind, {"files": digest(source_folder(root))})
    elif kind not in oracles and moment == "finish" and finished:
        problems += sane(kind, found, result)
        oracles[kind] = {**found, "result": result}
    if kind in oracles:
        problems += differences(kind, found, oracles[kind], result)
    else:
        problems.append("no uninterrupted output to compare with (the kind's first trial was killed before SUCCESS)")
    report.failures += [f"{label} ({moment}, {branch}): {p}" for p in problems]


def _kill_processes_mentioning(marker: str) -> None:
    import psutil

    for process in psutil.process_iter(["pid", "cmdline"]):
        if any(marker in arg for arg in process.info["cmdline"] or []):
            try:
                process.kill()
            except psutil.Error:
                pass


def moments(kinds: dict[str, int]) -> list[tuple[str, str]]:
    """(kind, moment) for every trial, in order: per kind (`@ray` or not), first `finish` where an
    uninterrupted output is needed (tokenize, train) and none was made yet, then `first-commit` once for
    each kind run in process, then `random`."""
    planned, have_oracle, have_resume = [], {"download"}, set()
    for label, count in kinds.items():
        kind, on_ray = label.removesuffix("@ray"), label.endswith("@ray")
        for _ in range(count):
            if kind not in have_oracle:
                moment = "finish"
                have_oracle.add(kind)
            elif kind not in have_resume and not on_ray:
                moment = "first-commit"
                have_resume.add(kind)
            else:
                moment = "random"
            planned.append((label, moment))
    return planned


def run_trials(kinds: dict[str, int], root: Path, prefix: str, seed: int = 0) -> Report:
    """`kinds`: trial counts by kind; a kind ending in `@ray` runs the function on an embedded
    Ray and kills the Ray worker too."""
    from tests.support.servers import serve_directory

    rng = random.Random(seed)
    report = Report()
    oracles: dict[str, dict] = {}
    with serve_directory(source_folder(root), throttled=True) as url:
        for label, moment in moments(kinds):
            trial(label.removesuffix("@ray"), root, prefix, url, rng, report, on_ray=label.endswith("@ray"),
                  moment=moment, oracles=oracles)
    report.interleavings = dict(sorted(report.interleavings.items()))
    return report
