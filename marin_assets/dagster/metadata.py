"""What the UI shows of a materialization: the record turned into Dagster metadata.

Always: the output path (as a path), hash and hash_attrs, cached or computed, durations,
provenance. From the step's result, by shape, with no per-step code: numbers and text
(nested ones as `result.a.b`) become metadata values Dagster can plot across runs; a mapping
of names to mappings of numbers (per-split statistics, per-set losses) becomes a table; a
list of records (downloaded files) becomes a table; a `*_curve` list of `[step, value]`
pairs becomes a line plot and a table; a plot of several series (a title, `log_x` and `series`) an
inline plot of them.

Building it never fails: the step's output has already succeeded, and a result that cannot be
shown must not fail this run and every later one (a cache hit shows the same result). Any JSON
is made into what Dagster and its UI take: a table column holds one type (a mixed one becomes
text, a list or mapping in a cell its JSON), JSON and cells parse strictly in the browser (NaN
becomes "NaN"), and sizes are bounded — cut, with a `…_note` entry saying how much was left
out. An entry that still cannot be built is shown as JSON, failing that as a text saying why.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard, cast

import dagster as dg

from marin_assets.core.materialize import StepOutcome
from marin_assets.core.record import RECORD_FILE
from marin_assets.dagster.plots import (
    downsample,
    finite_points,
    is_series_plot,
    line_plot_markdown,
    series_plot_markdown,
)

MAX_TABLE_ROWS = 200
MAX_TABLE_COLUMNS = 50
MAX_CELL_CHARS = 200
MAX_TEXT_CHARS = 2_000
MAX_LIST_ITEMS = 50
"""A list of plain values is shown as text of its first items."""
MAX_JSON_CHARS = 50_000
"""A JSON entry (the whole `result`) is cut to this size; the record keeps all of it."""
MAX_ENTRIES = 100
"""Entries made from one result (more keys are in its JSON only)."""
MAX_LABEL_CHARS = 60
"""Per key in a label or column name."""
MAX_DEPTH = 2
"""Levels of nested mappings shown as `result.a.b` entries; deeper ones as JSON."""
MAX_JSON_DEPTH = 16
"""Deeper JSON is cut (Dagster serializes metadata recursively)."""
WHOLE_RESULT = f"; the whole result is in {RECORD_FILE} under output_path"


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
    if record.prediction:
        metadata.update(prediction_metadata(record.prediction))
    metadata.update(result_metadata(record.result))
    return metadata


def prediction_metadata(compared: Mapping[str, Any]) -> dict[str, Any]:
    """The record's predicted-vs-actual (`core/pricing.py`): predicted seconds, the error in words, and the whole
    comparison as JSON, so a prediction can be trusted or corrected where its result is seen."""
    predicted, actual = compared.get("predicted") or {}, compared.get("actual") or {}
    error = compared.get("error") or {}
    wall, took, off = predicted.get("wall_s"), actual.get("wall_s"), error.get("wall_s")
    words = (f"{off:+.0%} wall time: predicted {wall:.3g} s, took {took:.3g} s ({predicted.get('basis')})"
             if off is not None else f"no wall-time prediction ({predicted.get('how', 'unknown')})")
    shown: dict[str, Any] = {"prediction_error": words, "prediction_basis": str(predicted.get("basis"))}
    if wall is not None:
        shown["predicted_compute_s"] = round(float(wall), 3)
    if off is not None:
        shown["prediction_error_wall"] = round(float(off), 4)
    shown["predicted_vs_actual"] = dg.MetadataValue.json(dict(compared))
    return shown


def metadata_or_error(label: str, make: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
    """`make()`'s entries, or a `<label>_error` text saying why there are none: a bug in turning a
    result (or a partition's summary) into metadata must not fail the materialization."""
    try:
        return dict(make())
    except Exception as e:  # noqa: BLE001 - whatever it is, the output stands
        return {f"{label}_error": _why("could not be shown", e)}


def safe_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Each entry as Dagster will record it — normalized, serializable, JSON strict and bounded — or
    a text saying why it could not be, so that no single entry fails the materialization."""
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        label = key if isinstance(key, str) else _part(key)
        try:
            normalized = dg.AssetMaterialization("_", metadata={label: value}).metadata[label]  # as Dagster takes it
            if isinstance(normalized, dg.JsonMetadataValue):
                normalized, note = _json_value(normalized.data, whole="")
                if note and f"{label}_note" not in metadata:
                    out[f"{label}_note"] = note
            dg.serialize_value(cast(Any, normalized))  # what storing the event will do
            out[label] = normalized
        except Exception as e:  # noqa: BLE001
            out[label] = dg.MetadataValue.text(_why("could not be recorded", e))
    return out


def result_metadata(result: Any) -> dict[str, Any]:
    """Metadata entries for a step's result (JSON), by shape; never raises."""
    return metadata_or_error("result", lambda: _result_entries(result))


def _result_entries(result: Any) -> dict[str, Any]:
    if result is None:
        return {}
    if not isinstance(result, (Mapping, list)):
        return _shown("result", "result", result)  # a number or text, shown (and plotted) as itself
    value, note = _json_value(result)
    out: dict[str, Any] = {"result": value}
    notes = [note] if note else []
    if isinstance(result, Mapping):
        items = list(result.items())
        for i, (key, item) in enumerate(items):
            if len(out) >= MAX_ENTRIES:
                notes.append(f"{len(items) - i:,} of {len(items):,} keys are not shown as entries (see the JSON)")
                break
            out.update(_shown(f"result.{_part(key)}", key, item, room=MAX_ENTRIES - len(out)))
    elif result and (all(isinstance(v, Mapping) for v in result) or all(_is_plain(v) for v in result)):
        out.update(_shown("result.items", "items", result))
    if notes:
        out["result_note"] = "; ".join(notes)
    return out


def _shown(label: str, key: Any, value: Any, depth: int = 0, room: int = MAX_ENTRIES) -> dict[str, Any]:
    """Entries for `value` by shape; as JSON if that fails, as text saying why if even that does."""
    try:
        return _entries(label, key, value, depth, room)
    except Exception as e:  # noqa: BLE001
        try:
            return json_entries(label, value)
        except Exception as e2:  # noqa: BLE001
            return {label: _why(f"could not be shown ({type(e).__name__}: {e}), nor as JSON", e2)}


def _entries(label: str, key: Any, value: Any, depth: int, room: int) -> dict[str, Any]:
    if value is None or isinstance(value, (bool, int, float)):
        return {label: value}  # NaN and inf too: Dagster shows them ("nan") and plots the rest
    if isinstance(value, str):
        if str(key).endswith("_markdown"):  # a result's own rendering (the worst documents, a preview)
            return {label: dg.MetadataValue.md(_cut(value, MAX_TEXT_CHARS))}
        if str(key).endswith("_path"):  # a file the step wrote (an HTML view, a table): the UI offers to copy it
            return {label: dg.MetadataValue.path(value)}
        return {label: _cut(value, MAX_TEXT_CHARS)}
    if not isinstance(value, (Mapping, list)) or not value:
        return json_entries(label, value)  # empty: shown, so that the key is seen
    if str(key).endswith("curve") and _is_pairs(value):
        return _curve_entries(label, str(key), value)
    if is_series_plot(value):  # several series on one plot (an experiment summary's)
        return {label: dg.MetadataValue.md(series_plot_markdown(value))}
    if isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values()):
        return table_entries(label, ({"name": name, **row} for name, row in value.items()), len(value))
    if isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
        return {**table_entries(label, value, len(value)), f"{label}.count": len(value)}
    if isinstance(value, Mapping) and depth < MAX_DEPTH:
        out: dict[str, Any] = {}
        items = list(value.items())
        for i, (k, v) in enumerate(items):
            if len(out) >= room:
                out[f"{label}_note"] = f"{len(items) - i:,} of {len(items):,} keys are not shown as entries"
                break
            out.update(_shown(f"{label}.{_part(k)}", k, v, depth + 1, room - len(out)))
        return out
    if isinstance(value, list) and all(_is_plain(v) for v in value):
        text = ", ".join(_text_of(v) for v in value[:MAX_LIST_ITEMS])
        if len(value) > MAX_LIST_ITEMS:
            text += f", … ({len(value) - MAX_LIST_ITEMS:,} more)"
        return {label: _cut(text, MAX_TEXT_CHARS)}
    return json_entries(label, value)


