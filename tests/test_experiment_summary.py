"""The experiment summary on a real tiny sweep (2 learning rates × 2 model sizes, 6 steps each, one run also
evaluated): a row per run with only the differing hyperparameters, losses, bpb and cost; the plots as Dagster
shows them (one series per model size, the right number of points) within a size bound; its identity follows
its members."""

import base64
import dataclasses
import os
import re

import dagster as dg
import pytest

from marin_assets import StepDefinitionError, materialize_step
from marin_assets.core.record import read_record
from marin_assets.core.step import walk
from marin_assets.dagster.metadata import result_metadata
from marin_assets.dagster.plots import INLINE_LIMIT, MAX_SERIES, MIN_SERIES_POINTS, SQUARES, series_plot_markdown
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.evals.loss import loss_eval_step
from marin_assets.pipeline.reports.experiment_summary import (
    TABLE_FILE,
    ExperimentSummaryError,
    experiment_summary,
    experiment_summary_step,
)
from marin_assets.pipeline.sweeps import lr_model_sweep
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec

XS = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
S = ModelSpec(hidden_dim=48, intermediate_dim=96, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
TRAINER = TrainerSpec(num_train_steps=6, train_batch_size=4, checkpoint_every=6, steps_per_eval=3, max_eval_batches=1)


def sweep_steps(trainer: TrainerSpec = TRAINER):
    stories = corpus_step("raw/sum-stories", train_documents=300, validation_documents=30, seed=1, shards=1)
    tokenized = tokenize_step("tokenized/sum-stories", stories,
                              bpe_tokenizer_step("tokenizers/sum-bpe", stories, vocab_size=400))
    runs = lr_model_sweep("sum", {"stories": tokenized}, {"xs": XS, "s": S}, [1e-3, 1e-2], trainer=trainer,
                          evaluate=False)
    evaluation = loss_eval_step("evals/sum-xs-lr0.01", runs[1], {"stories": tokenized}, max_eval_batches=1)
    return [*runs, evaluation]


@pytest.fixture(scope="module")
def summarized(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("summary") / "outputs")
    steps = sweep_steps()
    summary = experiment_summary_step("reports/sum", steps)
    for step in walk([summary]):
        materialize_step(step, prefix=prefix)
    return steps, summary, prefix, read_record(summary.output_path_under(prefix)).result


def svg_of(markdown: str) -> str:
    """The image of a plot's markdown (the lines; the title, legend and ranges follow it as text)."""
    image = re.match(r"!\[[^\]]*\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)\n\n[^\n]+\n\nx [^\n]+$", markdown)
    assert image, markdown[:200]
    return base64.b64decode(image.group(1)).decode()


def points_per_series(svg: str) -> list[int]:
    """How many points each colored line of a plot has (the gray axes left out)."""
    lines = re.findall(r'<path stroke="(#[0-9a-f]{3})"[^>]* d="([^"]*)"', svg)
    return [len(re.findall(r"-?\d+ -?\d+", d)) for color, d in lines if color != "#bbb"]


def caption_of(markdown: str) -> str:
    """The text after the image: the title and legend, then the ranges."""
    return markdown.split("\n\n", 1)[1]


def test_a_row_per_run_with_only_the_differing_hyperparameters(summarized):
    steps, summary, prefix, result = summarized
    assert result["varied"] == ["model.hidden_dim", "model.intermediate_dim", "optimizer.learning_rate"]
    rows = {r["run"]: r for r in result["rows"]}
    assert list(rows) == ["checkpoints/sum-xs-lr0.001", "checkpoints/sum-xs-lr0.01", "checkpoints/sum-s-lr0.001",
                          "checkpoints/sum-s-lr0.01"]
    assert [(r["model.hidden_dim"], r["optimizer.learning_rate"]) for r in rows.values()] == [
        (32, 1e-3), (32, 1e-2), (48, 1e-3), (48, 1e-2)]
    for row in rows.values():
        assert "trainer.num_train_steps" not in row and "model.num_layers" not in row  # the same in every run
        assert row["train_loss"] > 0 and row["eval_loss"] > 0 and row["eval_bpb"] > 0
        assert row["tokens"] == 6 * 4 * 64 and row["tokens_per_second"] > 0 and row["total_flops"] > 0
    assert rows["checkpoints/sum-xs-lr0.01"]["evals"] == "evals/sum-xs-lr0.01"
    assert rows["checkpoints/sum-xs-lr0.01"]["evaluated_loss"] > 0
    unevaluated = rows["checkpoints/sum-s-lr0.01"]
    assert unevaluated["evals"] is None and "evaluated_loss" not in unevaluated
    assert rows["checkpoints/sum-s-lr0.001"]["parameters"] > rows["checkpoints/sum-xs-lr0.001"]["parameters"]
    with open(os.path.join(summary.output_path_under(prefix), TABLE_FILE)) as f:
        table = f.read()
    assert table.count("\n") == 2 + 4 and "| run | evals | model.hidden_dim |" in table


def test_the_plots_show_one_series_per_model_size_and_every_point(summarized):
    _, _, _, result = summarized
    by_lr = result["eval_loss_vs_lr"]
    assert by_lr["log_x"] and len(by_lr["series"]) == 2
    assert all([lr for lr, _ in points] == [1e-3, 1e-2] for points in by_lr["series"].values())
    markdown = series_plot_markdown(by_lr)
    assert points_per_series(svg_of(markdown)) == [2, 2]
    caption = caption_of(markdown)  # the legend: a colored square and its series, in the lines' order
    at = [caption.index(f"{square} {label}") for square, label in zip(SQUARES, by_lr["series"], strict=False)]
    assert at == sorted(at)
    assert caption.endswith(" (log), y {:.4g}–{:.4g}".format(
        *(f(y for points in by_lr["series"].values() for _, y in points) for f in (min, max))))
    assert [len(points) for points in result["train_loss_curves"]["series"].values()] == [6] * 4
    markdown = series_plot_markdown(result["train_loss_curves"])
    assert len(markdown) < INLINE_LIMIT  # 4 overlaid curves show inline in Dagster, every point of them
    assert points_per_series(svg_of(markdown)) == [6] * 4


def test_dagster_metadata_includes_the_plots_within_a_size_bound(summarized):
    _, _, _, result = summarized
    metadata = result_metadata(result)
    assert isinstance(metadata["result.rows"], dg.TableMetadataValue) and len(metadata["result.rows"].records) == 4
    plots = {k: v for k, v in metadata.items() if isinstance(v, dg.MarkdownMetadataValue)}
    assert set(plots) == {"result.eval_loss_vs_lr", "result.train_loss_curves", "result.eval_loss_curves"}
    sizes = {k: len(v.md_str) for k, v in plots.items()}
    print("rendered plot markdown sizes:", sizes)
    assert all(size < INLINE_LIMIT for size in sizes.values())  # Dagster shows every plot inline
    evals = [len(points) for points in result["eval_loss_curves"]["series"].values()]
    assert len(evals) == 4 and points_per_series(svg_of(plots["result.eval_loss_curves"].md_str)) == evals
    many = {f"run-{i}": [[s, 5 - s / 100] for s in range(1000)] for i in range(3 * MAX_SERIES)}
    bounded = series_plot_markdown({"title": "x" * 500, "log_x": False, "series": many})
    assert len(points_per_series(svg_of(bounded))) == MAX_SERIES and len(bounded) < 2 * INLINE_LIMIT
    # the most that still shows inline: cut evenly, never below the minimum
    for n, points in ((2, 24), (4, 12), (6, 6), (8, MIN_SERIES_POINTS)):
        named = {f"sum-s{i}-lr0.001": [[s, 5 - s / 100] for s in range(1000)] for i in range(n)}  # long labels
        drawn = series_plot_markdown({"title": "train loss curves", "log_x": False, "series": named})
        assert points_per_series(svg_of(drawn)) == [points] * n and (len(drawn) < INLINE_LIMIT or n == 8)


def test_a_changed_member_changes_the_summary(summarized):
    steps, summary, _, _ = summarized
    assert {d.name for d in summary.deps} == {s.name for s in steps}
    longer = experiment_summary_step("reports/sum", sweep_steps(dataclasses.replace(TRAINER, num_train_steps=7)))
    assert longer.hash != summary.hash
    assert experiment_summary_step("reports/sum", sweep_steps()).hash == summary.hash


def test_bad_input_says_what_is_wrong(summarized):
    steps, _, _, _ = summarized
    with pytest.raises(StepDefinitionError) as e:
        experiment_summary_step("reports/none", [steps[-1]])
    assert str(e.value) == ("step 'reports/none': none of the 1 steps given is a training step (made by train_step or"
                            " lr_model_sweep); give the steps of a sweep or of an experiment")
    with pytest.raises(ExperimentSummaryError, match="evaluation 'evals/x' evaluates 'checkpoints/y', which is not"):
        experiment_summary("/unused", {"checkpoints/z": ({}, None)}, {"evals/x": ("checkpoints/y", None)})
