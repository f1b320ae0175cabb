"""The compute-optimal run a scaling-law analysis predicts at its next budget, trained, and checked against the
prediction when it lands — what closes the loop of a ladder (Marin fits the laws; it does not test them).

Identity at definition time, shape at run time: the step's deps are the analysis — whose own identity covers
every run of the ladder, the metric and the next budget — and the caches it trains on; its hash_attrs are the
ladder's definition (rules, recipe, vocabulary) and the budget. So the step is known, cached and shown unsynced
like any other before the ladder has run. Its model, steps, batch and learning rate are read from the analysis
record when it runs (`ScalingAnalysis.next_run`) and it trains exactly as a ladder run would
(`IsoFlopSweep.run_step`). An analysis forced to recompute keeps its identity, and may plan another model:
the check then fails, saying the run must be forced too. Its record is a plain `TrainResult`: export and
evaluate it like any run. It is not a `TrainStep`, which states its model at definition time: per-checkpoint
evaluation and `from_checkpoint` cannot take it, and reports that gather `TrainStep`s (run costs, experiment
summaries) leave it out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.reports.scaling_analysis import (
    ScalingAnalysis,
    ScalingLawsStep,
    recorded_metrics,
    run_metric,
)
from marin_assets.pipeline.training.pretrain.isoflop import budget_label
from marin_assets.pipeline.training.training_run import LOSS_FELL, TrainResult


class OptimalRunError(ValueError):
    """The analysis planned no run, or the run's record lacks what the check compares."""


@dataclass(frozen=True)
class PredictionError:
    """A compute-optimal run against its prediction."""

    metric: str
    budget: float
    predicted: float
    """What the planned run should reach (`PlannedRun.predicted_metric`)."""
    actual: float
    """What it reached."""
    absolute_error: float
    """actual − predicted (positive: worse than predicted)."""
    relative_error: float
    """absolute_error ÷ predicted."""
    metric_at_optimum: float
    """The predicted minimum L* at this budget."""
    predicted_tokens: float
    """D* at this budget."""
    run_tokens: int
    predicted_parameters: float
    """N* at this budget."""
    run_parameters: int
    run_flops: float | None
    """Its recorded training FLOPs."""


def prediction_error(result: TrainResult, analysis: ScalingAnalysis) -> PredictionError:
    """How far a run's metric lies from what `analysis` planned it to reach."""
    plan = analysis.next_run
    if plan is None:
        raise OptimalRunError(f"the analysis planned no run: {analysis.next_run_note}")
    actual = run_metric(result, analysis.metric)
    if actual is None:
        raise OptimalRunError(f"the run recorded no {analysis.metric} (it recorded {recorded_metrics(result)})")
    error = actual - plan.predicted_metric
    cost = result.cost
    return PredictionError(
        metric=analysis.metric, budget=plan.candidate.budget, predicted=plan.predicted_metric, actual=actual,
        absolute_error=error, relative_error=error / plan.predicted_metric, metric_at_optimum=plan.metric_at_optimum,
        predicted_tokens=plan.optimal_tokens, run_tokens=cost.tokens if cost else (result.train_tokens or 0),
        predicted_parameters=plan.optimal_parameters,
        run_parameters=(cost.parameters if cost else None) or result.parameter_count or 0,
        run_flops=cost.total_flops if cost else None)


def prediction_check(analysis: ScalingLawsStep, tolerance: float) -> Check:
    """`metric_matches_prediction`: the run's metric within `tolerance` (relative) of the analysis's prediction;
    the predicted and actual values and both errors are its metadata. A run of another model than the analysis
    now plans (the analysis was recomputed after the run) fails, saying so."""

    def check(output_path: str, result: Any) -> CheckOutcome:
        from marin_assets.core.record import load_result
        from marin_assets.core.results import from_jsonable

        trained, record = from_jsonable(result, TrainResult), load_result(analysis, ScalingAnalysis)
        plan = record.next_run
        if plan is not None and trained.model is not None and trained.model != plan.candidate.model:
            return CheckOutcome(False, f"the run trained {trained.model}, but {analysis.name} now plans"
                                       f" {plan.candidate.model} (it was recomputed since): re-materialize this run"
                                       " with force")
        found = prediction_error(trained, record)
        passed = abs(found.relative_error) <= tolerance
        p = record.prediction
        interval: dict[str, Any] = {}
        said = ""
        if p is not None and p.metric_low is not None and p.metric_high is not None:
            inside = p.metric_low <= found.actual <= p.metric_high
            interval = {"interval_low": p.metric_low, "interval_high": p.metric_high, "within_interval": inside}
            where = "inside" if inside else "outside"
            said = f"; {where} the fit's 95 % interval {p.metric_low:.4f}–{p.metric_high:.4f}"
        return CheckOutcome(passed, f"{found.metric} {found.actual:.4f}, predicted {found.predicted:.4f}:"
                                    f" {found.absolute_error:+.4f} ({found.relative_error:+.2%}; tolerance"
                                    f" ±{tolerance:.1%}){said}", {**asdict(found), "tolerance": tolerance, **interval})

    return Check("metric_matches_prediction", check,
                 f"The run's {analysis.metric} is within ±{tolerance:.1%} of what the scaling laws of"
                 f" {analysis.name} predicted for it.")


