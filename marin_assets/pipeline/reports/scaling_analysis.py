"""The scaling-law analysis of an IsoFLOP ladder as a step: each run's tokens, parameters and FLOPs (from its
recorded cost) and its metric → per budget the Huber parabola and its optimum, across budgets the power laws
D* = A·C^α and N* = B·C^β, the metric the compute-optimal run of a next budget should reach, and that run's
shape under the ladder's rules (`scaling_laws.py` does the fits; this module reads the records, plans the next
run and lays out the plots the UI draws: the IsoFLOP curves, the optima against compute, the minimum metric).

The planned run is the ladder's model (its rules: width steps, depth from width) whose parameters are nearest N*
in log, trained on the tokens the budget leaves it. It is seldom exactly at D*: the metric it should reach is
the predicted minimum plus the parabolas' mean curvature × (its log10 tokens − log10 D*)², never less than the
minimum (`PlannedRun.predicted_metric`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import fsspec

from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.reports.scaling_laws import (
    MIN_RUNS_PER_BUDGET,
    PARAMETERS_METHOD,
    PowerLaw,
    ScalingFitError,
    ScalingLaws,
    ScalingPrediction,
    ScalingRun,
    fit_scaling_laws,
)
from marin_assets.pipeline.training.pretrain.isoflop import (
    IsoFlopCandidate,
    IsoFlopScale,
    RejectedCandidate,
    budget_label,
    candidate,
    llama_parameters,
    model_for,
)
from marin_assets.pipeline.training.pretrain.isoflop_sweep import IsoFlopSweep

if TYPE_CHECKING:
    from marin_assets.pipeline.training.training_run import TrainResult

TABLE_FILE = "scaling_laws.md"
METRICS = "eval/loss, eval/bpb, train/loss or eval/<validation set>/loss"
"""The metrics a training record holds at the end of a run (lower is better)."""
MAX_PLAN_WIDTH_FACTOR = 64
"""Planning tries widths up to this many times the ladder's widest (far past any next budget of a ladder)."""


class ScalingAnalysisError(ValueError):
    """The runs of an analysis cannot be fitted: a metric missing, a run off its budget, no optimum."""


def check_metric(metric: str) -> None:
    """`ValueError` unless `metric` is one a training record holds (`METRICS`)."""
    if metric not in ("eval/loss", "eval/bpb", "train/loss") and not re.fullmatch(r"eval/[^/]+/loss", metric):
        raise ValueError(f"unknown metric {metric!r}: the analysis fits {METRICS}")


def run_metric(result: TrainResult, metric: str) -> float | None:
    """The final value of `metric` in a training record, None when the run did not record it."""
    if metric == "eval/loss":
        return result.final_eval_loss
    if metric == "eval/bpb":
        return result.final_eval_bpb
    if metric == "train/loss":
        return result.final_train_loss
    return result.eval_losses.get(metric.split("/")[1])


def recorded_metrics(result: TrainResult) -> list[str]:
    """The metrics a training record holds, for messages."""
    found = [m for m, v in (("eval/loss", result.final_eval_loss), ("eval/bpb", result.final_eval_bpb),
                            ("train/loss", result.final_train_loss)) if v is not None]
    return found + [f"eval/{name}/loss" for name in result.eval_losses]


@dataclass(frozen=True)
class RunPoint:
    """One run of the ladder as the analysis read it."""

    name: str
    """The training step."""
    budget: float
    tokens: int
    parameters: int
    flops: float | None
    """Its recorded training FLOPs (None in a record made before costs were)."""
    metric: float
    weight: float
    """Its final Huber weight in its budget's fit (near 0: set aside as an outlier)."""
    excluded: str | None = None
    """Why it was left out of its budget's fit (weight 0: diverged or mis-logged, far off the curve); None: fitted."""


