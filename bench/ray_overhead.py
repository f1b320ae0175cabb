"""The fixed cost of a step: through Ray warm, and a do-nothing step through the CLI cold.

(a) warm: the same step materialized (forced, so it computes every time) with its function run
    on an embedded Ray ÷ run in the Dagster process, the order rotated (A B, B A, …), for a small
    step (~20 ms of work) and a medium step (~1 s). The difference is the fixed cost: task
    submission, result transfer, the log relay.
(b) cold: `dagster asset materialize` of one do-nothing step (`noop_step.py`, marked light: it runs
    in the Dagster process) on a fresh instance and prefix, nothing running yet ÷ the same CLI
    materializing one plain Dagster no-op asset (`noop_graph.py`, Dagster's default executor);
    for information the same step unmarked, a Ray task on an embedded Ray that the run starts, with
    what its record says (its own duration, the start-up apart). The three rotate every repetition.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
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


def _cold_once(kind: str, root: str) -> dict:
    """One `dagster asset materialize` of the do-nothing step (`ours`: light; `ray`: unmarked) or of a
    plain no-op asset (`plain`), on a fresh instance and prefix under `root`: wall seconds and, for
    ours, what the record says."""
    from demo_measures import _env, run_cli

    home, prefix = os.path.join(root, "home"), os.path.join(root, "prefix")
    env = _env(home, prefix)
    if kind == "plain":
        shape = os.path.join(root, "shape.json")
        Path(shape).write_text(json.dumps([{"key": NOOP_KEY.split("/"), "deps": [], "group": "bench", "checks": []}]))
        env["MARIN_BENCH_SHAPE"], definitions = shape, BENCH / "noop_graph.py"
    else:
        env["MARIN_BENCH_PLACEMENT"], definitions = kind, BENCH / "noop_step.py"
    argv = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-f", str(definitions),
            "--select", NOOP_KEY]
    run = run_cli(argv, env, Path(root) / "log.txt")
    out = {"seconds": run["seconds"]}
    if kind != "plain":
        record = json.loads(next(Path(prefix).rglob(".artifact.json")).read_text())
        out["duration_s"], out["startup_s"] = record["duration_s"], record.get("startup_s")
        ready = re.search(r"Ray ready after ([0-9.]+) s", run["output"])
        out["ray_ready_s"] = float(ready.group(1)) if ready else 0.0
    return out


def measure_cold_step(reps: int = 5) -> list[dict]:
    """A do-nothing step through `dagster asset materialize`, cold, ÷ a plain Dagster no-op asset."""
    samples: dict[str, list[dict]] = {"ours": [], "plain": [], "ray": []}
    for rep in range(reps):
        for kind in rotated(list(samples), rep):
            with tempfile.TemporaryDirectory(prefix=f"marin-bench-{kind}-") as root:
                samples[kind].append(_cold_once(kind, root))

    def seconds(kind: str) -> list[float]:
        return [s["seconds"] for s in samples[kind]]

    def median(kind: str, field: str) -> float:
        return statistics.median(s[field] or 0.0 for s in samples[kind])

    ours = compare("step_cold_cli", "a do-nothing step (light: runs in the Dagster process) through `dagster asset"
                   " materialize`, fresh instance and prefix, nothing running ÷ a plain Dagster no-op asset through"
                   " the same CLI", seconds("ours"), seconds("plain"), "s", goal=("ratio", "<=", 1.2),
                   note=f"record: duration {median('ours', 'duration_s'):.3f} s, start-up"
                        f" {median('ours', 'startup_s'):.3f} s")
    ray = compare("step_cold_cli_ray", "the same do-nothing step unmarked (a Ray task: the run starts an embedded"
                  " Ray) ÷ the plain no-op asset, same CLI", seconds("ray"), seconds("plain"), "s",
                  note=f"record: duration {median('ray', 'duration_s'):.2f} s, start-up"
                       f" {median('ray', 'startup_s'):.2f} s; Ray ready after {median('ray', 'ray_ready_s'):.1f} s")
    return [ours, ray]
