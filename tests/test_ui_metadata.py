"""What an asset tells in the UI, without a browser: metadata by result shape, the curve plot,
asset checks passing and failing on real outputs, kinds, and drift in the description."""

import base64
import json
import math
import os
import xml.etree.ElementTree as ET

import dagster as dg

from marin_assets import build_definitions
from marin_assets.core.results import to_jsonable
from marin_assets.dagster.drift import drifts_from_instance
from marin_assets.dagster.metadata import result_metadata
from marin_assets.dagster.plots import INLINE_LIMIT, MAX_POINTS, line_plot_markdown
from marin_assets.pipeline.data.download import FILES_MATCH_RECORD, download_urls
from marin_assets.pipeline.evals.loss import EvalResult, every_set_evaluated
from marin_assets.pipeline.hello import numbers_step, report_step, stats_step
from marin_assets.pipeline.training.training_run import LOSS_FELL
from resources import StorageResource


def svg_of(markdown: str) -> ET.Element:
    prefix = "data:image/svg+xml;base64,"
    encoded = markdown[markdown.index(prefix) + len(prefix):-1]
    return ET.fromstring(base64.b64decode(encoded))


def test_a_long_curve_is_a_small_inline_svg_plot():
    curve = [[step, 8 * math.exp(-step / 40) + 0.3] for step in range(2000)]
    markdown = line_plot_markdown(curve, "loss curve")
    assert len(markdown) < INLINE_LIMIT  # Dagster shows it inline, not behind "Show Markdown"
    svg = svg_of(markdown)
    points = svg.find("{http://www.w3.org/2000/svg}polyline").get("points").split()
    assert len(points) == MAX_POINTS
    xs = [int(p.split(",")[0]) for p in points]
    ys = [int(p.split(",")[1]) for p in points]
    assert xs == sorted(xs) and ys[0] < ys[-1]  # left to right; a falling loss goes down the screen
    labels = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "loss curve" in labels and "1999" in labels and "0" in labels


def test_result_shapes_become_numbers_tables_and_plots():
    result = to_jsonable(EvalResult("ckpt/step-5", 5, 2.5, 0.9, {"stories": {"loss": 2.5, "bpb": 0.9},
                                                                  "news": {"loss": 3.1, "bpb": 1.2}}, 1.5))
    md = result_metadata(result | {"loss_curve": [[0, 9.0], [5, 3.0]], "splits": {"train": {"tokens": 7}}})
    assert md["result.loss"] == 2.5 and md["result.step"] == 5
    per_set = md["result.per_dataset"]
    assert [json.loads(json.dumps(r.data)) for r in per_set.records] == [
        {"name": "stories", "loss": 2.5, "bpb": 0.9}, {"name": "news", "loss": 3.1, "bpb": 1.2}]
    assert [c.name for c in per_set.schema.columns] == ["name", "loss", "bpb"]
    assert md["result.loss_curve"].value.startswith("![loss curve](data:image/svg+xml;base64,")
    assert [r.data for r in md["result.loss_curve_table"].records] == [{"step": 0, "value": 9.0},
                                                                         {"step": 5, "value": 3.0}]
    assert md["result.splits"].records[0].data == {"name": "train", "tokens": 7}
    assert result_metadata(3)["result"] == 3


def test_download_metadata_and_its_check_against_the_real_output(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("hello\n")
    (source / "b.txt").write_text("world!\n")
    out = str(tmp_path / "out")
    result = to_jsonable(download_urls(out, [str(source)]))
    md = result_metadata(result)
    assert md["result.bytes"] == 13 and md["result.files.count"] == 2
    assert {r.data["path"] for r in md["result.files"].records} == {"a.txt", "b.txt"}

    passed = FILES_MATCH_RECORD.fn(out, result)
    assert passed.passed and passed.metadata == {"files": 2, "mismatched": 0}
    with open(os.path.join(out, "b.txt"), "a") as f:
        f.write("truncated or appended later")
    failed = FILES_MATCH_RECORD.fn(out, result)
    assert not failed.passed and "b.txt" in failed.message and failed.metadata["mismatched"] == 1
    os.unlink(os.path.join(out, "a.txt"))
    assert "a.txt: missing" in FILES_MATCH_RECORD.fn(out, result).message


def test_training_and_evaluation_checks_fail_on_what_they_guard():
    assert LOSS_FELL.fn("", {"loss_curve": [[0, 9.0], [10, 2.0]]}).passed
    assert not LOSS_FELL.fn("", {"loss_curve": [[0, 2.0], [10, 9.0]]}).passed
    nan = LOSS_FELL.fn("", {"loss_curve": [[0, 9.0], [5, float("nan")], [10, 2.0]]})
    assert not nan.passed and "non-finite loss at steps [5]" in nan.message
    check = every_set_evaluated(["news", "stories"])
    assert check.fn("", {"per_dataset": {"news": {"loss": 3.0}, "stories": {"loss": 2.0}}}).passed
    missing = check.fn("", {"per_dataset": {"stories": {"loss": 2.0}}})
    assert not missing.passed and "news" in missing.message


def hello(title: str):
    numbers = numbers_step("hello/numbers", n=30, seed=2)
    return [report_step("hello/report", stats_step("hello/stats", numbers), title=title)]


def test_definitions_show_kinds_identity_and_the_drift_since_the_last_materialization(prefix, dagster_home,
                                                                                       local_ray):
    instance = dg.DagsterInstance.get()
    defs = build_definitions(hello("First"), resources={"storage": StorageResource(prefix=prefix)})
    assert defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance).success

    changed = hello("Second")
    assert drifts_from_instance(changed, instance).keys() == {"hello/report"}
    defs = build_definitions(changed, resources={"storage": StorageResource(prefix=prefix)}, describe_drift=True)
    node = defs.resolve_asset_graph().get(dg.AssetKey(["hello", "report"]))
    assert node.description.startswith("**Changed since the last materialization**")
    assert "`title`: 'First' → 'Second'" in node.description
    drift = node.metadata["changed_since_last_materialization"].value
    assert drift["changes"] == [{"field": "title", "old": "First", "new": "Second"}]
    assert node.metadata["identity"] == changed[0].name_with_hash
    assert node.kinds == {"python", "ray"} and node.tags["marin/stage"] == "hello"
    unchanged = defs.resolve_asset_graph().get(dg.AssetKey(["hello", "stats"]))
    assert "Changed since" not in unchanged.description
    gcs = build_definitions(changed, resources={"storage": StorageResource(prefix="gs://bucket/x")})
    assert "gcs" in gcs.resolve_asset_graph().get(dg.AssetKey(["hello", "stats"])).kinds
