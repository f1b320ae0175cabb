"""Run every benchmark, print each row, and write the benchmark page from this run's results alone.

    make bench                                   # everything (~25 min on 2 cores): writes docs/benchmarks.md
    .venv/bin/python bench/run.py --quick        # a smoke run (~5 min): fewer repetitions, smaller sizes;
                                                 # its page goes to $TMPDIR/marin-bench-quick.md, never docs/
    .venv/bin/python bench/run.py --only load,tokenize   # some groups (names: GROUPS); page only with --page
    options: --page PATH (where the page goes), --results PATH (the rows as JSON), --json (print them),
             --quiet-load L (default 0.5), --wait-quiet S (default 900; quick: 0): before measuring, wait up to
             S seconds, polling, for the 1-minute load average to fall below L; a run that starts above it
             says so in the page's header ("not quiet: load X at start") instead of calling itself quiet

Every row is a side-by-side comparison (ours ÷ a reference doing the same work under the same conditions,
measured in this run, the order rotated) or an absolute figure against an absolute goal (`measure.py`).
The page — table, verdicts, profiles of the missed goals, how each measure is taken — is generated from
this run's rows: the verdicts from the same `met` as the table, the method text from bench/METHODS.md,
a missed goal's profile from bench/PROFILES.md (only for goals this run missed).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import adapter_overhead  # noqa: E402
import curation  # noqa: E402
import demo_measures  # noqa: E402
import generation  # noqa: E402
import pipeline_throughput  # noqa: E402
import ray_overhead  # noqa: E402
import real_tokenize  # noqa: E402
from measure import check_row, goal_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
PAGE = ROOT / "docs" / "benchmarks.md"
QUIET_LOAD = 0.5
"""A run is quiet when the 1-minute load average is below this as it starts (2 cores: a quarter of them busy)."""
QUIET_WAIT_S = 900.0
"""How long a full run waits for the machine to become quiet before it measures anyway (and says so)."""
GROUPS = ("load", "sweep", "demo", "ray", "step", "tokenize", "real_tokenize", "curation", "train", "generation")


def benchmarks(quick: bool) -> dict[str, Callable[[], dict | list[dict]]]:
    """The groups of measures, in the order they run; quick: fewer repetitions, smaller sizes."""
    reps = 2 if quick else None
    return {
        "load": lambda: adapter_overhead.measure_load(reps=reps or 7),
        "sweep": lambda: adapter_overhead.measure_sweep_load(n_steps=2_000 if quick else 10_000,
                                                             reps=1 if quick else 3),
        "demo": lambda: demo_measures.measure(quick, reps=reps or 9),
        "ray": lambda: ray_overhead.measure(reps=reps or 7),
        "step": lambda: ray_overhead.measure_cold_step(reps=reps or 5),
        "tokenize": lambda: pipeline_throughput.measure_tokenize(reps=reps or 5, documents=5_000 if quick else 40_000),
        "real_tokenize": lambda: real_tokenize.measure(reps=reps or 5, megabytes=10 if quick else 30,
                                                       fallback_reps=1 if quick else None),
        "curation": lambda: curation.measure(reps=reps or 3, megabytes=10 if quick else 30),
        "train": lambda: pipeline_throughput.measure_train(reps=1 if quick else 4, steps=20 if quick else 100,
                                                           documents=5_000 if quick else 20_000),
        "generation": lambda: [*generation.measure(reps=reps or 5), generation.measure_step(reps=reps or 3)],
    }


@dataclass(frozen=True)
class Start:
    """How quiet the machine was when the measuring began."""

    load: float
    """The 1-minute load average then."""
    threshold: float
    waited_s: float
    """How long the run waited for the load to fall below `threshold` first."""

    @property
    def quiet(self) -> bool:
        return self.load < self.threshold

    def text(self) -> str:
        """The page header's words for it: quiet only when the load was below the threshold."""
        waited = f" after waiting {self.waited_s:.0f} s" if self.waited_s >= 1 else ""
        if self.quiet:
            return f"quiet: load average {self.load:.2f} when it started (below {self.threshold:g}{waited})"
        return (f"**not quiet: load {self.load:.2f} at start** (above {self.threshold:g}"
                f"{waited or ' and no wait allowed'}: other work shared the cores, figures may be disturbed)")


