"""Experiment summary: every training and evaluation of an experiment or a sweep at a glance.

One row per training run with only the hyperparameters that differ between the runs (what the
experiment varies; what they share would be noise), its losses, bits per byte, downstream scores,
tokens, speed and FLOPs (the run-cost row, `run_cost.run_cost_row`), and the assets it comes from;
plus the data of the plots people look at first — eval loss against learning rate, one series per
model size, and the loss curves overlaid. This step computes the data; the Dagster layer draws it
(`marin_assets.dagster.plots`). Its members are its deps: change one and the summary is unsynced.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.results import to_jsonable
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.reports.run_costs import run_cost_row

if TYPE_CHECKING:
    from marin_assets.pipeline.training.training_run import TrainResult

TABLE_FILE = "summary.md"
LEARNING_RATE = "optimizer.learning_rate"
"""The flattened hash_attr a learning rate is (a `train_step`'s `OptimizerSpec`)."""


class ExperimentSummaryError(ValueError):
    """An experiment summary cannot be made from what its members recorded."""


@dataclass(frozen=True)
class PlotData:
    """The points of one plot of several series; the Dagster layer draws it (`plots.series_plot`)."""

    title: str
    x: str
    """What x is (`learning rate`, `step`)."""
    y: str
    log_x: bool
    """Space x by its logarithm (learning rates)."""
    series: dict[str, list[list[float]]]
    """Label → `[x, y]` points."""


@record_type("experiment_summary")
@dataclass(frozen=True)
class ExperimentSummary:
    """The runs of an experiment side by side, and the data of its plots."""

    rows: list[dict[str, Any]]
    """One per training run, in the order given: `run` (its asset), `evals` (its evaluations' assets), each
    differing hyperparameter (flattened hash_attrs: `optimizer.learning_rate`, `model.hidden_dim` …),
    `train_loss`, `eval_loss`, `eval_bpb` (Levanter's at the end of training), `evaluated_loss`/`evaluated_bpb`
    (an evaluation step's), `{task}/acc`… (harness evaluations), `parameters`, `tokens`, `tokens_per_second`,
    `total_flops`."""
    varied: list[str]
    """The hyperparameters that differ between the runs (their columns)."""
    eval_loss_vs_lr: PlotData | None
    """Final eval loss against learning rate, one series per model size (None if the learning rate is fixed)."""
    train_loss_curves: PlotData
    """Every run's train loss curve."""
    eval_loss_curves: PlotData
    """Every run's eval loss curve."""
    table_file: str
    """The rows as a Markdown table under the output path."""


def flatten_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """hash_attrs as `a.b` → plain value (lists as their JSON), so that runs compare field by field."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (list, dict)):
            out[prefix] = json.dumps(value, sort_keys=True)
        else:
            out[prefix] = value

    walk("", to_jsonable(dict(attrs)))
    return out


def differing(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every run (a key some runs lack differs), in first-seen order."""
    keys = list(dict.fromkeys(k for run in runs for k in run))
    return [k for k in keys if len({json.dumps(run.get(k), sort_keys=True) for run in runs}) > 1]


def experiment_summary(output_path: str, runs: Mapping[str, tuple[Mapping[str, Any], TrainResult]],
                       evaluations: Mapping[str, tuple[str, Mapping[str, float | None]]]) -> ExperimentSummary:
    """A row per training run (name → (its hash_attrs, its `TrainResult`)) joined with its evaluations (name →
    (the run evaluated, the columns its kind reports: `EvalKind.summary_columns`)), the data of the plots, and
    `summary.md`."""
    if not runs:
        raise ExperimentSummaryError("an experiment summary needs at least one training run")
    strays = {name: run for name, (run, _) in evaluations.items() if run not in runs}
    for name, run in strays.items():
        raise ExperimentSummaryError(f"evaluation {name!r} evaluates {run!r}, which is not a run of the"
                                     f" experiment (runs: {sorted(runs)})")
    flat = {name: flatten_attrs(attrs) for name, (attrs, _) in runs.items()}
    varied = differing(list(flat.values()))
    rows: dict[str, dict[str, Any]] = {}
    for name, (_, result) in runs.items():
        cost = run_cost_row(name, result)
        rows[name] = {"run": name, "evals": None, **{k: flat[name].get(k) for k in varied},
                      "train_loss": result.final_train_loss, "eval_loss": result.final_eval_loss,
                      "eval_bpb": result.final_eval_bpb}
        rows[name].update(parameters=cost.parameters, tokens=cost.tokens, tokens_per_second=cost.tokens_per_second,
                          total_flops=cost.total_flops)
    for name, (run, columns) in evaluations.items():
        row = rows[run]
        row["evals"] = name if row["evals"] is None else f"{row['evals']}, {name}"
        row.update(columns)
    labels = _short_labels(list(runs))
    summary = ExperimentSummary(
        rows=list(rows.values()), varied=varied, eval_loss_vs_lr=_loss_vs_lr(runs, flat, varied, rows),
        train_loss_curves=PlotData("train loss", "step", "loss", False,
                                   {labels[n]: r.loss_curve for n, (_, r) in runs.items() if r.loss_curve}),
        eval_loss_curves=PlotData("eval loss", "step", "loss", False,
                                  {labels[n]: r.eval_curve for n, (_, r) in runs.items() if r.eval_curve}),
        table_file=TABLE_FILE)
    fs, target = fsspec.core.url_to_fs(join_path(output_path, TABLE_FILE))
    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(target, "w") as f:
        f.write(markdown_table(summary.rows))
    return summary


def _loss_vs_lr(runs: Mapping[str, tuple[Mapping[str, Any], TrainResult]], flat: Mapping[str, dict[str, Any]],
                varied: Sequence[str], rows: Mapping[str, Mapping[str, Any]]) -> PlotData | None:
    """Eval loss (an evaluation step's, else training's last) against learning rate, a series per model size."""
    if LEARNING_RATE not in varied:
        return None
    sizes = [k for k in varied if k.startswith("model.")]
    series: dict[str, list[list[float]]] = {}
    for name in runs:
        lr, loss = flat[name].get(LEARNING_RATE), rows[name].get("evaluated_loss", rows[name]["eval_loss"])
        if not isinstance(lr, (int, float)) or not isinstance(loss, (int, float)):
            continue
        params = rows[name]["parameters"]
        label = (f"{params / 1e3:,.0f}k params" if isinstance(params, int) and sizes else
                 ", ".join(f"{k.split('.', 1)[1]}={flat[name].get(k)}" for k in sizes) or "all runs")
        series.setdefault(label, []).append([float(lr), float(loss)])
    return PlotData("eval loss vs learning rate", "learning rate", "eval loss", True,
                    {k: sorted(v) for k, v in series.items()}) if series else None


def _short_labels(names: Sequence[str]) -> dict[str, str]:
    """Run names without what they all share (`checkpoints/sweep-xs-lr0.001` → `xs-lr0.001`)."""
    common = os.path.commonprefix(list(names)) if len(names) > 1 else names[0].rsplit("/", 1)[0] + "/"
    common = re.sub(r"[^/_-]*$", "", common)  # up to a separator: `h32`, `h48` keep their `h`
    return {n: n[len(common):] or n for n in names}


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table, every column any row has (— where a row has no value)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [("—" if row.get(c) is None else f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]))
                 for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def every_run_summarized(output_path: str, result: dict) -> CheckOutcome:
    """Every run has a row with a train loss (a run without one logged no step)."""
    rows = result.get("rows") or []
    lossless = [r["run"] for r in rows if r.get("train_loss") is None]
    return CheckOutcome(not lossless, f"no train loss for {lossless}" if lossless else f"{len(rows)} runs summarized",
                        {"runs": len(rows), "varied": len(result.get("varied") or [])})


