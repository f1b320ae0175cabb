"""The demo, measured: end to end, peak memory of its Dagster process, and re-materialized all cached.

(a) end to end: `make demo`'s `dagster asset materialize` on a fresh instance and prefix,
    installed and offline, against the 3-minute goal.
(b) peak memory: the resident high-water mark (VmHWM) of that Dagster process ÷ the same CLI
    materializing plain no-op assets of the demo's shape (`noop_graph.py`). The work itself runs
    in Ray worker processes; the peak of the whole process tree is reported beside it.
(c) cached: the demo's job executed in process once everything exists — every asset a cache hit
    (status + record read, checks run on the output, metadata) ÷ the same graph of no-op assets
    whose checks of the same names pass without looking (and, for information, ÷ no-op assets
    without checks); the order of the three rotates every repetition; wall and CPU time.

`--quick` runs the same on the demo's graph at test size (`tests/support/ui_definitions.py`: same
assets, checks and metadata, a tiny corpus and model).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import time
from pathlib import Path

import psutil
from measure import time_ratio

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
SELECTION = "*hello/report,*exports/python-docs-llama,*evals/python-docs-llama"
"""What `make demo` materializes (the Makefile's selection): every unpartitioned asset."""


def _high_water_mark(pid: int) -> int:
    """VmHWM of a live process, in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def run_cli(args: list[str], env: dict[str, str], log: Path) -> dict:
    """Run the dagster CLI; wall seconds, its own peak RSS and the peak RSS of its process tree."""
    with open(log, "w") as out:
        proc = psutil.Popen([str(Path(sys.executable).parent / "dagster"), *args], cwd=ROOT, env=env,
                            stdout=out, stderr=out)
        start, peak, tree = time.perf_counter(), 0, 0
        while proc.poll() is None:
            peak = max(peak, _high_water_mark(proc.pid))
            total = 0
            for p in [proc, *proc.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            tree = max(tree, total)
            time.sleep(0.1)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"dagster {' '.join(args)} failed ({proc.returncode}); see {log}:\n"
                           + log.read_text()[-3000:])
    return {"seconds": seconds, "peak_rss": peak, "tree_rss": tree}


def _env(home: str, prefix: str) -> dict[str, str]:
    os.makedirs(home, exist_ok=True)
    Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return dict(os.environ, DAGSTER_HOME=home, MARIN_PREFIX=prefix, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
                PYTHONPATH=str(ROOT))


def _jobs(defs_file: Path, shape_file: Path):
    """The demo's job (from `defs_file`) and the jobs of no-op assets of its shape, with no-op
    checks of the same names and without checks."""
    import dagster as dg
    from noop_graph import noop_definitions, selection_of, shape_of

    sys.path.insert(0, str(ROOT))
    defs = runpy.run_path(str(defs_file))["defs"]
    job = dg.define_asset_job("marin_bench", selection=selection_of(SELECTION))
    ours = dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def("marin_bench")
    shape = shape_of(defs, SELECTION)
    shape_file.write_text(json.dumps(shape))
    every = dg.define_asset_job("marin_bench", selection=dg.AssetSelection.all())
    plain = {checks: dg.Definitions.merge(noop_definitions(shape, checks), dg.Definitions(jobs=[every]))
             .resolve_job_def("marin_bench") for checks in (True, False)}
    return ours, plain[True], plain[False], len(shape)


def measure(quick: bool = False, reps: int = 5) -> list[dict]:
    import dagster as dg

    defs_file = ROOT / ("tests/support/ui_definitions.py" if quick else "definitions.py")
    label = " (test size)" if quick else ""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "outputs")
        env = _env(os.path.join(tmp, "home"), prefix)
        demo = run_cli(["asset", "materialize", "-f", str(defs_file), "--select", SELECTION], env,
                       Path(tmp, "demo.log"))
        results.append(time_ratio(f"demo end to end{label}, installed, offline ÷ the 3-minute goal",
                                  [demo["seconds"]], [180.0], at_most=None if quick else 1.0))

        os.environ.update(DAGSTER_HOME=env["DAGSTER_HOME"], MARIN_PREFIX=prefix)
        shape_file = Path(tmp, "shape.json")
        ours, plain, plain_unchecked, n_assets = _jobs(defs_file, shape_file)
        noop = run_cli(["asset", "materialize", "-f", str(BENCH / "noop_graph.py"), "--select", "*"],
                       dict(_env(os.path.join(tmp, "noop-home"), prefix), MARIN_BENCH_SHAPE=str(shape_file)),
                       Path(tmp, "noop.log"))
        memory = time_ratio(f"peak RSS of the Dagster process during the demo{label} ÷ plain Dagster "
                            f"materializing {n_assets} no-op assets (MB)",
                            [demo["peak_rss"] / 2**20], [noop["peak_rss"] / 2**20], at_most=None)
        memory["unit"] = "MB"
        memory["note"] = f"whole process tree incl. Ray workers: peak {demo['tree_rss'] / 2**20:.0f} MB"
        results.append(memory)

        os.makedirs(os.path.join(tmp, "bench-instance"))
        instance = dg.DagsterInstance.local_temp(tempdir=os.path.join(tmp, "bench-instance"))
        jobs = {"ours": ours, "plain": plain, "unchecked": plain_unchecked}
        wall: dict[str, list[float]] = {kind: [] for kind in jobs}
        cpu: dict[str, list[float]] = {kind: [] for kind in jobs}
        plain.execute_in_process(instance=instance)  # warm all three
        plain_unchecked.execute_in_process(instance=instance)
        first = ours.execute_in_process(instance=instance)
        cached = {e.materialization.metadata["cached"].value for e in first.get_asset_materialization_events()}
        assert first.success and cached == {True}, f"the demo graph was not all cached: {cached}"
        for rep in range(reps):
            order = list(jobs.items())
            for kind, job in order[rep % 3:] + order[:rep % 3]:
                start, start_cpu = time.perf_counter(), time.process_time()
                result = job.execute_in_process(instance=instance)
                wall[kind].append(time.perf_counter() - start)
                cpu[kind].append(time.process_time() - start_cpu)
                assert result.success
        instance.dispose()
    name = (f"re-materialize the all-cached demo graph{label} ({n_assets} assets) ÷ the same graph of no-op assets"
            " and no-op checks")
    results.append(time_ratio(f"{name}, wall", wall["ours"], wall["plain"], at_most=1.1))
    results.append(time_ratio(f"{name}, CPU", cpu["ours"], cpu["plain"], at_most=1.1))
    results.append(time_ratio(f"re-materialize the all-cached demo graph{label} ÷ no-op assets without checks, wall",
                              wall["ours"], wall["unchecked"], at_most=None))
    return results


if __name__ == "__main__":
    for r in measure(quick="--quick" in sys.argv, reps=2 if "--quick" in sys.argv else 5):
        print(json.dumps(r))
