"""One do-nothing step served through marin_assets: what a step costs before it does anything.

`dagster asset materialize -f bench/noop_step.py --select bench/noop` is measured beside the same CLI
materializing one plain Dagster no-op asset (`noop_graph.py`). `MARIN_BENCH_PLACEMENT=ray` (or `local`)
serves the same function unmarked, so it runs as a Ray task — on an embedded Ray that the run starts, or
on the local Ray it joins; otherwise it is marked `light` and runs in the Dagster process (README
"Execution on Ray").
"""

from __future__ import annotations

import os

from marin_assets import Step, build_definitions
from marin_assets.core.light import light
from resources import RayResource

KEY = "bench/noop"  # ray_overhead.NOOP_KEY


def nothing(output_path: str) -> None:
    """Does nothing: the step's own work is zero."""


_BENCH = os.path.dirname(os.path.abspath(__file__))  # where `nothing` lives, for the Ray workers
defs = build_definitions(
    [Step(name=KEY, fn=nothing if os.environ.get("MARIN_BENCH_PLACEMENT") in ("ray", "local")
                 else light(nothing))],
    resources={"ray": RayResource(runtime_env={"env_vars": {"PYTHONPATH": _BENCH}})},
)
