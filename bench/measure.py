"""Rows of the benchmark page: side-by-side comparisons and absolute figures, each judged against its goal.

Two kinds of row, one dict shape (`check_row` says what a row must hold):

- a **comparison** (`compare`): ours and a reference doing the same work under the same conditions,
  measured in the same run with the order rotated; the ratio of the medians (ours ÷ reference, times
  or rates as measured) and its spread, the range of the per-repetition ratios;
- an **absolute** figure (`absolute`): ours alone, against an absolute goal ("118 s, goal ≤ 180 s"); no
  ratio, no spread. An absolute goal may sit on a comparison row too (`goal=("ours", …)`): the ratio
  is then context for the number, not the verdict.

A goal is `(on, op, value)`: on `"ratio"` or `"ours"`, op one of `<=`, `>=`, `>`. No goal: the row
reports, for information. `met` is computed here, once, from the goal; the page's table and its
verdicts are both written from it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

OPS = {"<=": (lambda a, b: a <= b, "≤"), ">=": (lambda a, b: a >= b, "≥"), ">": (lambda a, b: a > b, ">")}
Goal = tuple[str, str, float]


def significant(x: float, digits: int) -> float:
    """`x` rounded to `digits` significant digits (a ratio of 0.00514 keeps its digits)."""
    return float(f"{x:.{digits}g}")


def rotated(kinds: Sequence[str], rep: int) -> list[str]:
    """The contenders' order in repetition `rep`: each starts a repetition in turn (A B, B A for two)."""
    shift = rep % len(kinds)
    return list(kinds[shift:]) + list(kinds[:shift])


def _goal(goal: Goal | None) -> dict[str, Any] | None:
    if goal is None:
        return None
    on, op, value = goal
    if on not in ("ratio", "ours") or op not in OPS:
        raise ValueError(f"a goal is (ratio|ours, {'|'.join(OPS)}, value), not {goal!r}")
    return {"on": on, "op": op, "value": value}


def judge(row: dict[str, Any]) -> bool | None:
    """Whether the row meets its goal (None: no goal)."""
    goal = row["goal"]
    if goal is None:
        return None
    return OPS[goal["op"]][0](row[goal["on"]], goal["value"])


def compare(key: str, name: str, ours: Sequence[float], reference: Sequence[float], unit: str,
            goal: Goal | None = None, note: str | None = None, order: str = "rotated") -> dict[str, Any]:
    """ours ÷ reference, measured side by side (`ours[i]` and `reference[i]` in the same repetition)."""
    if len(ours) != len(reference) or not ours:
        raise ValueError(f"{key}: {len(ours)} samples of ours against {len(reference)} of the reference")
    ratios = [a / b for a, b in zip(ours, reference, strict=True)]
    row = {"key": key, "measure": name, "kind": "comparison", "unit": unit, "reps": len(ours),
           "ours": significant(statistics.median(ours), 5),
           "ours_range": [significant(min(ours), 5), significant(max(ours), 5)],
           "reference": significant(statistics.median(reference), 5),
           "ratio": significant(statistics.median(ours) / statistics.median(reference), 4),
           "spread": [significant(min(ratios), 3), significant(max(ratios), 3)], "goal": _goal(goal), "order": order}
    if note:
        row["note"] = note
    row["met"] = judge(row)
    return row


def absolute(key: str, name: str, ours: Sequence[float], unit: str, goal: Goal | None = None,
             note: str | None = None) -> dict[str, Any]:
    """Ours alone: the median of `ours` against an absolute goal (on `ours`), no reference, no ratio."""
    if goal is not None and goal[0] != "ours":
        raise ValueError(f"{key}: an absolute row's goal is on ours, not {goal[0]}")
    if not ours:
        raise ValueError(f"{key}: no samples")
    row = {"key": key, "measure": name, "kind": "absolute", "unit": unit, "reps": len(ours),
           "ours": significant(statistics.median(ours), 5),
           "ours_range": [significant(min(ours), 5), significant(max(ours), 5)],
           "reference": None, "ratio": None, "spread": None, "goal": _goal(goal), "order": "once"}
    if note:
        row["note"] = note
    row["met"] = judge(row)
    return row


def goal_text(row: dict[str, Any]) -> str:
    """"ratio ≥ 0.9", "≤ 180 s", or "report"."""
    goal = row["goal"]
    if goal is None:
        return "report"
    symbol = OPS[goal["op"]][1]
    if goal["on"] == "ours":
        return f"{symbol} {goal['value']:g} {row['unit']}"
    return f"ratio {symbol} {goal['value']:g}"


def check_row(row: dict[str, Any]) -> list[str]:
    """What is wrong with a row (empty: nothing): the fields the page needs, finite positive figures, a
    comparison's ratio consistent with its medians, `met` consistent with its goal."""
    problems = []
    for field in ("key", "measure", "kind", "unit", "reps", "ours", "reference", "ratio", "spread", "goal", "met"):
        if field not in row:
            problems.append(f"no {field}")
    if problems:
        return problems
    finite = [row["ours"], *row["ours_range"]]
    if row["kind"] == "comparison":
        finite += [row["reference"], row["ratio"], *row["spread"]]
        if row["reference"] and not math.isclose(row["ratio"], row["ours"] / row["reference"], rel_tol=2e-3,
                                                 abs_tol=2e-3):
            problems.append(f"ratio {row['ratio']} is not ours ÷ reference ({row['ours']} ÷ {row['reference']})")
        if not row["spread"][0] <= row["spread"][1]:
            problems.append(f"spread {row['spread']} is not a range")
    elif row["kind"] == "absolute":
        if row["ratio"] is not None or row["reference"] is not None or row["spread"] is not None:
            problems.append("an absolute row has a reference, ratio or spread")
    else:
        problems.append(f"unknown kind {row['kind']!r}")
    if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in finite):
        problems.append(f"figures not finite and positive: {finite}")
    if row["met"] != judge(row):
        problems.append(f"met {row['met']} but the goal says {judge(row)}")
    if row["reps"] < 1:
        problems.append("no repetitions")
    return problems


def in_memory_encoders(texts: Sequence[str], hf: Any, fast: Any, batch: int = 1024) -> dict[str, Any]:
    """The two in-memory references of the tokenize rows, as contenders (rep → tokens): HF `tokenizers`
    `encode_batch_fast` and fastokens `encode_batch_flat` over `texts` in batches, no special tokens."""
    import numpy as np

    def tokenizers_fast(rep: int) -> int:
        return sum(len(e.ids) for i in range(0, len(texts), batch)
                   for e in hf.encode_batch_fast(texts[i:i + batch], add_special_tokens=False))

    def fastokens_flat(rep: int) -> int:
        return sum(len(np.frombuffer(fast.encode_batch_flat(texts[i:i + batch], add_special_tokens=False)[0],
                                     dtype="<u4")) for i in range(0, len(texts), batch))

    return {"tokenizers": tokenizers_fast, "fastokens": fastokens_flat}
