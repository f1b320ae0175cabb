"""The demo, measured: `make demo` end to end, the peak memory of its Dagster process, and re-materialized all cached.

(a) end to end: the commands of the Makefile's `demo` recipe, read from the Makefile (so the measure
    follows it): `dagster asset materialize` of its selection (the harness evaluation included), one
    tick of the checkpoint sensor (`marin-assets tick marin_checkpoint_evals`: every checkpoint's
    evaluation partitions) and the closing `marin-assets status`, on an empty instance and prefix,
    installed and offline — an absolute figure against the 3-minute goal.
(b) peak memory: the resident high-water mark (VmHWM) of that Dagster process ÷ the same CLI
    materializing plain no-op assets of the demo's shape (`noop_graph.py`). The work itself runs
    in Ray worker processes; the peak of the whole process tree is reported beside it.
(c) cached: the demo's job executed in process once everything exists — every asset a cache hit
    (status + record read, checks run on the output, metadata) ÷ the same graph of no-op assets
    whose checks of the same names pass without looking (and, for information, ÷ no-op assets
    without checks); the order of the three rotates every repetition; wall and CPU time.

`--quick` runs the same recipe on the demo's shape at test size (`demo_quick.py`: hello world, a tiny
corpus and model, its loss and harness evaluations, per checkpoint too), with that file's selection.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import sys
import tempfile
import time
from pathlib import Path

import psutil
from measure import absolute, compare, rotated

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
QUICK_DEFINITIONS = BENCH / "demo_quick.py"
DEMO_GOAL_S = 180.0


def is_materialize(argv: list[str]) -> bool:
    """`dagster asset materialize …` or our quiet `marin-assets materialize …`."""
    ours = Path(argv[0]).name == "marin-assets" and argv[1:2] == ["materialize"]
    return ours or argv[1:3] == ["asset", "materialize"]


def demo_recipe(makefile: Path = ROOT / "Makefile") -> list[list[str]]:
    """The commands of the Makefile's `demo` recipe (echo lines and comments left out), `$(BIN)` resolved."""
    found = re.search(r"^demo:.*\n((?:\t.*\n?)+)", makefile.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no demo target in {makefile}")
    commands = []
    for line in found.group(1).splitlines():
        line = line.strip().lstrip("@")
        if not line or line.startswith("#") or line.startswith("echo"):
            continue
        line = line.replace("$(BIN)", str(BIN))
        if "$(" in line:
            raise RuntimeError(f"the demo recipe uses a variable the benchmark does not resolve: {line}")
        commands.append(shlex.split(line))
    if not any(is_materialize(c) for c in commands):
        raise RuntimeError(f"the demo recipe materializes nothing: {commands}")
    return commands


def _option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _with_option(argv: list[str], flag: str, value: str) -> list[str]:
    if flag in argv:
        i = argv.index(flag)
        return argv[:i + 1] + [value] + argv[i + 2:]
    return [*argv, flag, value]


def demo_commands(quick: bool) -> tuple[list[list[str]], Path, str]:
    """The recipe's commands (for `quick`: on `demo_quick.py` with its selection), the definitions file and
    the selection they materialize."""
    commands = demo_recipe()
    materialize = next(c for c in commands if is_materialize(c))
    if not quick:
        return commands, ROOT / (_option(materialize, "-f") or "definitions.py"), _option(materialize, "--select") or ""
    selection = runpy.run_path(str(QUICK_DEFINITIONS), run_name="demo_quick")["SELECTION"]
    out = []
    for argv in commands:
        argv = _with_option(argv, "-f", str(QUICK_DEFINITIONS))
        if is_materialize(argv) or "status" in argv[1:2]:
            argv = _with_option(argv, "--select", selection)
        out.append(argv)
    return out, QUICK_DEFINITIONS, selection


def _high_water_mark(pid: int) -> int:
    """VmHWM of a live process, in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def run_cli(argv: list[str], env: dict[str, str], log: Path) -> dict:
    """Run a command; wall seconds, its own peak RSS and the peak RSS of its process tree."""
    with open(log, "w") as out:
        proc = psutil.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out)
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
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}); see {log}:\n" + log.read_text()[-3000:])
    return {"seconds": seconds, "peak_rss": peak, "tree_rss": tree, "output": log.read_text()}


def _env(home: str, prefix: str) -> dict[str, str]:
    """A fresh instance (the Makefile's dagster.yaml) and prefix, with the Makefile's exported settings."""
    os.makedirs(home, exist_ok=True)
    Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    return dict(os.environ, DAGSTER_HOME=home, MARIN_PREFIX=prefix, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
                RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))


def _jobs(defs_file: Path, selection: str, shape_file: Path):
    """The demo's job (from `defs_file`) and the jobs of no-op assets of its shape, with no-op
    checks of the same names and without checks."""
    import dagster as dg
    from noop_graph import noop_definitions, selection_of, shape_of

    sys.path.insert(0, str(ROOT))
    defs = runpy.run_path(str(defs_file))["defs"]
    job = dg.define_asset_job("marin_bench", selection=selection_of(selection))
    ours = dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def("marin_bench")
    shape = shape_of(defs, selection)
    shape_file.write_text(json.dumps(shape))
    every = dg.define_asset_job("marin_bench", selection=dg.AssetSelection.all())
    plain = {checks: dg.Definitions.merge(noop_definitions(shape, checks), dg.Definitions(jobs=[every]))
             .resolve_job_def("marin_bench") for checks in (True, False)}
    return ours, plain[True], plain[False], len(shape)


def _what(argv: list[str]) -> str:
    name = Path(argv[0]).name
    return f"{name} {argv[1]}" if name == "marin-assets" else f"{name} {' '.join(argv[1:3])}"


def measure(quick: bool = False, reps: int = 5) -> list[dict]:
    import dagster as dg

    commands, defs_file, selection = demo_commands(quick)
    label = " (test size: bench/demo_quick.py)" if quick else ""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "outputs")
        env = _env(os.path.join(tmp, "home"), prefix)
        ran = [(argv, run_cli(argv, env, Path(tmp, f"demo-{i}.log"))) for i, argv in enumerate(commands)]
        total = sum(r["seconds"] for _, r in ran)
        demo = next(r for argv, r in ran if is_materialize(argv))
        tick = next((r for argv, r in ran if "tick" in argv), None)
        ticked = len(re.findall(r"partition \d", tick["output"])) if tick else 0
        parts = ", ".join(f"{_what(argv)} {r['seconds']:.0f} s" for argv, r in ran)
        results.append(absolute("demo", f"`make demo` end to end{label}: the Makefile's selection (harness evaluation"
                                " included), the checkpoint tick and status, from an empty instance and prefix,"
                                " installed, offline", [total], "s",
                                goal=None if quick else ("ours", "<=", DEMO_GOAL_S),
                                note=f"{parts}; the tick ran {ticked} checkpoint evaluation run(s)"))

        os.environ.update(DAGSTER_HOME=env["DAGSTER_HOME"], MARIN_PREFIX=prefix)
        shape_file = Path(tmp, "shape.json")
        ours, plain, plain_unchecked, n_assets = _jobs(defs_file, selection, shape_file)
        noop = run_cli([str(BIN / "dagster"), "asset", "materialize", "-f", str(BENCH / "noop_graph.py"),
                        "--select", "*"],
                       dict(_env(os.path.join(tmp, "noop-home"), prefix), MARIN_BENCH_SHAPE=str(shape_file)),
                       Path(tmp, "noop.log"))
        results.append(compare("demo_memory", f"peak RSS of the Dagster process materializing the demo{label} ÷ plain"
                               f" Dagster materializing {n_assets} no-op assets of its shape, each a fresh CLI",
                               [demo["peak_rss"] / 2**20], [noop["peak_rss"] / 2**20], "MB", order="once",
                               note=f"whole process tree incl. Ray workers: peak {demo['tree_rss'] / 2**20:.0f} MB"))

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
            for kind in rotated(list(jobs), rep):
                start, start_cpu = time.perf_counter(), time.process_time()
                result = jobs[kind].execute_in_process(instance=instance)
                wall[kind].append(time.perf_counter() - start)
                cpu[kind].append(time.process_time() - start_cpu)
                assert result.success
        instance.dispose()
    name = (f"re-materialize the all-cached demo graph{label} ({n_assets} assets) ÷ the same graph of no-op assets"
            " and no-op checks, in process")
    results.append(compare("cached_wall", f"{name}, wall", wall["ours"], wall["plain"], "s",
                           goal=("ratio", "<=", 1.1)))
    results.append(compare("cached_cpu", f"{name}, CPU", cpu["ours"], cpu["plain"], "CPU s",
                           goal=("ratio", "<=", 1.1)))
    results.append(compare("cached_unchecked", f"re-materialize the all-cached demo graph{label} ÷ no-op assets without"
                           " checks, wall", wall["ours"], wall["unchecked"], "s"))
    return results


if __name__ == "__main__":
    for r in measure(quick="--quick" in sys.argv, reps=2 if "--quick" in sys.argv else 5):
        print(json.dumps(r))
