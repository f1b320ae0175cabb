"""Scaling laws from an IsoFLOP ladder: per budget the compute-optimal tokens D* and parameters N*, across
budgets their power laws, and the metric the compute-optimal run of a next budget should reach.

Per budget C, the metric of its runs is fitted by a quadratic in x = log10(tokens) under Huber's loss
(iteratively reweighted least squares from a least-absolute-deviations start; the threshold 1.345 robust
standard deviations of the residuals, re-estimated each iteration), so one bad run — diverged, mis-logged —
does not move the minimum. A robust scale needs more points than the fit has coefficients: with fewer than
`MIN_ROBUST_POINTS` (7 = 2 × 3 + 1) the median residual is forced to 0 — least absolute deviations passes
through three of four or five points exactly — and Huber would drop the others as outliers, so a budget with
so few runs is fitted by least squares (every weight 1). Marin fits Huber with a fixed threshold of 1.0
metric units, which on losses near 1 is plain least squares; a fixed `delta` is still accepted. The
parabola's minimum is D*; a parabola opening downward, or a minimum outside the tokens sampled, is refused:
the ladder does not bracket that budget's optimum.

N* is interpolated at D* from the runs' own parameter counts (linearly in log–log between the two runs
around it): along a ladder parameters and tokens trade through the project's FLOPs per token, attention
and the LM head included, which C ≈ 6·N·D misses at small scale.

Across budgets, D* = A·C^α, N* = B·C^β and the minimum metric L* = K·C^γ are least-squares lines in
log10–log10. The last predicts the metric of the compute-optimal run at a next budget: a pure power law,
since the saturating L = E + A·C^−γ needs more (and more widely spread) budgets than a ladder has to pin E.

numpy only; every result is a frozen dataclass that a step can record.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

HUBER_K = 1.345
"""Huber's threshold in robust standard deviations: 95 % of least squares' efficiency on normal noise."""
MAD_TO_SD = 0.6745
"""median(|r|) ÷ this estimates σ of normal residuals."""
MIN_RUNS_PER_BUDGET = 3
MIN_ROBUST_POINTS = 7
"""With fewer points the Huber threshold is not estimated (it would be 0): least squares instead."""
PARAMETERS_METHOD = ("N* interpolated at D* from the budget's runs' parameter counts, linearly in log10(tokens)–"
                     "log10(parameters) between the two runs around D* (the project's FLOPs per token, not 6·N·D)")


class ScalingFitError(ValueError):
    """The runs do not determine a scaling law: too few, non-convex, or an optimum outside the ladder."""


@dataclass(frozen=True)
class ScalingRun:
    """One finished run of a ladder: the budget it spent, its size and tokens, and the metric it reached."""

    name: str
    budget: float
    """The training-FLOP budget of its ladder rung (the nominal one: runs of one budget are grouped by it)."""
    tokens: float
    parameters: float
    metric: float
    """Lower is better (a loss, bits per byte)."""


@dataclass(frozen=True)
class RobustQuadratic:
    """y ≈ a·x² + b·x + c under Huber's loss, and how much each point counted."""

    a: float
    b: float
    c: float
    weights: tuple[float, ...]
    """The last iteration's weights, in the order of the points: 1 inside the threshold, threshold ÷ |residual|
    outside it (a bad run's weight is near 0)."""
    delta: float
    """The Huber threshold of the last iteration, in y's units (least squares: the largest |residual|)."""
    iterations: int


