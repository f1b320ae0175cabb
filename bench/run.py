"""Run every benchmark, print the ratios and write docs/benchmarks.md.

    make bench                                   # everything (~10 min on 2 cores)
    .venv/bin/python bench/run.py --quick        # a smoke run: fewer repetitions, smaller sizes
    .venv/bin/python bench/run.py --json         # machine-readable

Every measure is a ratio against its reference, measured side by side (A B A B) in this run.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import adapter_overhead  # noqa: E402
import curation  # noqa: E402
import demo_measures  # noqa: E402
import pipeline_throughput  # noqa: E402
import ray_overhead  # noqa: E402
import real_tokenize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def benchmarks(quick: bool) -> list:
    reps = 2 if quick else None
    return [
        lambda: adapter_overhead.measure_load(reps=reps or 7),
        lambda: adapter_overhead.measure_sweep_load(n_steps=2_000 if quick else 10_000, reps=1 if quick else 3),
        lambda: demo_measures.measure(quick, reps=reps or 9),
        lambda: ray_overhead.measure(reps=reps or 7),
        lambda: pipeline_throughput.measure_tokenize(reps=reps or 5, documents=10_000 if quick else 40_000),
        lambda: real_tokenize.measure(reps=reps or 5, megabytes=10 if quick else 30),
        lambda: curation.measure(reps=reps or 3, megabytes=10 if quick else 30),
        lambda: pipeline_throughput.measure_train(reps=1 if quick else 2, steps=20 if quick else 100),
    ]


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()}, {os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, Python {platform.python_version()}"


def row(r: dict) -> str:
    met = "—" if r["goal"] == "report" else ("yes" if r["met"] else "**no**")
    extra = f" (fixed cost {r['fixed_cost_s'] * 1000:.0f} ms)" if "fixed_cost_s" in r else ""
    extra += f"; {r['note']}" if "note" in r else ""
    return (f"| {r['measure']}{extra} | {r['ratio']:.3f} | {r['spread'][0]:.2f}–{r['spread'][1]:.2f} | "
            f"{r['ours']:g} | {r['reference']:g} | {r['unit']} | {r['reps']} | {r['goal']} | {met} |")


def write_page(results: list[dict], quick: bool) -> Path:
    page = ROOT / "docs" / "benchmarks.md"
    page.parent.mkdir(exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        f"Measured by `make bench` on {_dt.date.today().isoformat()}{' (quick mode)' if quick else ''}: {machine()}.",
        "Each ratio compares ours with its reference measured side by side in the same run (A B A B,",
        "or a rotating order for three or four contenders): the ratio of the medians; the spread is the",
        "range of the per-repetition ratios. Goals marked **no** are explained, with profiles, below.",
        "",
        "| measure | ratio | spread | ours | reference | unit | reps | goal | met |",
        "|---|---|---|---|---|---|---|---|---|",
        *[row(r) for r in results],
        "",
    ]
    notes = ROOT / "bench" / "NOTES.md"
    if notes.exists():
        lines += [notes.read_text()]
    page.write_text("\n".join(lines))
    return page


def main() -> int:
    quick = "--quick" in sys.argv
    results: list[dict] = []
    for bench in benchmarks(quick):
        found = bench()
        for r in found if isinstance(found, list) else [found]:
            results.append(r)
            print(row(r), flush=True)
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))
    print(f"\nwrote {write_page(results, quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
