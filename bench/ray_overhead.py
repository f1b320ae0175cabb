"""The fixed cost of a step: through Ray warm, and a do-nothing step through the CLI cold.

(a) warm: the same step materialized (forced, so it computes every time) with its function run
    on an embedded Ray ÷ run in the Dagster process, the order rotated (A B, B A, …), for a small
    step (~20 ms of work) and a medium step (~1 s). The difference is the fixed cost: task
    submission, result transfer, the log relay.
(b) cold: `dagster asset materialize` of one do-nothing step (`noop_step.py`) on a fresh instance and
    prefix ÷ the same CLI materializing one plain Dagster no-op asset (`noop_graph.py`) with the same
    executor as ours (Dagster's in-process one: checked here, not assumed). Three placements of the
    step: marked light (it runs in the Dagster process, no Ray); unmarked with nothing running (what a
    user meets by default: the run starts an embedded Ray and a worker); unmarked with a local Ray
    that `marin-assets ray start` left running (started once before the repetitions, not timed, and
    warmed by one untimed run: each run joins it and spawns its job's worker). The four rotate every
    repetition.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from measure import compare, rotated

BENCH = Path(__file__).resolve().parent
NOOP_KEY = "bench/noop"
"""The asset key of `noop_step.py`'s step and of the plain no-op asset it is compared with."""