def _curve_entries(label: str, key: str, points: list[Any]) -> dict[str, Any]:
    """A plot of the points that are pairs of finite numbers, and a table of all (evenly spaced)."""
    plotted = finite_points(points)
    out: dict[str, Any] = {
        label: dg.MetadataValue.md(line_plot_markdown(plotted, title=key.replace("_", " "))) if plotted
        else f"nothing to plot: none of the {len(points):,} points is a pair of finite numbers"}
    shown = downsample(points, MAX_TABLE_ROWS)
    out[f"{label}_table"] = table([{"step": x, "value": y} for x, y in shown])
    notes = []
    if plotted and len(plotted) < len(points):
        notes.append(f"{len(points) - len(plotted):,} of {len(points):,} points are not pairs of finite numbers"
                     " and are not plotted")
    if len(shown) < len(points):
        notes.append(f"the table shows {len(shown)} of {len(points):,} points, evenly spaced")
    if notes:
        out[f"{label}_note"] = "; ".join(notes)
    return out


def table_entries(label: str, rows: Iterable[Mapping[str, Any]], total: int) -> dict[str, Any]:
    """A table of the first `MAX_TABLE_ROWS` of `total` rows, and a note of what it leaves out."""
    shown = list(itertools.islice(rows, MAX_TABLE_ROWS))
    out: dict[str, Any] = {label: table(shown)}
    notes = []
    if total > len(shown):
        notes.append(f"showing the first {len(shown):,} of {total:,} rows")
    columns = len(_column_names(shown))
    if columns > MAX_TABLE_COLUMNS:
        notes.append(f"showing {MAX_TABLE_COLUMNS} of {columns:,} columns")
    if notes:
        out[f"{label}_note"] = "; ".join(notes)
    return out


