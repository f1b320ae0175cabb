"""Materialization metadata from any JSON-shaped result: every shape becomes entries Dagster accepts,
stores and serves (strict JSON for the browser), bounded in size, and a step that succeeded is never
failed by what its result looks like."""

import json
import math

import dagster as dg
import pytest
from dagster_graphql.implementation.events import iterate_metadata_entries

from marin_assets.core.step import Step
from marin_assets.dagster import build_definitions
from marin_assets.dagster.metadata import (
    MAX_JSON_CHARS,
    MAX_TABLE_ROWS,
    MAX_TEXT_CHARS,
    result_metadata,
    safe_metadata,
)
from marin_assets.dagster.plots import line_plot_markdown

NAN, INF = float("nan"), float("inf")


def strict_json(text: str):
    """Parse as the browser's JSON.parse does: NaN and Infinity are errors."""
    def reject(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=reject)


def accepted(metadata: dict) -> dict[str, dg.MetadataValue]:
    """What Dagster makes of `metadata`: normalized, stored (serialized and read back), and served
    by the GraphQL layer as the UI reads it (JSON entries and table rows must parse strictly)."""
    result = dg.MaterializeResult(metadata=metadata)
    event = dg.AssetMaterialization(asset_key="a", metadata=result.metadata)
    back = dg.deserialize_value(dg.serialize_value(event), dg.AssetMaterialization)
    for entry in iterate_metadata_entries(back.metadata):
        entry.label.encode("utf-8")  # the web server's response is UTF-8
        if type(entry).__name__ == "GrapheneTextMetadataEntry":
            entry.text.encode("utf-8")
        if type(entry).__name__ == "GrapheneJsonMetadataEntry":
            strict_json(entry.jsonString)
        if type(entry).__name__ == "GrapheneTableMetadataEntry":
            for record in entry.table.records:
                strict_json(record)
    return dict(back.metadata)


def rows_of(value: dg.TableMetadataValue) -> list[dict]:
    return [dict(r.data) for r in value.records]


def types_of(value: dg.TableMetadataValue) -> dict[str, str]:
    return {c.name: c.type for c in value.schema.columns}


def test_records_with_missing_none_mixed_and_nested_fields_are_a_table_with_consistent_columns():
    files = [{"path": "a", "size": 1, "ok": True},
             {"path": "b", "size": "big", "tags": ["x", 1]},
             {"size": None, "ok": 1},
             {"path": {"nested": [1, 2]}, "size": 2.5, "ok": False, "score": 0.5},
             {"path": "e", "size": 3, "score": 7}]
    md = accepted(result_metadata({"files": files}))
    table = md["result.files"]
    assert types_of(table) == {"path": "string", "size": "string", "ok": "string", "tags": "string",
                               "score": "float"}
    assert rows_of(table) == [
        {"path": "a", "size": "1", "ok": "true", "tags": None, "score": None},
        {"path": "b", "size": "big", "ok": None, "tags": '["x", 1]', "score": None},
        {"path": None, "size": None, "ok": "1", "tags": None, "score": None},
        {"path": '{"nested": [1, 2]}', "size": "2.5", "ok": "false", "tags": None, "score": 0.5},
        {"path": "e", "size": "3", "ok": None, "tags": None, "score": 7}]
    assert md["result.files.count"].value == 5
    for row in rows_of(table):  # every column's values are of its type
        for name, kind in types_of(table).items():
            assert row[name] is None or isinstance(row[name], {"string": str, "float": (int, float)}[kind])


def test_non_finite_numbers_are_shown_and_never_break_the_ui():
    result = {"loss": NAN, "peak": INF, "low": -INF, "per_set": {"a": {"loss": NAN}, "b": {"loss": 2.0}},
              "nested": {"x": [NAN, 1]}}
    md = accepted(result_metadata(result))
    assert math.isnan(md["result.loss"].value) and md["result.peak"].value == INF and md["result.low"].value == -INF
    assert strict_json(json.dumps(md["result"].value))["loss"] == "NaN"
    assert types_of(md["result.per_set"])["loss"] == "string"
    assert [r["loss"] for r in rows_of(md["result.per_set"])] == ["NaN", "2.0"]
    assert md["result.nested.x"].value == "NaN, 1"