def busy(seconds: float, output_path: str) -> dict:
    """CPU work for about `seconds`, then a small output file."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(i * i for i in range(200))
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "out.txt"), "w") as f:
        f.write(str(n))
    return {"n": n}


def measure(reps: int = 7) -> list[dict]:
    import functools

    import ray

    from marin_assets import Step
    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.materialize import materialize_step, run_in_process
    from marin_assets.execution.ray_runner import ray_runner
    from resources import RayResource

    log = logging.getLogger("bench")
    # The bench folder is not a package: tell the workers where `busy` lives.
    resource = RayResource(runtime_env={"env_vars": {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}})
    settings = LeaseSettings(heartbeat_interval=5, stale_timeout=30, poll_interval=0.1)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        resource.connect()
        try:
            on_ray = ray_runner(resource, log)
            for label, seconds in (("small (~20 ms) step", 0.02), ("medium (~1 s) step", 1.0)):
                step = Step(name=f"bench/busy-{seconds}", fn=functools.partial(busy, seconds))
                for run_fn in (on_ray, run_in_process):  # warm both paths
                    materialize_step(step, prefix=tmp, settings=settings, recompute="measured", run_fn=run_fn)
                samples: dict[str, list[float]] = {"ray": [], "local": []}
                paths = {"ray": on_ray, "local": run_in_process}
                for rep in range(reps):
                    for kind in rotated(list(paths), rep):
                        run_fn = paths[kind]
                        start = time.perf_counter()
                        materialize_step(step, prefix=tmp, settings=settings, recompute="measured", run_fn=run_fn)
                        samples[kind].append(time.perf_counter() - start)
                fixed = statistics.median(samples["ray"]) - statistics.median(samples["local"])
                out.append(compare(f"ray_{'small' if seconds < 0.5 else 'medium'}",
                                   f"{label} through warm Ray ÷ in process, both warm", samples["ray"],
                                   samples["local"], "s", note=f"fixed cost {fixed * 1000:.0f} ms"))
        finally:
            resource.shutdown()
            if ray.is_initialized():
                ray.shutdown()
    return out


def _cold_once(kind: str, root: str, local_file: Path | None = None) -> dict:
    """One `dagster asset materialize` of the do-nothing step (`ours`: light; `ray`: unmarked, embedded Ray;
    `local`: unmarked, joining the local Ray whose address file is `local_file`) or of a plain no-op asset
    (`plain`), on a fresh instance and prefix under `root`: wall seconds and, for ours, what the record says."""
    from demo_measures import _env, run_cli

    home, prefix = os.path.join(root, "home"), os.path.join(root, "prefix")
    env = _env(home, prefix)
    if kind == "plain":
        shape = os.path.join(root, "shape.json")
        Path(shape).write_text(json.dumps([{"key": NOOP_KEY.split("/"), "deps": [], "group": "bench", "checks": []}]))
        env["MARIN_BENCH_SHAPE"], definitions = shape, BENCH / "noop_graph.py"
    else:
        env["MARIN_BENCH_PLACEMENT"], definitions = kind, BENCH / "noop_step.py"
    if kind == "local":
        assert local_file is not None
        shutil.copy(local_file, home)  # a fresh instance that knows where the local Ray is
    argv = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-f", str(definitions),
            "--select", NOOP_KEY]
    run = run_cli(argv, env, Path(root) / "log.txt")
    out = {"seconds": run["seconds"]}
    if kind != "plain":
        record = json.loads(next(Path(prefix).rglob(".artifact.json")).read_text())
        out["duration_s"], out["startup_s"] = record["duration_s"], record.get("startup_s")
        ready = re.search(r"Ray ready after ([0-9.]+) s", run["output"])
        out["ray_ready_s"] = float(ready.group(1)) if ready else 0.0
        joined = "joined the local Ray at" in run["output"]
        if joined != (kind == "local"):
            raise RuntimeError(f"the {kind} run {'joined' if joined else 'did not join'} the local Ray:\n"
                               f"{run['output'][-3000:]}")
    return out


def check_same_executor() -> str:
    """The executor both sides of the cold rows run with (they must be the same): its name."""
    import runpy

    from noop_graph import noop_definitions

    ours = runpy.run_path(str(BENCH / "noop_step.py"))["defs"]
    plain = noop_definitions([{"key": NOOP_KEY.split("/"), "deps": [], "group": "bench", "checks": []}])
    names = [d.resolve_implicit_global_asset_job_def().executor_def.name for d in (ours, plain)]
    if names[0] != names[1]:
        raise RuntimeError(f"the step runs with the {names[0]} executor, the plain asset with {names[1]}")
    return names[0]


@contextlib.contextmanager
def local_ray_running(root: str) -> Iterator[Path]:
    """A local Ray (`marin-assets ray start`) for the repetitions, stopped after: its address file."""
    from marin_assets.execution import local_ray

    home = Path(root, "local-ray-home")
    home.mkdir()
    local_ray.start(home)
    try:
        yield home / local_ray.FILE_NAME
    finally:
        local_ray.stop(home)


def measure_cold_step(reps: int = 5) -> list[dict]:
    """A do-nothing step through `dagster asset materialize`, cold, ÷ a plain Dagster no-op asset, same executor."""
    executor = check_same_executor()
    samples: dict[str, list[dict]] = {"ours": [], "plain": [], "ray": [], "local": []}
    with tempfile.TemporaryDirectory(prefix="marin-bench-local-ray-") as shared, local_ray_running(shared) as file:
        with tempfile.TemporaryDirectory(prefix="marin-bench-warm-") as root:
            _cold_once("local", root, file)  # the local Ray's first job is not what later runs meet
        for rep in range(reps):
            for kind in rotated(list(samples), rep):
                with tempfile.TemporaryDirectory(prefix=f"marin-bench-{kind}-") as root:
                    samples[kind].append(_cold_once(kind, root, file))

    def seconds(kind: str) -> list[float]:
        return [s["seconds"] for s in samples[kind]]

    def median(kind: str, field: str) -> float:
        return statistics.median(s[field] or 0.0 for s in samples[kind])

    def record(kind: str, digits: int, startup: str = "start-up") -> str:
        """The medians the step's records hold: its own work and its start-up, apart."""
        return (f"record: duration {median(kind, 'duration_s'):.{digits}f} s, {startup}"
                f" {median(kind, 'startup_s'):.{digits}f} s")

    same = f"a plain Dagster no-op asset through the same CLI and executor ({executor})"
    ours = compare("step_cold_cli", "a do-nothing step (light: runs in the Dagster process) through `dagster asset"
                   f" materialize`, fresh instance and prefix, nothing running ÷ {same}", seconds("ours"),
                   seconds("plain"), "s", goal=("ratio", "<=", 1.2), note=record("ours", 3))
    ray = compare("step_cold_cli_ray", "the same do-nothing step unmarked, as a user meets it by default (a Ray"
                  f" task; nothing running: the run starts an embedded Ray and a worker) ÷ {same}", seconds("ray"),
                  seconds("plain"), "s", goal=("ratio", "<=", 1.5),
                  note=f"{record('ray', 2)}; Ray ready after {median('ray', 'ray_ready_s'):.1f} s")
    local = compare("step_cold_cli_local", "the same do-nothing step unmarked, a local Ray left running by"
                    f" `marin-assets ray start` (the run joins it and spawns its worker) ÷ {same}", seconds("local"),
                    seconds("plain"), "s", goal=("ratio", "<=", 1.5),
                    note=f"{record('local', 2, 'start-up (join + worker)')}; joined after"
                         f" {median('local', 'ray_ready_s'):.2f} s")
    reused = compare("step_cold_cli_local_vs_embedded", "the unmarked step joining a local Ray ÷ starting an embedded"
                     " one: what `marin-assets ray start` saves a run", seconds("local"), seconds("ray"), "s")
    return [ours, ray, local, reused]
