"""Summaries of side-by-side measurements: ratio of medians, per-pair spread, goal."""

from __future__ import annotations

import statistics


def _summary(name: str, ours: list[float], reference: list[float], unit: str, goal: str, met: bool) -> dict:
    ratios = [a / b for a, b in zip(ours, reference, strict=True)]
    ratio = statistics.median(ours) / statistics.median(reference)
    return {"measure": name, "ratio": round(ratio, 3), "spread": [round(min(ratios), 3), round(max(ratios), 3)],
            "ours": round(statistics.median(ours), 4), "reference": round(statistics.median(reference), 4),
            "unit": unit, "reps": len(ours), "goal": goal, "met": met}


def time_ratio(name: str, ours: list[float], reference: list[float], at_most: float | None) -> dict:
    """Our time ÷ the reference's (lower is better)."""
    ratio = statistics.median(ours) / statistics.median(reference)
    goal = f"<= {at_most}" if at_most is not None else "report"
    return _summary(name, ours, reference, "s", goal, at_most is None or ratio <= at_most)


def rate_ratio(name: str, ours: list[float], reference: list[float], at_least: float, unit: str,
               strictly: bool = False) -> dict:
    """Our throughput ÷ the reference's (higher is better); `strictly`: the goal is `> at_least`."""
    ratio = statistics.median(ours) / statistics.median(reference)
    if strictly:
        return _summary(name, ours, reference, unit, f"> {at_least}", ratio > at_least)
    return _summary(name, ours, reference, unit, f">= {at_least}", ratio >= at_least)
