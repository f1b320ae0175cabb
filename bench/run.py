"""Run every benchmark and print its ratios, measured side by side in this one run.

    make bench            # or: .venv/bin/python bench/run.py [--json]
"""

from __future__ import annotations

import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import adapter_overhead  # noqa: E402
import ray_overhead  # noqa: E402

BENCHMARKS = [adapter_overhead.measure_load, adapter_overhead.measure_cached_materialize, ray_overhead.measure]


def main() -> int:
    results = []
    for bench in BENCHMARKS:
        found = bench()
        results.extend(found if isinstance(found, list) else [found])
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))
        return 0
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{'measure':<60} {'ratio':>6}  {'spread':<15} {'ours s':>8} {'ref s':>8}  goal     met")
    for r in results:
        spread = f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f}"
        met = "-" if r["goal"] == "report" else ("yes" if r["met"] else "NO")
        extra = f"  (fixed cost {r['fixed_cost_s'] * 1000:.0f} ms)" if "fixed_cost_s" in r else ""
        print(f"{r['measure']:<60} {r['ratio']:>6.3f}  {spread:<15} {r['ours_median_s']:>8.3f} "
              f"{r['reference_median_s']:>8.3f}  {r['goal']:<8} {met}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