def wait_for_quiet(threshold: float, max_wait_s: float, poll_s: float = 10.0,
                   load: Callable[[], float] = lambda: os.getloadavg()[0],
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Start:
    """Poll the load average until it is below `threshold` or `max_wait_s` has passed; how it stood then."""
    began = clock()
    now = load()
    while now >= threshold and clock() - began < max_wait_s:
        print(f"waiting for a quiet machine: load average {now:.2f} ≥ {threshold:g}"
              f" ({clock() - began:.0f} of at most {max_wait_s:.0f} s)", file=sys.stderr, flush=True)
        sleep(min(poll_s, max(max_wait_s - (clock() - began), 0.0)))
        now = load()
    return Start(now, threshold, clock() - began)


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()}, {os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, Python {platform.python_version()}"


def number(x: float | None) -> str:
    if x is None:
        return "—"
    if abs(x) >= 10_000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def ratio_text(x: float, decimals: int = 3) -> str:
    """A ratio: `decimals` decimals, or 3 significant digits below 0.1 (0.00514, not 0.005)."""
    return f"{x:.{decimals}f}" if abs(x) >= 0.1 else f"{x:.3g}"


def met_text(r: dict) -> str:
    return "—" if r["met"] is None else ("yes" if r["met"] else "**no**")


def row(r: dict) -> str:
    """One table row."""
    note = f"; {r['note']}" if r.get("note") else ""
    ratio = "—" if r["ratio"] is None else ratio_text(r["ratio"])
    spread = "—" if r["spread"] is None else f"{ratio_text(r['spread'][0], 2)}–{ratio_text(r['spread'][1], 2)}"
    return (f"| {r['measure']}{note} | {number(r['ours'])} | {number(r['reference'])} | {ratio} | {spread} | "
            f"{r['unit']} | {r['reps']} | {goal_text(r)} | {met_text(r)} |")


def verdict(r: dict) -> str:
    """One line of prose for a row, from the same figures as its table row."""
    if r["goal"] is None:
        figure = f"ratio {ratio_text(r['ratio'])}" if r["ratio"] is not None else f"{number(r['ours'])} {r['unit']}"
        return f"- {r['measure']}: {figure} (for information, no goal)."
    on_ours = r["goal"]["on"] == "ours"
    figure = f"{number(r['ours'])} {r['unit']}" if on_ours else f"ratio {ratio_text(r['ratio'])}"
    context = f" (ratio {ratio_text(r['ratio'])} against its reference)" if on_ours and r["ratio"] is not None else ""
    return f"- **{'met' if r['met'] else 'missed'}**: {r['measure']}: {figure}{context}, goal {goal_text(r)}."


def profiles(text: str) -> dict[str, str]:
    """bench/PROFILES.md's sections: `## key` → its text."""
    sections: dict[str, str] = {}
    for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        key, _, body = part.partition("\n")
        sections[key.strip()] = body.strip()
    return sections


def problems_of(results: list[dict]) -> list[str]:
    """Every row's problems (`measure.check_row`) and duplicate keys."""
    found = [f"{r.get('key', r.get('measure'))}: {p}" for r in results for p in check_row(r)]
    keys = [r.get("key") for r in results]
    found += [f"{k}: two rows have this key" for k in sorted({k for k in keys if keys.count(k) > 1})]
    return found


def page_text(results: list[dict], quick: bool, seconds: float, start: Start, groups: list[str]) -> str:
    """The whole page, from this run's rows."""
    goals = [r for r in results if r["goal"] is not None]
    missed = [r for r in goals if not r["met"]]
    notes = profiles((BENCH / "PROFILES.md").read_text()) if (BENCH / "PROFILES.md").exists() else {}
    mode = "`bench/run.py --quick` (a smoke run: not for judging goals)" if quick else "`make bench`"
    partial = "" if list(groups) == list(GROUPS) else f" Groups measured: {', '.join(groups)} (not all)."
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by bench/run.py from one run; edit bench/METHODS.md or bench/PROFILES.md, not this file. -->",
        "",
        f"One run of {mode} on {_dt.date.today().isoformat()}, {seconds / 60:.1f} minutes: {machine()};"
        f" {start.text()}.{partial}",
        "Every figure below comes from that run. A **comparison** row divides ours by a reference doing the same",
        "work under the same conditions, measured side by side in the run, the order rotated each repetition:",
        "the ratio of the medians, and its spread, the range of the per-repetition ratios. An **absolute** row",
        "(ratio —) is our own figure against an absolute goal. A goal on `ours` judges the figure itself; the",
        "ratio beside it is context. `report`: no goal, for information. The row says what is compared, warm or",
        "cold, and where it runs.",
        "",
        "| measure | ours | reference | ratio | spread | unit | reps | goal | met |",
        "|---|---|---|---|---|---|---|---|---|",
        *[row(r) for r in results],
        "",
        "## Verdicts",
        "",
        f"Generated from the table: {len(goals)} goals, {len(goals) - len(missed)} met, {len(missed)} missed.",
        "",
        *[verdict(r) for r in goals],
        "",
        "For information (no goal):",
        "",
        *[verdict(r) for r in results if r["goal"] is None],
        "",
    ]
    if missed:
        lines += ["## Profiles of the missed goals", "",
                  "Where each missed goal's time goes (from bench/PROFILES.md: profiles taken by hand, with their"
                  " own numbers and dates; the verdicts above are this run's).", ""]
        for r in missed:
            lines += [f"### {r['measure']}", "",
                      notes.get(r["key"], "No profile recorded for this goal yet (add one to bench/PROFILES.md"
                                          f" under `## {r['key']}`)."), ""]
    methods = (BENCH / "METHODS.md").read_text().strip()
    lines += [methods, ""]
    return "\n".join(lines)