@dataclass(frozen=True)
class BudgetSummary:
    """One budget's fit: metric ≈ a·x² + b·x + c with x = log10(tokens), and its minimum."""

    label: str
    """The budget as in run names (`1e11`)."""
    budget: float
    runs: int
    a: float
    b: float
    c: float
    huber_delta: float
    """The Huber threshold, in metric units."""
    optimal_tokens: float
    """D*."""
    optimal_parameters: float
    """N*."""
    optimal_metric: float
    """The parabola's minimum."""
    tokens_per_parameter: float
    """D* ÷ N*."""


@dataclass(frozen=True)
class LawSummary:
    """A power law across budgets, as the UI's table shows it."""

    formula: str
    coefficient: float
    exponent: float
    log10_rms: float
    """Root mean square of its residuals in log10 (0 through two budgets)."""


@dataclass(frozen=True)
class PlannedRun:
    """The compute-optimal run of the next budget under the ladder's rules, and the metric it should reach."""

    candidate: IsoFlopCandidate
    """Its model, tokens, batch, steps and learning rate (the ladder's rules at the next budget)."""
    predicted_metric: float
    """metric_at_optimum + mean curvature × log10_tokens_from_optimum²: what this run should reach."""
    metric_at_optimum: float
    """L* = K·C^γ: the predicted minimum at this budget."""
    optimal_tokens: float
    """D* = A·C^α."""
    optimal_parameters: float
    """N* = B·C^β."""
    log10_tokens_from_optimum: float
    """log10(this run's tokens ÷ D*): how far the nearest model of the ladder lies from the optimum."""
    curvature: float
    """The mean `a` of the budgets' parabolas (metric per decade of tokens squared)."""