def huber_quadratic(x: Sequence[float], y: Sequence[float], delta: float | None = None,
                    max_iterations: int = 10_000) -> RobustQuadratic:
    """The quadratic through (x, y) minimizing Huber's loss, by iteratively reweighted least squares.

    `delta`: the threshold in y's units; None re-estimates it each iteration as 1.345 × median(|residual|) ÷
    0.6745 — from `MIN_ROBUST_POINTS` points up; with fewer, the fit is least squares and `delta` its largest
    |residual| (every weight 1). Starts from least absolute deviations. Needs three distinct x
    (`ScalingFitError` otherwise). The threshold and the fit settle together, sometimes slowly (a thousand
    iterations of a three-column least squares on some ladders: milliseconds), hence the generous
    `max_iterations`.
    """
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ScalingFitError(f"x and y must be sequences of one length, got shapes {xs.shape} and {ys.shape}")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ScalingFitError("x and y must be finite")
    if len(np.unique(xs)) < 3:
        raise ScalingFitError(f"a quadratic needs three distinct x, got {sorted(set(xs.tolist()))}")
    if delta is not None and not delta > 0:
        raise ScalingFitError(f"the Huber threshold must be positive, got {delta}")
    center = float(xs.mean())  # fitted in x − mean(x): log10 tokens of 5–7 make x², x and 1 nearly collinear
    u = xs - center
    design = np.column_stack([u**2, u, np.ones_like(u)])
    floor = 1e-12 * (1.0 + float(np.max(np.abs(ys))))  # residuals this small are rounding: the fit is exact there
    if delta is None and len(xs) < MIN_ROBUST_POINTS:
        a, b, c = (float(v) for v in np.linalg.lstsq(design, ys, rcond=None)[0])
        largest = float(np.max(np.abs(ys - design @ np.array([a, b, c]))))
        return RobustQuadratic(a=a, b=b - 2 * a * center, c=a * center**2 - b * center + c,
                               weights=(1.0,) * len(xs), delta=max(largest, floor), iterations=0)
    coef = _least_absolute_deviations(design, ys, floor)
    iterations = 0
    while True:
        iterations += 1
        if iterations > max_iterations:
            raise ScalingFitError(f"the Huber fit did not converge in {max_iterations} iterations")
        residual = np.abs(ys - design @ coef)
        threshold = delta if delta is not None else max(HUBER_K * float(np.median(residual)) / MAD_TO_SD, floor)
        weights = np.minimum(1.0, threshold / np.maximum(residual, floor))
        new = _weighted_fit(design, ys, weights)
        done = np.max(np.abs(new - coef)) <= 1e-10 * (1.0 + float(np.max(np.abs(coef))))
        coef = new
        if done:
            break
    a, b, c = (float(v) for v in coef)
    return RobustQuadratic(a=a, b=b - 2 * a * center, c=a * center**2 - b * center + c,
                           weights=tuple(float(w) for w in weights), delta=float(threshold), iterations=iterations)


def _weighted_fit(design: np.ndarray, ys: np.ndarray, weights: np.ndarray) -> np.ndarray:
    root = np.sqrt(weights)
    return np.linalg.lstsq(design * root[:, None], ys * root, rcond=None)[0]


def _least_absolute_deviations(design: np.ndarray, ys: np.ndarray, floor: float, iterations: int = 100) -> np.ndarray:
    """Huber's starting point: the fit minimizing Σ|residual| (by reweighting with 1/|residual|). Started from
    least squares instead, one bad run at the bottom of a shallow parabola can bend it downward and inflate
    the residuals' scale enough that Huber's weights never set that run aside."""
    coef = np.linalg.lstsq(design, ys, rcond=None)[0]
    for _ in range(iterations):
        new = _weighted_fit(design, ys, 1.0 / np.maximum(np.abs(ys - design @ coef), floor))
        if np.max(np.abs(new - coef)) <= 1e-10 * (1.0 + float(np.max(np.abs(coef)))):
            return new
        coef = new
    return coef


@dataclass(frozen=True)
class BudgetFit:
    """One budget's runs, the robust parabola of their metric in log10(tokens), and its minimum."""

    budget: float
    runs: tuple[ScalingRun, ...]
    """Fewest tokens first."""
    weights: tuple[float, ...]
    """Each run's final Huber weight (near 0: the fit set it aside)."""
    a: float
    b: float
    c: float
    """metric ≈ a·x² + b·x + c with x = log10(tokens)."""
    delta: float
    """The Huber threshold, in metric units."""
    optimal_tokens: float
    """D*: the parabola's minimum."""
    optimal_parameters: float
    """N* (see `PARAMETERS_METHOD`)."""
    optimal_metric: float
    """The parabola's value at D*."""

    def metric_at(self, tokens: float) -> float:
        """The fitted parabola at `tokens` (for plotting the curve)."""
        x = math.log10(tokens)
        return self.a * x * x + self.b * x + self.c