def write_page(results: list[dict], path: Path, quick: bool, seconds: float, start: Start,
               groups: list[str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page_text(results, quick, seconds, start, groups or list(GROUPS)))
    return path


def _argument(flag: str) -> str | None:
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None


def main() -> int:
    quick = "--quick" in sys.argv
    chosen = (_argument("--only") or ",".join(GROUPS)).split(",")
    unknown = sorted(set(chosen) - set(GROUPS))
    if unknown:
        raise SystemExit(f"unknown groups {unknown}; choose from {', '.join(GROUPS)}")
    page = _argument("--page")
    if page is None and quick:
        page = os.path.join(tempfile.gettempdir(), "marin-bench-quick.md")
    elif page is None and chosen == list(GROUPS):
        page = str(PAGE)
    threshold = float(_argument("--quiet-load") or QUIET_LOAD)
    start = wait_for_quiet(threshold, float(_argument("--wait-quiet") or (0 if quick else QUIET_WAIT_S)))
    if not start.quiet:
        print(f"warning: load average {start.load:.2f} at start (after waiting {start.waited_s:.0f} s): the machine"
              " is not quiet, and the page will say so", file=sys.stderr)
    started = time.monotonic()
    results: list[dict] = []
    for name, bench in benchmarks(quick).items():
        if name not in chosen:
            continue
        group_started = time.monotonic()
        found = bench()
        for r in found if isinstance(found, list) else [found]:
            results.append(r)
            print(row(r), flush=True)
        print(f"# {name}: {time.monotonic() - group_started:.0f} s", flush=True)
    seconds = time.monotonic() - started
    print(f"# all: {seconds:.0f} s")
    problems = problems_of(results)
    if _argument("--results"):
        Path(_argument("--results")).write_text(json.dumps(results, indent=2))
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))
    if problems:
        print("rows with problems (page not written):\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if page:
        print(f"wrote {write_page(results, Path(page), quick, seconds, start, chosen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
