"""Hello world, in the spirit of Marin's tutorial: generate numbers, then compute statistics.

Written with the same public API as the LLM steps: plain functions taking an `output_path`
(a local path or any fsspec URL such as `gs://`), and factories that return a `Step` with the
right hash_attrs and deps.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from marin_assets.core.files import open_file
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by

NUMBERS_FILE = "numbers.jsonl"


@record_type("hello_numbers")
@dataclass(frozen=True)
class Numbers:
    """How many numbers were written, and where."""

    count: int
    file: str


@record_type("hello_stats")
@dataclass(frozen=True)
class Stats:
    """Count, mean and standard deviation of the numbers."""

    count: int
    mean: float
    std: float
    min: float
    max: float


def generate_numbers(output_path: str, n: int, seed: int) -> Numbers:
    """Write `n` pseudo-random numbers (uniform in [0, 100), seeded) as JSON lines."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    rng = random.Random(seed)
    with open_file(join_path(output_path, NUMBERS_FILE), "w") as f:
        for _ in range(n):
            f.write(json.dumps({"x": rng.uniform(0, 100)}) + "\n")
    return Numbers(count=n, file=NUMBERS_FILE)


def compute_stats(input_path: str, output_path: str) -> Stats:
    """Count, mean, standard deviation, min and max of the numbers at `input_path`."""
    with open_file(join_path(input_path, NUMBERS_FILE)) as f:
        xs = [json.loads(line)["x"] for line in f if line.strip()]
    if not xs:
        raise ValueError(f"no numbers in {input_path}")
    mean = sum(xs) / len(xs)
    stats = Stats(len(xs), mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)), min(xs), max(xs))
    with open_file(join_path(output_path, "stats.json"), "w") as f:
        json.dump(stats.__dict__, f, indent=2)
    return stats


def write_report(stats: Stats, title: str, output_path: str) -> str:
    """A markdown summary of the statistics, made from the upstream step's typed result."""
    text = (f"# {title}\n\n| count | mean | std | min | max |\n|---|---|---|---|---|\n"
            f"| {stats.count} | {stats.mean:.3f} | {stats.std:.3f} | {stats.min:.3f} | {stats.max:.3f} |\n")
    with open_file(join_path(output_path, "report.md"), "w") as f:
        f.write(text)
    return text


def numbers_step(name: str, n: int, seed: int = 0) -> Step:
    """The hello-world source: `n` random numbers from `seed`.

    Identity: `n`, `seed`.
    """
    return Step(
        name=name,
        fn=lambda out: generate_numbers(out, n=n, seed=seed),
        hash_attrs={"n": n, "seed": seed},
        description=made_by(generate_numbers),
    )


def stats_step(name: str, numbers: Step) -> Step:
    """Statistics of a numbers step's output.

    Identity: `numbers`, its dependency, alone.
    """
    return Step(
        name=name,
        fn=lambda out: compute_stats(numbers.output_path, out),
        deps=[numbers],
        description=made_by(compute_stats),
    )


def report_step(name: str, stats: Step, title: str) -> Step:
    """A titled markdown report of a stats step's result.

    Identity: `title` (and `stats`, its dependency).
    """
    return Step(
        name=name,
        fn=lambda out: write_report(load_result(stats, Stats), title, out),
        deps=[stats],
        hash_attrs={"title": title},
        description=made_by(write_report),
    )