def _check_runs(runs: Sequence[ScalingRun]) -> None:
    for run in runs:
        for name in ("budget", "tokens", "parameters"):
            value = getattr(run, name)
            if not (math.isfinite(value) and value > 0):
                raise ScalingFitError(f"run {run.name!r}: {name} must be positive and finite, got {value}")
        if not math.isfinite(run.metric):
            raise ScalingFitError(f"run {run.name!r}: its metric is {run.metric} (did it diverge?); leave it out"
                                  " of the analysis or train it again")


def fit_budget(budget: float, runs: Sequence[ScalingRun], delta: float | None = None) -> BudgetFit:
    """The robust parabola of one budget's runs and its minimum; `ScalingFitError` naming the budget when the
    runs are too few, the parabola has no minimum, or the minimum lies outside the tokens sampled."""
    _check_runs(runs)
    others = sorted(r.name for r in runs if r.budget != budget)
    if others:
        raise ScalingFitError(f"budget {budget:g}: runs {others} spent another budget")
    ordered = tuple(sorted(runs, key=lambda r: (r.tokens, r.name)))
    tokens = np.array([r.tokens for r in ordered])
    distinct = np.unique(tokens)
    if len(distinct) < MIN_RUNS_PER_BUDGET:
        raise ScalingFitError(f"budget {budget:g}: {len(ordered)} runs at {len(distinct)} distinct token counts; a"
                              f" quadratic fit needs at least {MIN_RUNS_PER_BUDGET}")
    x = np.log10(tokens)
    fit = huber_quadratic(x.tolist(), [r.metric for r in ordered], delta)
    sampled = f"the tokens sampled ({distinct[0]:.3g}–{distinct[-1]:.3g})"
    if not fit.a > 0:
        raise ScalingFitError(f"budget {budget:g}: the fitted parabola opens downward (a = {fit.a:.3g}), so it has no"
                              f" minimum: the metric does not rise on both sides of {sampled}; add smaller and"
                              " larger models at this budget, or check the runs for failures")
    best = -fit.b / (2 * fit.a)
    if not x[0] <= best <= x[-1]:
        side = ("fewer tokens: add larger models" if best < x[0] else "more tokens: add smaller models")
        at = f"{10**best:.3g}" if abs(best) < 300 else f"10^{best:.3g}"  # a near-flat parabola's is far out
        raise ScalingFitError(f"budget {budget:g}: the fitted minimum at {at} tokens lies outside"
                              f" {sampled}; the optimum is at {side} at this budget")
    parameters = _parameters_at(best, x, np.array([r.parameters for r in ordered]))
    return BudgetFit(budget=budget, runs=ordered, weights=fit.weights, a=fit.a, b=fit.b, c=fit.c, delta=fit.delta,
                     optimal_tokens=float(10**best), optimal_parameters=parameters,
                     optimal_metric=float(fit.a * best * best + fit.b * best + fit.c))


def _parameters_at(best: float, x: np.ndarray, parameters: np.ndarray) -> float:
    """log10 N interpolated at log10 D* = `best` over the runs (runs sharing a token count averaged in log)."""
    log_n = np.log10(parameters)
    xs = np.unique(x)
    ns = np.array([log_n[x == v].mean() for v in xs])
    return float(10 ** np.interp(best, xs, ns))


@dataclass(frozen=True)
class PowerLaw:
    """y = coefficient · C^exponent, fitted by least squares in log10–log10."""

    coefficient: float
    exponent: float
    log10_rms: float
    """Root mean square of the fit's residuals in log10(y) (0 through two points)."""

    def at(self, budget: float) -> float:
        return self.coefficient * budget**self.exponent