EVERY_RUN_SUMMARIZED = Check("every_run_summarized", every_run_summarized,
                             "Every training run of the experiment has a row with its train loss.")


def experiment_summary_step(name: str, steps: Sequence[Step]) -> Step:
    """The summary of the training steps among `steps` (a sweep's, an experiment's) and of the evaluation steps
    among them that evaluate one of those runs; other steps are left out. Its members are its deps, so a
    changed member changes its identity and Dagster shows it unsynced.

    Identity: the names of the training and evaluation steps among `steps` (and those steps).
    """
    from marin_assets.pipeline.evals.steps import EvalStep
    from marin_assets.pipeline.training.training_run import TrainStep

    trains = [s for s in steps if isinstance(s, TrainStep)]
    if not trains:
        raise StepDefinitionError(f"step {name!r}: none of the {len(steps)} steps given is a training step (made by"
                                  " train_step or lr_model_sweep); give the steps of a sweep or of an experiment")
    runs = {s.name for s in trains}
    eval_steps = [s for s in steps if isinstance(s, EvalStep) and s.evaluates.name in runs]
    attrs = {s.name: dict(s.hash_attrs) for s in trains}

    def run(out: str) -> ExperimentSummary:
        from marin_assets.core.record import load_result, read_record
        from marin_assets.pipeline.training.training_run import TrainResult

        columns = {s.name: s.eval_kind.summary_columns(read_record(s.output_path).result) for s in eval_steps}
        return experiment_summary(out, {s.name: (attrs[s.name], load_result(s, TrainResult)) for s in trains},
                                  {s.name: (s.evaluates.name, columns[s.name]) for s in eval_steps})

    return Step(name=name, fn=run, deps=[*trains, *eval_steps],
                hash_attrs={"runs": [s.name for s in trains], "evals": [s.name for s in eval_steps]}, kind="report",
                description=made_by(experiment_summary), checks=[EVERY_RUN_SUMMARIZED])


__all__ = ["ExperimentSummary", "ExperimentSummaryError", "PlotData", "differing", "every_run_summarized",
           "experiment_summary", "experiment_summary_step", "flatten_attrs", "markdown_table"]