@dataclass(frozen=True, eq=False)
class OptimalRunStep(Step):
    """The compute-optimal run of an analysis's next budget (a training run whose model is chosen at run time)."""

    analysis: ScalingLawsStep = field(kw_only=True)
    budget: float = field(kw_only=True)
    tolerance: float = field(kw_only=True)


def optimal_run_step(name: str, analysis: ScalingLawsStep, data: Mapping[str, Step] | None = None,
                     validation: Mapping[str, Step] | None = None, *, tolerance: float = 0.05) -> OptimalRunStep:
    """A training step of the run `analysis` plans at its next budget on `data` (default: the sweep's caches;
    `validation` likewise), checked against the prediction (`metric_matches_prediction`, pass within `tolerance`,
    relative).

    The analysis must be of an IsoFLOP sweep (its rules shape the run) with a next budget.

    Identity: the planned budget, the sweep's ladder, which caches of `data` and `validation` (and `analysis`, the
    caches); not `tolerance` (its check's).
    """
    if not isinstance(analysis, ScalingLawsStep):
        raise StepDefinitionError(f"step {name!r}: {analysis!r} is not a scaling-law analysis (scaling_laws_step)")
    sweep = analysis.sweep
    if sweep is None:
        raise StepDefinitionError(f"step {name!r}: analysis {analysis.name!r} was not given an IsoFLOP sweep, so it"
                                  " has no ladder rules to shape a run with; make it from isoflop_sweep(...)")
    if analysis.next_budget is None:
        raise StepDefinitionError(f"step {name!r}: analysis {analysis.name!r} has no next_budget to train at")
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise StepDefinitionError(f"step {name!r}: tolerance must be positive, got {tolerance}")
    train = dict(sweep.train if data is None else data)
    held = dict(sweep.validation if validation is None else validation)
    if not train:
        raise StepDefinitionError(f"step {name!r}: no training data (data is empty)")
    budget = analysis.next_budget

    def run(out: str) -> TrainResult:
        from marin_assets.core.record import load_result

        plan = load_result(analysis, ScalingAnalysis).next_run
        if plan is None:
            reason = load_result(analysis, ScalingAnalysis).next_run_note
            raise OptimalRunError(f"step {name!r}: analysis {analysis.name!r} planned no run at {budget:g}: {reason}")
        result: TrainResult = sweep.run_step(name, plan.candidate, train, held).fn(out)
        return result

    components = {**train, **held}
    return OptimalRunStep(
        name=name, fn=run, deps=[analysis, *(components[k] for k in sorted(components))],
        hash_attrs={"budget": budget, "ladder": sweep.definition(), "train": sorted(train),
                    "validation": sorted(held)},
        kind="train", kinds=["levanter", "jax"], checks=[LOSS_FELL, prediction_check(analysis, tolerance)],
        description=(f"The compute-optimal run at {budget_label(budget)} FLOPs that {analysis.name} predicts: its"
                     f" model is the ladder's nearest the predicted N*, read from the analysis when it runs; checked"
                     f" against the predicted {analysis.metric} (±{tolerance:.1%}).\n\nMade by"
                     f" `{__name__}.optimal_run_step`."),
        analysis=analysis, budget=budget, tolerance=tolerance)


__all__ = ["OptimalRunError", "OptimalRunStep", "PredictionError", "optimal_run_step", "prediction_check",
           "prediction_error"]