def table(rows: Iterable[Mapping[str, Any]]) -> dg.TableMetadataValue:
    """A Dagster table of `rows` (the first `MAX_TABLE_ROWS`), columns in first-seen order.

    Every record has every column (None where a row lacks it, as Dagster requires), and each
    column one type: bool, int, float (ints and floats), else string with each value as text."""
    rows = [{_part(k): v for k, v in row.items()} for row in itertools.islice(rows, MAX_TABLE_ROWS)]
    names = _column_names(rows)[:MAX_TABLE_COLUMNS]
    columns = {name: [_cell(row.get(name)) for row in rows] for name in names}
    types = {name: _column_type(values) for name, values in columns.items()}
    for name, values in columns.items():
        if types[name] == "string":
            columns[name] = [v if v is None or isinstance(v, str) else _text_of(v) for v in values]
    records = [dg.TableRecord({name: columns[name][i] for name in names}) for i in range(len(rows))]
    return dg.MetadataValue.table(records, schema=dg.TableSchema([dg.TableColumn(n, types[n]) for n in names]))


def json_entries(label: str, value: Any) -> dict[str, Any]:
    """`value` as a JSON entry, strict and bounded, with a note when it had to be cut."""
    shown, note = _json_value(value)
    return {label: shown, f"{label}_note": note} if note else {label: shown}