@dataclass(frozen=True)
class ScalingPlot:
    """The points of one plot; the Dagster layer draws it (`plots.series_plot`): `series` as lines, `parabolas`
    as the curve through three points, `markers` as dots, a label's all in one color."""

    title: str
    x: str
    y: str
    log_x: bool
    log_y: bool
    series: dict[str, list[list[float]]]
    parabolas: dict[str, list[list[float]]] = field(default_factory=dict)
    """Label → three points of a parabola, the middle one midway in log10 x."""
    markers: dict[str, list[list[float]]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    """The labels in legend order (the record's mappings come back with sorted keys: `3e10` after `1e11`)."""


@record_type("scaling_analysis")
@dataclass(frozen=True)
class ScalingAnalysis:
    """The scaling laws of a ladder: per-budget optima, power laws across budgets, the next budget's prediction
    and run, and the plots."""

    metric: str
    """The metric fitted (lower is better)."""
    alpha: float
    """α of D* = A·C^α."""
    beta: float
    """β of N* = B·C^β."""
    laws: dict[str, LawSummary]
    """`tokens` (D* = A·C^α), `parameters` (N* = B·C^β) and `metric` (L* = K·C^γ)."""
    prediction: ScalingPrediction | None
    """D*, N* and L* at the next budget (None when none was given)."""
    next_run: PlannedRun | None
    """The run to train at the next budget (None without a next budget or the ladder's rules: `next_run_note`)."""
    next_run_note: str | None
    """Why there is no planned run."""
    fits: list[BudgetSummary]
    """Each budget's fit, smallest budget first."""
    runs: list[RunPoint]
    """Every run, smallest budget and fewest tokens first."""
    rejected: list[RejectedCandidate]
    """The ladder's candidates that were not trained, and why."""
    isoflop_plot: ScalingPlot
    """Metric vs tokens: each budget's runs and parabola (the UI ticks its vertex: the budget's optimum)."""
    scaling_plot: ScalingPlot
    """D* and N* vs compute (log–log): per budget, the laws, and the prediction."""
    metric_plot: ScalingPlot
    """The minimum metric vs compute (log–log): per budget, its law, and the prediction."""
    parameters_method: str
    """How N* is found."""
    table_file: str
    """The fits and laws as Markdown, under the output path."""
    metric_law_note: str = ""
    """Which law of L* predicts (E + K·C^γ, or the pure power law and why)."""
    irreducible: float | None = None
    """E of L* = E + K·C^γ where the ladder supports it (None: the pure power law predicts)."""


def plan_run(laws: ScalingLaws, budget: float, scale: IsoFlopScale, vocab_size: int) -> PlannedRun:
    """The ladder's model nearest the predicted N* at `budget` (widths from `scale.hidden_start` by
    `hidden_step`, any depth the rules give), trained as a ladder run would be; `ScalingFitError` when the rules
    reject every width near it."""
    predicted = laws.predict(budget)
    kept: list[IsoFlopCandidate] = []
    refused: list[str] = []
    hidden = scale.hidden_start
    while hidden <= MAX_PLAN_WIDTH_FACTOR * scale.hidden_stop:
        found = candidate(budget, hidden, vocab_size, scale)
        if isinstance(found, IsoFlopCandidate):
            kept.append(found)
        else:
            refused.append(f"d{hidden}: {found.reason}")
        if llama_parameters(model_for(hidden, scale), vocab_size) > 4 * predicted.parameters:
            break
        hidden += scale.hidden_step
    if not kept:
        raise ScalingFitError(f"budget {budget:g}: the ladder's rules keep no model near the predicted N* ="
                              f" {predicted.parameters:.3g} parameters: {'; '.join(refused[-4:])}")
    best = min(kept, key=lambda c: (abs(math.log10(c.parameters / predicted.parameters)), c.parameters))
    curvature = sum(f.a for f in laws.fits) / len(laws.fits)
    offset = math.log10(best.tokens / predicted.tokens)
    return PlannedRun(candidate=best, predicted_metric=predicted.metric + curvature * offset**2,
                      metric_at_optimum=predicted.metric, optimal_tokens=predicted.tokens,
                      optimal_parameters=predicted.parameters, log10_tokens_from_optimum=offset, curvature=curvature)


def _law(formula: str, law: PowerLaw) -> LawSummary:
    return LawSummary(formula, law.coefficient, law.exponent, law.log10_rms)


def _plots(laws: ScalingLaws, prediction: ScalingPrediction | None,
           plan: PlannedRun | None) -> tuple[ScalingPlot, ScalingPlot, ScalingPlot]:
    """The IsoFLOP plot, the optima against compute and the minimum metric against compute."""
    parabolas, markers = {}, {}
    for fit in laws.fits:
        low, high = fit.runs[0].tokens, fit.runs[-1].tokens
        middle = math.sqrt(low * high)
        label = budget_label(fit.budget)
        parabolas[label] = [[t, fit.metric_at(t)] for t in (low, middle, high)]
        left_out = {e.name for e in fit.excluded}
        markers[label] = [[r.tokens, r.metric] for r in fit.runs if r.name not in left_out]
    excluded = [[r.tokens, r.metric] for fit in laws.fits for r in fit.runs
                if r.name in {e.name for e in fit.excluded} and math.isfinite(r.metric)]
    if excluded:
        markers["excluded"] = excluded
    isoflop = ScalingPlot(f"IsoFLOP {laws.metric}, ticks: minima", "tokens", laws.metric, True, False, {},
                          parabolas, markers, [*parabolas, *(["excluded"] if excluded else [])])
    budgets = [f.budget for f in laws.fits]
    ends = [budgets[0], max(budgets[-1], prediction.budget if prediction else 0.0)]
    scaling = ScalingPlot(
        "optimal tokens D*, parameters N*", "training FLOPs", "tokens, parameters", True, True,
        {"D*": [[c, laws.tokens_law.at(c)] for c in ends], "N*": [[c, laws.parameters_law.at(c)] for c in ends]},
        markers={"D*": [[f.budget, f.optimal_tokens] for f in laws.fits],
                 "N*": [[f.budget, f.optimal_parameters] for f in laws.fits],
                 **({"predicted": [[prediction.budget, prediction.tokens], [prediction.budget, prediction.parameters]]}
                    if prediction else {}),
                 **({"planned run": [[plan.candidate.budget, plan.candidate.tokens],
                                     [plan.candidate.budget, plan.candidate.parameters]]} if plan else {})},
        order=["D*", "N*", "predicted", "planned run"])
    minimum = ScalingPlot(
        f"minimum {laws.metric} vs compute", "training FLOPs", laws.metric, True, True,
        {"L*": [[c, (laws.saturating_law or laws.metric_law).at(c)] for c in ends]},
        markers={"L*": [[f.budget, f.optimal_metric] for f in laws.fits],
                 **({"predicted": [[prediction.budget, prediction.metric]]} if prediction else {})},
        order=["L*", "predicted"])
    return isoflop, scaling, minimum


def scaling_analysis(output_path: str, runs: Sequence[ScalingRun], metric: str, next_budget: float | None = None,
                     delta: float | None = None, scale: IsoFlopScale | None = None, vocab_size: int | None = None,
                     rejected: Sequence[RejectedCandidate] = (), flops: Mapping[str, float | None] | None = None
                     ) -> ScalingAnalysis:
    """Fit the scaling laws of `runs` (`fit_scaling_laws`), predict at `next_budget`, plan its run under the
    ladder's rules (`scale` and `vocab_size`, when given), and write the fits and laws as `scaling_laws.md`.

    `rejected`: the ladder's candidates not trained (recorded as they are); `flops`: each run's recorded FLOPs,
    by name (shown beside it). `ScalingFitError` when the runs determine no law.
    """
    laws = fit_scaling_laws(runs, metric, next_budget, delta)
    plan, note = None, None
    if next_budget is None:
        note = "no next budget was given"
    elif scale is None or vocab_size is None:
        note = "the runs were not given as an IsoFLOP sweep: there are no ladder rules to plan a run with"
    else:
        try:
            plan = plan_run(laws, next_budget, scale, vocab_size)
        except ScalingFitError as e:
            note = str(e)
    why = {e.name: e.reason for fit in laws.fits for e in fit.excluded}
    points = [RunPoint(r.name, fit.budget, int(r.tokens), int(r.parameters), (flops or {}).get(r.name), r.metric, w,
                       why.get(r.name))
              for fit in laws.fits for r, w in zip(fit.runs, fit.weights, strict=True)]
    fits = [BudgetSummary(budget_label(f.budget), f.budget, len(f.runs), f.a, f.b, f.c, f.delta, f.optimal_tokens,
                          f.optimal_parameters, f.optimal_metric, f.optimal_tokens / f.optimal_parameters)
            for f in laws.fits]
    isoflop, scaling, minimum = _plots(laws, laws.prediction, plan)
    analysis = ScalingAnalysis(
        metric=metric, alpha=laws.tokens_law.exponent, beta=laws.parameters_law.exponent,
        laws={"tokens": _law("D* = A·C^α", laws.tokens_law), "parameters": _law("N* = B·C^β", laws.parameters_law),
              "metric": _law(f"min {metric} = K·C^γ", laws.metric_law)},
        prediction=laws.prediction, next_run=plan, next_run_note=note, fits=fits, runs=points,
        rejected=list(rejected), isoflop_plot=isoflop, scaling_plot=scaling, metric_plot=minimum,
        parameters_method=PARAMETERS_METHOD, table_file=TABLE_FILE, metric_law_note=laws.metric_law_note,
        irreducible=laws.saturating_law.irreducible if laws.saturating_law else None)
    fs, target = fsspec.core.url_to_fs(join_path(output_path, TABLE_FILE))
    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(target, "w") as f:
        f.write(markdown(analysis))
    return analysis


def markdown(analysis: ScalingAnalysis) -> str:
    """The fits, the laws and the prediction as Markdown."""
    lines = [f"# Scaling laws of {analysis.metric}", "", "| budget | runs | D* | N* | D*/N* | min metric |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {f.label} | {f.runs} | {f.optimal_tokens:.4g} | {f.optimal_parameters:.4g} |"
              f" {f.tokens_per_parameter:.3g} | {f.optimal_metric:.4f} |" for f in analysis.fits]
    lines += ["", "| law | coefficient | exponent | log10 rms |", "|---|---|---|---|"]
    lines += [f"| {law.formula} | {law.coefficient:.4g} | {law.exponent:.4f} | {law.log10_rms:.3g} |"
              for law in analysis.laws.values()]
    if analysis.metric_law_note:
        lines += ["", f"L*: {analysis.metric_law_note}."]
    left_out = [r for r in analysis.runs if r.excluded]
    if left_out:
        lines += ["", "| excluded run | budget | metric | why |", "|---|---|---|---|"]
        lines += [f"| {r.name} | {r.budget:g} | {r.metric:.4g} | {r.excluded} |" for r in left_out]
    if analysis.prediction is not None:
        p = analysis.prediction
        interval = (f" (95 % interval {p.metric_low:.4f}–{p.metric_high:.4f})"
                    if p.metric_low is not None and p.metric_high is not None else "")
        lines += ["", f"At {p.budget:g} FLOPs: D* = {p.tokens:.4g} tokens, N* = {p.parameters:.4g} parameters,"
                      f" {analysis.metric} = {p.metric:.4f}{interval}."]
    if analysis.next_run is not None:
        c = analysis.next_run.candidate
        lines += [f"Planned run: {c.label}, {c.parameters:,} parameters, {c.tokens:,} tokens, lr {c.learning_rate:.4g};"
                  f" it should reach {analysis.next_run.predicted_metric:.4f}."]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, eq=False)