def fit_power_law(budgets: Sequence[float], values: Sequence[float], what: str = "values") -> PowerLaw:
    """The power law through (budget, value) pairs; `ScalingFitError` for fewer than two budgets or a value
    that is not positive."""
    cs, ys = np.asarray(budgets, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if len(np.unique(cs)) < 2:
        raise ScalingFitError(f"a power law of {what} needs at least two budgets, got {sorted(set(cs.tolist()))}")
    bad = [(float(c), float(y)) for c, y in zip(cs, ys, strict=True) if not (y > 0 and math.isfinite(y) and c > 0)]
    if bad:
        raise ScalingFitError(f"a power law of {what} needs positive values, got (budget, value) {bad}")
    lc, ly = np.log10(cs), np.log10(ys)
    exponent, intercept = np.polyfit(lc, ly, 1)
    residual = ly - (exponent * lc + intercept)
    return PowerLaw(coefficient=float(10**intercept), exponent=float(exponent),
                    log10_rms=float(np.sqrt(np.mean(residual**2))))


@dataclass(frozen=True)
class ScalingPrediction:
    """The compute-optimal run of a budget as the laws predict it."""

    budget: float
    tokens: float
    """D* = A·C^α."""
    parameters: float
    """N* = B·C^β."""
    metric: float
    """L* = K·C^γ: what that run should reach."""


@dataclass(frozen=True)
class ScalingLaws:
    """Per-budget optima of a ladder, the power laws across budgets, and a prediction at a next budget."""

    metric: str
    """The metric fitted (lower is better), e.g. `eval/loss`."""
    fits: tuple[BudgetFit, ...]
    """Smallest budget first."""
    tokens_law: PowerLaw
    """D* = A·C^α."""
    parameters_law: PowerLaw
    """N* = B·C^β."""
    metric_law: PowerLaw
    """L* = K·C^γ, the minimum metric per budget."""
    prediction: ScalingPrediction | None
    parameters_method: str = PARAMETERS_METHOD

    def predict(self, budget: float) -> ScalingPrediction:
        """The compute-optimal run at `budget` as these laws predict it."""
        if not (math.isfinite(budget) and budget > 0):
            raise ScalingFitError(f"a budget to predict at must be positive and finite, got {budget}")
        return ScalingPrediction(budget=budget, tokens=self.tokens_law.at(budget),
                                 parameters=self.parameters_law.at(budget), metric=self.metric_law.at(budget))


def fit_scaling_laws(runs: Sequence[ScalingRun], metric: str, next_budget: float | None = None,
                     delta: float | None = None) -> ScalingLaws:
    """Fit every budget of `runs`, then the power laws across budgets, and predict at `next_budget` (if given).

    `ScalingFitError` (naming the budget or run) when a budget's fit is refused or fewer than two budgets fit.
    """
    if not runs:
        raise ScalingFitError("no runs to fit")
    _check_runs(runs)
    names = [r.name for r in runs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ScalingFitError(f"runs {repeated} appear more than once")
    budgets = sorted({r.budget for r in runs})
    if len(budgets) < 2:
        raise ScalingFitError(f"scaling laws need at least two budgets, got {budgets[0]:g} only")
    fits = tuple(fit_budget(b, [r for r in runs if r.budget == b], delta) for b in budgets)
    laws = ScalingLaws(
        metric=metric, fits=fits,
        tokens_law=fit_power_law(budgets, [f.optimal_tokens for f in fits], "optimal tokens"),
        parameters_law=fit_power_law(budgets, [f.optimal_parameters for f in fits], "optimal parameters"),
        metric_law=fit_power_law(budgets, [f.optimal_metric for f in fits], f"the minimum {metric}"),
        prediction=None)
    return laws if next_budget is None else replace(laws, prediction=laws.predict(next_budget))


__all__ = ["HUBER_K", "MAD_TO_SD", "MIN_ROBUST_POINTS", "MIN_RUNS_PER_BUDGET", "PARAMETERS_METHOD", "BudgetFit",
           "PowerLaw", "RobustQuadratic", "ScalingFitError", "ScalingLaws", "ScalingPrediction", "ScalingRun",
           "fit_budget", "fit_power_law", "fit_scaling_laws", "huber_quadratic"]
