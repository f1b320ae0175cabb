"""The fixed cost a step pays for going through Ray, warm.

The same step materialized (forced, so it computes every time) with its function run on
an embedded Ray ÷ run in the Dagster process, the order rotated (A B, B A, …), for a small step (~20 ms of work) and
a medium step (~1 s). The difference is the fixed cost: task submission, result transfer,
the log relay.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time

from measure import compare, rotated


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
