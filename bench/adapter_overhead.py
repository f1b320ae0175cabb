"""What the step adapter costs over plain Dagster assets of the same shape.

(a) load: build the definitions of a 1000-asset graph and snapshot the repository (what a
    code server does for `dagster dev`) — steps through the adapter ÷ plain `@asset`s with
    the same keys, deps, code versions and groups. Each sample is a fresh interpreter.
(b) the load of a real 10,000-step sweep (`lr_model_sweep`: train + eval per point), against its
    absolute goal (15 s CPU), beside plain Dagster loading a graph of the same shape: no-op
    `@asset`s with the same keys, deps, groups and asset checks (`noop_graph.py`), each sample a
    fresh interpreter.
Both are measured side by side in one run, the order rotated (A B, B A, …); the ratio of medians
and the per-pair spread reported. The cached re-materialization of the demo graph is in
`demo_measures.py`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from measure import compare, rotated

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("raw", "tokenized", "checkpoints", "evals")


def graph_shape(n_assets: int) -> list[tuple[str, str | None]]:
    """(name, parent) pairs: chains raw → tokenized → checkpoints → evals."""
    chains = n_assets // len(STAGES)
    out = []
    for c in range(chains):
        parent = None
        for stage in STAGES:
            name = f"{stage}/item{c:05d}"
            out.append((name, parent))
            parent = name
    return out


def noop(output_path: str) -> None:
    os.makedirs(output_path, exist_ok=True)


def adapter_definitions(n_assets: int):
    from marin_assets import Step, build_definitions

    steps: dict[str, Step] = {}
    for name, parent in graph_shape(n_assets):
        deps = [steps[parent]] if parent else []
        steps[name] = Step(name=name, fn=noop, deps=deps, hash_attrs={"index": name, "lr": 1e-3})
    from resources import RayResource

    bench_dir = os.path.dirname(os.path.abspath(__file__))  # where `noop` lives, for the Ray workers
    return build_definitions(list(steps.values()),
                             resources={"ray": RayResource(runtime_env={"env_vars": {"PYTHONPATH": bench_dir}})})


def plain_definitions(n_assets: int):
    import hashlib

    import dagster as dg

    assets = []
    for name, parent in graph_shape(n_assets):
        version = hashlib.sha256(name.encode()).hexdigest()[:8]

        def body() -> None:
            return None

        deps = [dg.AssetKey(parent.split("/"))] if parent else []
        assets.append(dg.asset(key=dg.AssetKey(name.split("/")), deps=deps, code_version=version,
                               group_name=name.split("/")[0])(body))
    return dg.Definitions(assets=assets)


def _load_once(kind: str, n_assets: int) -> float:
    """In a fresh interpreter: CPU seconds to build the definitions and snapshot the repository.

    CPU time of this single-threaded work, not wall time: on a shared 2-core VM wall time
    swings ±30 % with steal from neighbours, CPU time far less.
    """
    import dagster  # noqa: F401  (import time is the same on both sides; not measured)
    from dagster._core.remote_representation.external_data import RepositorySnap

    import marin_assets  # noqa: F401

    start = time.process_time()
    defs = adapter_definitions(n_assets) if kind == "adapter" else plain_definitions(n_assets)
    RepositorySnap.from_def(defs.get_repository_def())
    return time.process_time() - start


def _last_line(args: list[str]) -> str:
    out = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"bench/adapter_overhead.py {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def measure_load(n_assets: int = 1000, reps: int = 7) -> dict:
    samples: dict[str, list[float]] = {"adapter": [], "plain": []}
    for rep in range(reps):
        for kind in rotated(["adapter", "plain"], rep):
            samples[kind].append(float(_last_line(["load", kind, str(n_assets)])))
    return compare("load_1000", f"load of a {n_assets}-asset graph: adapter ÷ plain @asset, fresh interpreters",
                   samples["adapter"], samples["plain"], "CPU s", goal=("ratio", "<=", 1.2))


def sweep_definitions(n_steps: int):
    """A real sweep: `lr_model_sweep` over the demo's python-docs cache, train + eval per point."""
    from marin_assets import build_definitions
    from marin_assets.experiments import python_docs
    from marin_assets.pipeline.sweeps import lr_model_sweep
    from marin_assets.pipeline.training.specs import ModelSpec

    points = n_steps // 2
    models = {f"d{d}": ModelSpec(hidden_dim=d, intermediate_dim=4 * d, num_heads=4, num_kv_heads=4)
              for d in range(32, 32 + 4 * 100, 4)}
    rates = [1e-4 * (1 + i) for i in range(points // len(models))]
    steps = lr_model_sweep("sweep", {"python-docs": python_docs.pipeline["tokenized"]}, models, rates)
    return build_definitions(steps)


def _load_sweep_once(kind: str, n_steps: int, shape_file: str) -> str:
    """In a fresh interpreter: CPU and wall seconds to build and snapshot the sweep (`ours`), or plain
    no-op assets of its shape (`plain`, read from `shape_file`), and the number of assets, space-separated.
    `ours` writes the shape for `plain` when the file does not exist yet (after the measured part)."""
    import dagster  # noqa: F401
    from dagster._core.remote_representation.external_data import RepositorySnap

    import marin_assets  # noqa: F401

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from noop_graph import noop_definitions, shape_of

    shape = None
    if kind == "plain":
        with open(shape_file) as f:
            shape = json.load(f)
    start, start_wall = time.process_time(), time.perf_counter()
    defs = sweep_definitions(n_steps) if kind == "ours" else noop_definitions(shape)
    RepositorySnap.from_def(defs.get_repository_def())
    cpu, wall = time.process_time() - start, time.perf_counter() - start_wall
    if kind == "ours":
        shape = shape_of(defs)
        if not os.path.exists(shape_file):
            with open(shape_file, "w") as f:
                json.dump(shape, f)
    return f"{cpu} {wall} {len(shape)}"


def measure_sweep_load(n_steps: int = 10_000, reps: int = 3) -> dict:
    """CPU seconds to define and snapshot a 10,000-step sweep, against the absolute goal of 15 s (scaled
    by size for a smaller sweep), beside plain Dagster loading no-op assets of the same shape."""
    import tempfile

    cpu: dict[str, list[float]] = {"ours": [], "plain": []}
    wall: dict[str, list[float]] = {"ours": [], "plain": []}
    assets = 0
    with tempfile.TemporaryDirectory() as tmp:
        shape_file = os.path.join(tmp, "shape.json")
        for rep in range(reps):  # ours first in the first repetition: it writes the shape plain loads
            for kind in rotated(["ours", "plain"], rep):
                seconds, wall_seconds, n = _last_line(["sweep", kind, str(n_steps), shape_file]).split()
                cpu[kind].append(float(seconds))
                wall[kind].append(float(wall_seconds))
                assets = int(n)
    goal = 15.0 * n_steps / 10_000
    return compare("sweep_load", f"load of a {n_steps:,}-step sweep ({assets:,} assets, train + eval per point) ÷ "
                   "plain Dagster no-op assets of the same shape and checks, fresh interpreters",
                   cpu["ours"], cpu["plain"], "CPU s", goal=("ours", "<=", goal),
                   note=f"wall {statistics.median(wall['ours']):.1f} s vs {statistics.median(wall['plain']):.1f} s")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        print(_load_once(sys.argv[2], int(sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "sweep":
        print(_load_sweep_once(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    else:
        print(json.dumps([measure_load(), measure_sweep_load()], indent=2))
