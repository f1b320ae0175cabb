"""What the UI shows of a materialization: the record turned into Dagster metadata.

Always: the output path (as a path), hash and hash_attrs, cached or computed, durations,
provenance. From the step's result, by shape, with no per-step code: numbers and text
(nested ones as `result.a.b`) become metadata values Dagster can plot across runs; a mapping
of names to mappings of numbers (per-split statistics, per-set losses) becomes a table; a
list of records (downloaded files) becomes a table; a `*_curve` list of `[step, value]`
pairs becomes a line plot and a table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import dagster as dg

from marin_assets.core.materialize import StepOutcome
from marin_assets.dagster.plots import line_plot_markdown

MAX_TABLE_ROWS = 200


def outcome_metadata(outcome: StepOutcome) -> dict[str, Any]:
    record = outcome.record
    metadata: dict[str, Any] = {
        "output_path": dg.MetadataValue.path(outcome.output_path),
        "hash": record.hash,
        "cached": outcome.cached,
        "duration_s": round(outcome.duration_s, 3),
        "compute_s": record.duration_s,
        "hash_attrs": dg.MetadataValue.json(record.hash_attrs),
        "deps": dg.MetadataValue.json(record.deps),
        "computed_by_run": record.provenance.run_id or "",
        "git_commit": record.provenance.git_commit or "",
    }
    if record.content_version is not None:
        metadata["content_version"] = record.content_version
    if outcome.waited_s >= 0.5:
        metadata["waited_s"] = round(outcome.waited_s, 3)
    if outcome.took_over:
        metadata["took_over"] = outcome.took_over
    metadata.update(result_metadata(record.result))
    return metadata


def result_metadata(result: Any) -> dict[str, Any]:
    """Metadata entries for a step's result (JSON), by shape."""
    if result is None:
        return {}
    if not isinstance(result, (dict, list)):
        return {"result": result}  # a number or text, shown (and plotted) as itself
    out: dict[str, Any] = {"result": dg.MetadataValue.json(result)}
    if isinstance(result, dict):
        for key, value in result.items():
            out.update(_entries(f"result.{key}", key, value))
    return out


def _entries(label: str, key: str, value: Any, depth: int = 0) -> dict[str, Any]:
    if _is_scalar(value):
        return {label: value}
    if key.endswith("curve") and _is_curve(value):
        name = key.replace("_", " ")
        return {label: dg.MetadataValue.md(line_plot_markdown(value, title=name)),
                f"{label}_table": table([{"step": x, "value": y} for x, y in value])}
    if isinstance(value, Mapping) and value and all(isinstance(v, Mapping) for v in value.values()):
        rows = [{"name": name, **{k: v for k, v in row.items() if _is_scalar(v)}} for name, row in value.items()]
        return {label: table(rows)}
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        out: dict[str, Any] = {label: table([{k: v for k, v in row.items() if _is_scalar(v)} for row in value])}
        out[f"{label}.count"] = len(value)
        return out
    if isinstance(value, Mapping) and depth < 2:
        out = {}
        for k, v in value.items():
            out.update(_entries(f"{label}.{k}", str(k), v, depth + 1))
        return out
    if isinstance(value, list) and all(_is_scalar(v) for v in value) and len(value) <= 50:
        return {label: ", ".join(str(v) for v in value)}
    return {}


def table(rows: list[Mapping[str, Any]]) -> dg.TableMetadataValue:
    """A Dagster table of `rows` (the first `MAX_TABLE_ROWS`), columns in first-seen order."""
    rows = list(rows)[:MAX_TABLE_ROWS]
    columns: dict[str, str] = {}
    for row in rows:
        for name, value in row.items():
            kind = "float" if isinstance(value, float) else "int" if isinstance(value, int) and not isinstance(
                value, bool) else "bool" if isinstance(value, bool) else "string"
            columns.setdefault(name, kind)
    return dg.MetadataValue.table([dg.TableRecord({k: v for k, v in r.items() if v is not None}) for r in rows],
                                  schema=dg.TableSchema([dg.TableColumn(n, t) for n, t in columns.items()]))


def _is_scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (bool, int, str))


def _is_curve(value: Any) -> bool:
    return (isinstance(value, list) and len(value) >= 2
            and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, (int, float)) for x in p) for p in value))