def test_booleans_ints_and_floats_keep_their_column_types():
    md = accepted(result_metadata({"rows": [{"b": True, "i": 1, "f": 2}, {"b": False, "i": None, "f": 1.5}]}))
    assert types_of(md["result.rows"]) == {"b": "bool", "i": "int", "f": "float"}
    assert rows_of(md["result.rows"]) == [{"b": True, "i": 1, "f": 2}, {"b": False, "i": None, "f": 1.5}]


def test_empty_lists_and_mappings_are_shown_as_json():
    md = accepted(result_metadata({"files": [], "splits": {}, "deep": {"n": 1, "empty": {}}}))
    assert md["result.files"].value == [] and md["result.splits"].value == {}
    assert md["result.deep.empty"].value == {}


def test_long_lists_are_cut_to_max_table_rows_with_a_note():
    md = accepted(result_metadata({"files": [{"i": i} for i in range(MAX_TABLE_ROWS + 50)]}))
    assert len(md["result.files"].records) == MAX_TABLE_ROWS
    assert md["result.files.count"].value == MAX_TABLE_ROWS + 50
    assert md["result.files_note"].value == f"showing the first {MAX_TABLE_ROWS} of {MAX_TABLE_ROWS + 50} rows"
    curve = accepted(result_metadata({"loss_curve": [[i, 1 / (i + 1)] for i in range(1000)]}))
    points = rows_of(curve["result.loss_curve_table"])
    assert len(points) == MAX_TABLE_ROWS and points[0]["step"] == 0 and points[-1]["step"] == 999
    assert "evenly spaced" in curve["result.loss_curve_note"].value


def test_long_strings_and_huge_json_are_bounded_with_a_note():
    md = accepted(result_metadata({"log": "x" * 100_000, "cells": [{"s": "y" * 10_000}],
                                   "ids": list(range(200_000))}))
    assert len(md["result.log"].value) < MAX_TEXT_CHARS + 100 and "98,000 more characters" in md["result.log"].value
    assert len(rows_of(md["result.cells"])[0]["s"]) < 300
    assert len(json.dumps(md["result"].value)) <= MAX_JSON_CHARS
    assert "characters of JSON" in md["result_note"].value and ".artifact.json" in md["result_note"].value
    assert md["result.ids"].value.endswith("(199,950 more)")
    huge = accepted(result_metadata([[list(range(100))] * 100] * 100))
    assert len(json.dumps(huge["result"].value)) <= MAX_JSON_CHARS and "result_note" in huge


def test_many_keys_become_a_bounded_number_of_entries():
    md = accepted(result_metadata({f"k{i}": i for i in range(5000)}))
    assert len(md) < 150 and "not shown as entries" in md["result_note"].value


def test_keys_and_text_with_odd_characters():
    md = accepted(result_metadata({"a.b c/é\n": 1, "": 2, "x]y\n_curve": [[0, 1.0], [1, 0.5]],
                                   "k" * 5000: 3, "t": [{"col\n\"": 1, "": 2}], "s\ud800": "lone \udfff"}))
    assert md["result.a.b c/é\\n"].value == 1 and md["result."].value == 2
    plot = md["result.x]y\\n_curve"].value
    alt = plot[2:plot.index("](data:")]
    assert "]" not in alt and "\n" not in alt
    assert max(len(k) for k in md) < 100
    assert rows_of(md["result.t"]) == [{'col\\n"': 1, "": 2}]
    assert md["result.s\\ud800"].value == "lone ?"  # the web server's response must encode as UTF-8


def test_curves_with_nan_or_non_numeric_points_plot_what_they_can():
    md = accepted(result_metadata({"loss_curve": [[0, 9.0], [1, NAN], [2, "oops"], [3, True], [4, 2.0]],
                                   "bad_curve": [[0, NAN], [1, NAN]], "odd_curve": [[0, 1], [1, 2, 3]]}))
    assert md["result.loss_curve"].value.startswith("![loss curve](data:image/svg+xml;base64,")
    assert md["result.loss_curve_note"].value == "3 of 5 points are not pairs of finite numbers and are not plotted"
    assert [r["value"] for r in rows_of(md["result.loss_curve_table"])] == ["9.0", "NaN", "oops", "true", "2.0"]
    assert md["result.bad_curve"].value == "nothing to plot: none of the 2 points is a pair of finite numbers"
    assert len(md["result.bad_curve_table"].records) == 2
    assert md["result.odd_curve"].value == [[0, 1], [1, 2, 3]]  # not a curve: shown as JSON
    with pytest.raises(ValueError, match="nothing to plot"):
        line_plot_markdown([[0, NAN], ["a", 1]])
    assert line_plot_markdown([[0, 1e308], [1, -1e308], [2, "x"]], "big").startswith("![big](data:")