class ScalingLawsStep(Step):
    """A scaling-law analysis: what the optimal run and its check need to know at definition time."""

    metric: str = field(kw_only=True)
    next_budget: float | None = field(default=None, kw_only=True)
    sweep: IsoFlopSweep | None = field(default=None, kw_only=True)
    """The sweep analysed, when it was given as one: its rules and caches make the next run."""


def scaling_run(step_name: str, run: Step, budget: float, metric: str,
                sweep: IsoFlopSweep | None) -> tuple[ScalingRun, float | None]:
    """A run as the fit sees it (and its recorded FLOPs), from its training record; `ScalingAnalysisError` naming
    the analysis step and the run when the record lacks the metric, its size, or (in a sweep) misses its budget."""
    from marin_assets.core.record import load_result
    from marin_assets.pipeline.training.training_run import TrainResult

    result = load_result(run, TrainResult)
    where = f"step {step_name!r}: run {run.name!r}"
    value = run_metric(result, metric)
    if value is None:
        raise ScalingAnalysisError(f"{where} recorded no {metric} (it recorded {recorded_metrics(result) or 'none'});"
                                   f" analyse a metric every run has, or give the runs a validation set")
    if metric.startswith("eval/") and result.eval_curve and result.eval_curve[-1][0] < result.steps - 1:
        raise ScalingAnalysisError(f"{where}: its last evaluation was at step {result.eval_curve[-1][0]:g} of"
                                   f" {result.steps}, not at the end of the run")
    cost = result.cost
    tokens = cost.tokens if cost else result.train_tokens
    parameters = (cost.parameters if cost else None) or result.parameter_count
    if tokens is None or parameters is None:
        raise ScalingAnalysisError(f"{where}: its record has no token or parameter count (made by an older"
                                   " marin-assets); re-materialize it with force")
    flops = cost.total_flops if cost else None
    if sweep is not None:
        vocab = sweep.ladder.vocab_size
        if result.vocab_size is not None and result.vocab_size != vocab:
            raise ScalingAnalysisError(f"{where} trained with a vocabulary of {result.vocab_size}, but the ladder was"
                                       f" computed for {vocab}: its FLOPs miss the budget; give isoflop_sweep"
                                       f" vocab_size={result.vocab_size}")
        tolerance = sweep.ladder.scale.flop_tolerance
        if flops is not None and abs(flops / budget - 1) > tolerance:
            raise ScalingAnalysisError(f"{where} spent {flops:.4g} FLOPs, {flops / budget - 1:+.1%} off its budget"
                                       f" {budget:g} (flop_tolerance {tolerance:.1%})")
    return ScalingRun(run.name, budget, float(tokens), float(parameters), float(value)), flops