def _json_value(value: Any, whole: str = WHOLE_RESULT) -> tuple[dg.MetadataValue, str | None]:
    """`value` as strict JSON (NaN as "NaN": the browser cannot parse NaN) of at most `MAX_JSON_CHARS`,
    cut further and further until it fits; the note says what it was when it was cut."""
    try:
        size: int | None = len(json.dumps(value))
    except (TypeError, ValueError, RecursionError):  # not JSON (only from callers other than a record)
        size = None
    levels = [(50, 1_000, 5_000), (10, 200, 1_000), (3, 50, 200)]
    if size is not None and size <= MAX_JSON_CHARS:
        levels.insert(0, (sys.maxsize, sys.maxsize, sys.maxsize))  # small: only made strict (and not too deep)
    what = f"{size:,} characters of JSON" if size is not None else "not JSON"
    for items, chars, nodes in levels:
        pruner = _Pruner(items, chars, nodes)
        data = pruner(value)
        text = json.dumps(data)
        if len(text) <= MAX_JSON_CHARS:
            if not pruner.cut:
                return _as_json(data), None
            how = (f"lists and mappings to their first {items} entries, strings to {chars} characters"
                   if items < sys.maxsize else f"below {MAX_JSON_DEPTH} levels")
            return _as_json(data), f"{what}, cut to {len(text):,} ({how}){whole}"
    return dg.MetadataValue.text(_cut(text, MAX_TEXT_CHARS)), f"{what}, too large to show as JSON{whole}"


def _as_json(data: Any) -> dg.MetadataValue:
    return dg.MetadataValue.json(data) if isinstance(data, (Mapping, list)) else dg.MetadataValue.text(
        _cut(json.dumps(data), MAX_TEXT_CHARS))


class _Pruner:
    """A strict-JSON copy of a value within bounds: lists and mappings cut to `items` entries,
    strings to `chars` characters, at most `nodes` values and `MAX_JSON_DEPTH` levels; each cut
    says what it left out, and `cut` tells whether there was one."""

    def __init__(self, items: int, chars: int, nodes: int) -> None:
        self.items, self.chars, self.nodes, self.cut = items, chars, nodes, False

    def __call__(self, value: Any, depth: int = 0) -> Any:
        self.nodes -= 1
        if self.nodes < 0 or depth > MAX_JSON_DEPTH:
            self.cut = True
            return "…"
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else _text_of(value)
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for i, (k, v) in enumerate(value.items()):
                if i >= self.items or self.nodes <= 0:
                    self.cut, out["…"] = True, f"{len(value) - i:,} more keys"
                    break
                out[self._text(str(k))] = self(v, depth + 1)
            return out
        if isinstance(value, (list, tuple)):
            items = []
            for i, v in enumerate(value):
                if i >= self.items or self.nodes <= 0:
                    self.cut = True
                    items.append(f"… {len(value) - i:,} more items")
                    break
                items.append(self(v, depth + 1))
            return items
        return self._text(repr(value))

    def _text(self, text: str) -> str:
        if len(text) > self.chars:
            self.cut = True
        return _cut(text, self.chars)


def _cell(value: Any) -> Any:
    """A table cell: str, int, float, bool or None, bounded; lists and mappings as their JSON."""
    if value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return _cut(_text_of(value), MAX_CELL_CHARS)


def _column_type(values: list[Any]) -> str:
    kinds = {type(v) for v in values if v is not None}
    if kinds == {bool}:
        return "bool"
    if kinds == {int}:
        return "int"
    if kinds and kinds <= {int, float}:
        return "float"
    return "string"


def _column_names(rows: list[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(name for row in rows for name in row))


def _text_of(value: Any) -> str:
    """A plain value as text, as JSON writes it (true, null, NaN), strings as themselves."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return _cut(json.dumps(_Pruner(10, MAX_CELL_CHARS, 100)(value)), MAX_CELL_CHARS)


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` characters (saying how many more there were), encodable as UTF-8: a lone
    surrogate (JSON can hold one) would fail the web server's response for the whole page."""
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit:,} more characters)"
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def _part(key: Any) -> str:
    """A key as a readable piece of a label or column name: control characters escaped, cut short."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(key))
    return text if len(text) <= MAX_LABEL_CHARS else text[:MAX_LABEL_CHARS - 1] + "…"


def _why(what: str, error: Exception) -> str:
    return _cut(f"{what}: {type(error).__name__}: {error}", 500)


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _is_pairs(value: Any) -> TypeGuard[list[Any]]:
    return isinstance(value, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value)