def test_top_level_lists_and_scalars():
    records = accepted(result_metadata([{"a": 1}, {"a": "b"}]))
    assert records["result"].value == [{"a": 1}, {"a": "b"}]
    assert rows_of(records["result.items"]) == [{"a": "1"}, {"a": "b"}] and records["result.items.count"].value == 2
    assert accepted(result_metadata([1, 2, 3]))["result.items"].value == "1, 2, 3"
    assert accepted(result_metadata([[1, 2], [3]]))["result"].value == [[1, 2], [3]]
    assert math.isnan(accepted(result_metadata(NAN))["result"].value)
    assert accepted(result_metadata(True))["result"].value is True
    long = accepted(result_metadata("z" * 50_000))["result"].value
    assert len(long) < MAX_TEXT_CHARS + 100 and long.endswith("(48,000 more characters)")
    assert result_metadata(None) == {}


def test_entries_dagster_refuses_become_text_saying_why():
    md = accepted(safe_metadata({"fine": 1, "object": object(), "table": dg.MetadataValue.json({"a": NAN})}))
    assert md["fine"].value == 1
    assert md["object"].value.startswith("could not be recorded: DagsterInvalidMetadata")
    assert strict_json(json.dumps(md["table"].value)) == {"a": "NaN"}


def nasty(output_path: str) -> dict:
    """A result with every awkward shape at once."""
    return {"files": [{"path": "a", "size": 1}, {"path": "b", "size": "big", "tags": ["x"]}, {"size": None},
                      {"path": {"n": 1}, "ok": True}],
            "loss": NAN, "peak": INF, "loss_curve": [[0, NAN], [1, "oops"], [2, 3.0]],
            "splits": {"train": {"n": 1, "hist": [1, 2]}, "val": {"n": "x"}},
            "empty": [], "nothing": {}, "odd key/é\n]": 1, "long": "x" * 100_000,
            "many": [{"i": i, "v": i / 3} for i in range(1000)]}


def test_a_nasty_result_materializes_and_is_cached_through_dagster(prefix, local_ray):
    defs = build_definitions([Step(name="t/nasty", fn=nasty)])
    instance = dg.DagsterInstance.ephemeral()
    job = defs.resolve_implicit_global_asset_job_def()
    for cached in (False, True):
        run = job.execute_in_process(instance=instance, raise_on_error=False)
        assert run.success, [e.message for e in run.all_events if e.is_failure]
        [event] = run.get_asset_materialization_events()
        md = accepted(dict(event.materialization.metadata))
        assert md["cached"].value is cached
        assert {"result", "result_note", "result.files", "result.files.count", "result.loss", "result.peak",
                "result.loss_curve", "result.loss_curve_table", "result.loss_curve_note", "result.splits",
                "result.empty", "result.nothing", "result.odd key/é\\n]", "result.long", "result.many",
                "result.many_note"} <= md.keys()
        assert md["result.loss_curve"].value.startswith("![loss curve](data:")


def test_a_files_path_is_a_path_entry_and_a_results_markdown_is_rendered():
    got = accepted(result_metadata({"html_path": "/out/log_probs.html", "note": "plain text",
                                    "hardest_documents_markdown": "| doc |\n| --- |\n| 3 |"}))
    assert isinstance(got["result.html_path"], dg.PathMetadataValue)
    assert got["result.html_path"].value == "/out/log_probs.html"
    assert isinstance(got["result.hardest_documents_markdown"], dg.MarkdownMetadataValue)
    assert got["result.hardest_documents_markdown"].value.startswith("| doc |")
    assert isinstance(got["result.note"], dg.TextMetadataValue)