def scaling_laws_step(name: str, runs: IsoFlopSweep | Mapping[float, Sequence[Step]], metric: str = "eval/loss",
                      next_budget: float | None = None, delta: float | None = None) -> ScalingLawsStep:
    """The scaling laws of an IsoFLOP sweep (`isoflop_sweep`) — or of any runs given as budget → training steps —
    on `metric` (`METRICS`), with the prediction at `next_budget` and, for a sweep, the run to train there.

    `delta`: a fixed Huber threshold in metric units (None: robust, re-estimated; see `scaling_laws.py`). Its
    runs are its deps: a changed run changes its identity.

    Identity: `metric`, `next_budget`, `delta` (when given), a sweep's ladder (and `runs`).
    """
    try:
        check_metric(metric)
    except ValueError as e:
        raise StepDefinitionError(f"step {name!r}: {e}") from None
    if next_budget is not None and not (math.isfinite(next_budget) and next_budget > 0):
        raise StepDefinitionError(f"step {name!r}: next_budget must be positive and finite, got {next_budget}")
    if delta is not None and not delta > 0:
        raise StepDefinitionError(f"step {name!r}: the Huber threshold delta must be positive, got {delta}")
    sweep = runs if isinstance(runs, IsoFlopSweep) else None
    by_budget = runs.by_budget() if isinstance(runs, IsoFlopSweep) else runs
    grouped = {float(b): list(steps) for b, steps in by_budget.items()}
    if len(grouped) < 2:
        raise StepDefinitionError(f"step {name!r}: scaling laws need runs at two budgets or more, got"
                                  f" {[f'{b:g}' for b in grouped]}")
    if len({budget_label(b) for b in grouped}) != len(grouped):
        raise StepDefinitionError(f"step {name!r}: budgets {sorted(grouped)} print alike; give budgets that differ in"
                                  " their first 6 significant digits")
    seen: dict[str, float] = {}
    for budget, steps in grouped.items():
        if not (math.isfinite(budget) and budget > 0):
            raise StepDefinitionError(f"step {name!r}: budgets must be positive and finite, got {budget}")
        if len(steps) < MIN_RUNS_PER_BUDGET:
            raise StepDefinitionError(f"step {name!r}: budget {budget:g} has {len(steps)} run(s); a quadratic fit of"
                                      f" its {metric} needs at least {MIN_RUNS_PER_BUDGET}")
        for step in steps:
            if not isinstance(step, Step):
                raise StepDefinitionError(f"step {name!r}: budget {budget:g} lists {step!r}, which is not a step")
            if step.name in seen:
                raise StepDefinitionError(f"step {name!r}: run {step.name!r} is listed twice (budgets"
                                          f" {seen[step.name]:g} and {budget:g})")
            seen[step.name] = budget

    def run(out: str) -> ScalingAnalysis:
        read = [scaling_run(name, step, budget, metric, sweep) for budget, steps in grouped.items() for step in steps]
        try:
            return scaling_analysis(out, [r for r, _ in read], metric, next_budget, delta,
                                    sweep.ladder.scale if sweep else None, sweep.ladder.vocab_size if sweep else None,
                                    sweep.ladder.rejected if sweep else (), {r.name: f for r, f in read})
        except ScalingFitError as e:
            raise ScalingAnalysisError(f"step {name!r}: {e}") from None

    attrs: dict[str, Any] = {"metric": metric, "next_budget": next_budget,
                             "runs": {budget_label(b): [s.name for s in steps] for b, steps in grouped.items()}}
    if delta is not None:
        attrs["delta"] = delta
    if sweep is not None:
        attrs["ladder"] = sweep.definition()
    return ScalingLawsStep(name=name, fn=run, deps=[s for steps in grouped.values() for s in steps], hash_attrs=attrs,
                           kind="report", description=made_by(scaling_analysis), metric=metric,
                           next_budget=next_budget, sweep=sweep)


__all__ = ["METRICS", "TABLE_FILE", "BudgetSummary", "LawSummary", "PlannedRun", "RunPoint", "ScalingAnalysis",
           "ScalingAnalysisError", "ScalingLawsStep", "ScalingPlot", "check_metric", "markdown", "plan_run",
           "recorded_metrics", "run_metric", "scaling_analysis", "scaling_laws_step", "scaling_run"]
