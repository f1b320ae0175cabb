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

Before that fit, runs far off the budget's curve are excluded and named (`outlying_runs`): a parabola through
every three runs, the one fitting most runs best (least trimmed squares), and a run off it by more than three
robust standard deviations and 5 % of its value is diverged or mis-logged. Huber alone cannot do this at the ends
of a ladder, where a parabola passes through an end run exactly and gives it a residual of 0.

Across budgets, D* = A·C^α, N* = B·C^β and the minimum metric L* = K·C^γ are least-squares lines in
log10–log10. L* is predicted at a next budget by L* = E + K·C^γ with an irreducible term where the ladder supports
one (four budgets or more, a minimum falling with compute, an E clear of the smallest minimum: on a planted
Chinchilla law five budgets half a decade apart predict the next within 0.3 %, where the pure power law misses by
2.4 %), else by the pure power law, with the reason recorded; the prediction carries a 95 % interval.

numpy only; every result is a frozen dataclass that a step can record.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

HUBER_K = 1.345
"""Huber's threshold in robust standard deviations: 95 % of least squares' efficiency on normal noise."""
MAD_TO_SD = 0.6745
"""median(|r|) ÷ this estimates σ of normal residuals."""
MIN_RUNS_PER_BUDGET = 3
MIN_ROBUST_POINTS = 7
"""With fewer points the Huber threshold is not estimated (it would be 0): least squares instead."""
OUTLIER_SIGMAS = 3.0
OUTLIER_FLOOR = 0.05
"""A run is excluded from its budget's fit when it lies off the high-breakdown parabola (`trimmed_quadratic`) by more
than `OUTLIER_SIGMAS` robust standard deviations and by more than `OUTLIER_FLOOR` of the parabola's value there:
a diverged or mis-logged run, not noise."""
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
    center, design = _centered_design(xs)
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


def _centered_design(xs: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean of x and the columns x², x, 1 of a quadratic in x − mean(x): log10 tokens of 5–7 make x², x and 1
    nearly collinear."""
    center = float(xs.mean())
    u = xs - center
    return center, np.column_stack([u**2, u, np.ones_like(u)])


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
class ExcludedRun:
    """A run left out of its budget's fit, and why."""

    name: str
    reason: str


def trimmed_quadratic(x: Sequence[float] | np.ndarray,
                      y: Sequence[float] | np.ndarray) -> tuple[np.ndarray, float, int]:
    """The high-breakdown start of a budget's fit: of the parabolas through every three points of distinct x, the one
    whose `h` smallest squared residuals sum least (least trimmed squares over all triples; `h` = n − ⌊(n − 3)/2⌋,
    so up to ⌊(n − 3)/2⌋ points may be anywhere). Unlike a least-squares or least-absolute-deviations start it cannot
    be bent by one point at either end of the ladder, where a parabola through an outlier fits it exactly.

    Returns the residuals of every point from that parabola, a robust standard deviation (1.4826 × the median
    |residual| of the `h` points it fits best) and `h`."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = len(xs)
    h = n - (n - 3) // 2
    _, design = _centered_design(xs)
    best: tuple[float, np.ndarray] | None = None
    for triple in itertools.combinations(range(n), 3):
        chosen = list(triple)
        if len(np.unique(xs[chosen])) < 3:
            continue
        coef = np.linalg.solve(design[chosen], ys[chosen])
        residual = ys - design @ coef
        trimmed = float(np.sort(residual**2)[:h].sum())
        if best is None or trimmed < best[0]:
            best = (trimmed, residual)
    if best is None:
        raise ScalingFitError(f"a quadratic needs three distinct x, got {sorted(set(xs.tolist()))}")
    residual = best[1]
    kept = np.sort(np.abs(residual))[:h]
    return residual, 1.4826 * float(np.median(kept)), h


def outlying_runs(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> dict[int, str]:
    """Index → why, for the points `trimmed_quadratic` finds off the budget's parabola (`OUTLIER_SIGMAS`,
    `OUTLIER_FLOOR`); at most ⌊(n − 3)/2⌋ of them, farthest first, and never so many that fewer than three distinct
    x remain."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(xs) < 4:
        return {}
    residual, sigma, h = trimmed_quadratic(xs, ys)
    fitted = ys - residual
    limit = np.maximum(OUTLIER_SIGMAS * sigma, OUTLIER_FLOOR * np.abs(fitted))
    out: dict[int, str] = {}
    for i in sorted((int(j) for j in np.flatnonzero(np.abs(residual) > limit)), key=lambda j: -abs(residual[j])):
        if len(out) >= len(xs) - h or len(np.unique(np.delete(xs, [*out, i]))) < 3:
            break
        side = "above" if residual[i] > 0 else "below"
        out[int(i)] = (f"its metric {ys[i]:.4g} is {abs(residual[i]):.3g} {side} the budget's high-breakdown"
                       f" parabola ({fitted[i]:.4g} there: {abs(residual[i]) / max(abs(fitted[i]), 1e-300):.1%},"
                       f" {abs(residual[i]) / max(sigma, 1e-300):.3g} robust σ): diverged or mis-logged")
    return out


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
    excluded: tuple[ExcludedRun, ...] = ()
    """Runs left out of the fit before it (their weight is 0), with why: off the high-breakdown parabola by far
    more than the others' scatter, or a metric that is not finite."""

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



def fit_budget(budget: float, runs: Sequence[ScalingRun], delta: float | None = None) -> BudgetFit:
    """The robust parabola of one budget's runs and its minimum; `ScalingFitError` naming the budget when the
    runs are too few, the parabola has no minimum, or the minimum lies outside the tokens sampled."""
    _check_runs(runs)
    others = sorted(r.name for r in runs if r.budget != budget)
    if others:
        raise ScalingFitError(f"budget {budget:g}: runs {others} spent another budget")
    ordered = tuple(sorted(runs, key=lambda r: (r.tokens, r.name)))
    why = {i: f"its metric is {r.metric} (diverged)" for i, r in enumerate(ordered) if not math.isfinite(r.metric)}
    finite = [i for i in range(len(ordered)) if i not in why]
    tokens = np.array([r.tokens for r in ordered])
    distinct = np.unique(tokens[finite])
    if len(distinct) < MIN_RUNS_PER_BUDGET:
        bad = f" ({', '.join(f'{ordered[i].name!r}: {w}' for i, w in why.items())})" if why else ""
        raise ScalingFitError(f"budget {budget:g}: {len(finite)} runs with a finite metric at {len(distinct)} distinct"
                              f" token counts; a quadratic fit needs at least {MIN_RUNS_PER_BUDGET}{bad}")
    x = np.log10(tokens)
    if delta is None:  # a fixed threshold is the caller's choice of how far a run may be: nothing excluded
        off = outlying_runs(x[finite], [ordered[i].metric for i in finite])
        why.update({finite[j]: reason for j, reason in off.items()})
    kept = [i for i in range(len(ordered)) if i not in why]
    fit = huber_quadratic(x[kept].tolist(), [ordered[i].metric for i in kept], delta)
    weights = [0.0] * len(ordered)
    for i, w in zip(kept, fit.weights, strict=True):
        weights[i] = w
    x = x[kept]
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
    parameters = _parameters_at(best, x, np.array([ordered[i].parameters for i in kept]))
    return BudgetFit(budget=budget, runs=ordered, weights=tuple(weights), a=fit.a, b=fit.b, c=fit.c, delta=fit.delta,
                     optimal_tokens=float(10**best), optimal_parameters=parameters,
                     optimal_metric=float(fit.a * best * best + fit.b * best + fit.c),
                     excluded=tuple(ExcludedRun(ordered[i].name, why[i]) for i in sorted(why)))


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
class SaturatingLaw:
    """L* = irreducible + coefficient · C^exponent (exponent < 0): the minimum metric falling toward a floor."""

    irreducible: float
    """E: what no budget gets below (the data's own entropy, for a loss)."""
    coefficient: float
    exponent: float
    rms: float
    """Root mean square of the fit's residuals, in the metric's units."""

    def at(self, budget: float) -> float:
        return self.irreducible + self.coefficient * budget**self.exponent


MIN_BUDGETS_FOR_IRREDUCIBLE = 4
"""E + K·C^γ has three parameters: from four budgets up one is left to check them (five, half a decade apart,
pin E within a fraction of a percent of the prediction on a planted Chinchilla law)."""


def fit_saturating_law(budgets: Sequence[float], values: Sequence[float]) -> tuple[SaturatingLaw | None, str]:
    """L* = E + K·C^γ by least squares in the metric's units (E profiled: for each E in [0, min L*), the power law of
    L* − E is a line in log–log), or None and why the ladder cannot support it: fewer than
    `MIN_BUDGETS_FOR_IRREDUCIBLE` budgets, a minimum that does not fall with compute, or an E pressed against the
    smallest minimum (the budgets do not show the curve bending)."""
    cs, ys = np.asarray(budgets, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if len(np.unique(cs)) < MIN_BUDGETS_FOR_IRREDUCIBLE:
        return None, (f"{len(np.unique(cs))} budgets: an irreducible term needs {MIN_BUDGETS_FOR_IRREDUCIBLE} (three"
                      " parameters and one to check them); a pure power law instead")
    if not np.all(ys > 0):
        return None, "a minimum that is not positive; a pure power law instead"
    top = float(ys.min())
    lc = np.log10(cs)

    def fit_at(e: float) -> tuple[float, float, float]:
        exponent, intercept = np.polyfit(lc, np.log10(ys - e), 1)
        residual = ys - (e + 10**intercept * cs**exponent)
        return float(np.sum(residual**2)), float(10**intercept), float(exponent)

    grid = top * np.linspace(0.0, 1.0 - 1e-6, 401)
    errors = [fit_at(float(e))[0] for e in grid]
    i = int(np.argmin(errors))
    lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(200):  # golden-section search between the grid's neighbours of its best point
        m1, m2 = hi - golden * (hi - lo), lo + golden * (hi - lo)
        if fit_at(m1)[0] <= fit_at(m2)[0]:
            hi = m2
        else:
            lo = m1
    e = (lo + hi) / 2
    sse, coefficient, exponent = fit_at(e)
    if not exponent < 0:
        return None, f"the minimum does not fall with compute (γ = {exponent:.3g}); a pure power law instead"
    if e <= top * 1e-3:
        return None, f"the irreducible term fits at {e:.3g}, none: a pure power law"
    if e >= top * (1 - 1e-3):
        return None, (f"the irreducible term is pressed against the smallest minimum ({e:.4g} of {top:.4g}): the"
                      " budgets do not show the curve bending; a pure power law instead")
    law = SaturatingLaw(irreducible=e, coefficient=coefficient, exponent=exponent, rms=math.sqrt(sse / len(ys)))
    return law, f"L* = E + K·C^γ fitted on {len(ys)} budgets (E = {e:.4g})"


def _t_quantile(dof: int) -> float:
    """Student's t at 97.5 % (a 95 % two-sided interval) for `dof` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


def prediction_interval(f: Any, theta: np.ndarray, budgets: np.ndarray, values: np.ndarray,
                        budget: float) -> tuple[float, float] | None:
    """The 95 % interval of `f(budget, θ)` from the fit's residuals (delta method: the parameters' covariance from the
    Jacobian at θ, scaled by the residual variance, Student's t); None when no degree of freedom is left."""
    dof = len(values) - len(theta)
    if dof < 1:
        return None
    residual = values - np.array([f(c, theta) for c in budgets])
    sigma2 = float(residual @ residual) / dof
    step = 1e-6 * np.maximum(np.abs(theta), 1e-3)

    def gradient(c: float) -> np.ndarray:
        return np.array([(f(c, theta + np.eye(len(theta))[k] * step[k]) - f(c, theta - np.eye(len(theta))[k] * step[k]))
                         / (2 * step[k]) for k in range(len(theta))])

    jacobian = np.array([gradient(float(c)) for c in budgets])
    covariance = sigma2 * np.linalg.pinv(jacobian.T @ jacobian)
    g = gradient(budget)
    half = _t_quantile(dof) * math.sqrt(max(float(g @ covariance @ g), 0.0))
    centre = f(budget, theta)
    return centre - half, centre + half


@dataclass(frozen=True)
class ScalingPrediction:
    """The compute-optimal run of a budget as the laws predict it."""

    budget: float
    tokens: float
    """D* = A·C^α."""
    parameters: float
    """N* = B·C^β."""
    metric: float
    """L*: what that run should reach (E + K·C^γ where the ladder supports an irreducible term, else K·C^γ)."""
    metric_low: float | None = None
    metric_high: float | None = None
    """The 95 % interval of `metric` from the fit's residuals across budgets (None: no degree of freedom left)."""


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
    saturating_law: SaturatingLaw | None = None
    """L* = E + K·C^γ where the ladder supports it (`fit_saturating_law`): then what predicts L*."""
    metric_law_note: str = ""
    """Which law of L* predicts, and why (the reason an irreducible term was not fitted)."""

    def predict(self, budget: float) -> ScalingPrediction:
        """The compute-optimal run at `budget` as these laws predict it."""
        if not (math.isfinite(budget) and budget > 0):
            raise ScalingFitError(f"a budget to predict at must be positive and finite, got {budget}")
        budgets = np.array([f.budget for f in self.fits])
        values = np.array([f.optimal_metric for f in self.fits])
        if self.saturating_law is not None:
            law = self.saturating_law
            theta = np.array([law.irreducible, math.log10(law.coefficient), law.exponent])
            interval = prediction_interval(_saturating, theta, budgets, values, budget)
            metric = law.at(budget)
        else:
            theta = np.array([math.log10(self.metric_law.coefficient), self.metric_law.exponent])
            interval = prediction_interval(_power, theta, budgets, values, budget)
            metric = self.metric_law.at(budget)
        low, high = interval if interval is not None else (None, None)
        return ScalingPrediction(budget=budget, tokens=self.tokens_law.at(budget),
                                 parameters=self.parameters_law.at(budget), metric=metric, metric_low=low,
                                 metric_high=high)


def _most_influential(fit: BudgetFit) -> ScalingRun:
    """The fitted run whose removal moves the parabola's minimum most (least squares without it)."""
    kept = [r for r, w in zip(fit.runs, fit.weights, strict=True) if w > 0]
    x = np.log10([r.tokens for r in kept])
    y = np.array([r.metric for r in kept])

    def minimum(mask: np.ndarray) -> float:
        a, b, c = np.polyfit(x[mask], y[mask], 2)
        return float(c - b * b / (4 * a)) if a > 0 else -math.inf

    whole = minimum(np.ones(len(kept), dtype=bool))
    shifts = [abs(minimum(np.arange(len(kept)) != i) - whole) for i in range(len(kept))]
    return kept[int(np.argmax(shifts))]


def _saturating(budget: float, theta: np.ndarray) -> float:
    return float(theta[0] + 10 ** theta[1] * budget ** theta[2])


def _power(budget: float, theta: np.ndarray) -> float:
    return float(10 ** theta[0] * budget ** theta[1])


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
    for fit in fits:
        if not fit.optimal_metric > 0:
            worst = _most_influential(fit)
            raise ScalingFitError(f"budget {fit.budget:g}: the fitted minimum {metric} is {fit.optimal_metric:.4g}, not"
                                  f" positive, so no power law of it; the run that moves it most is {worst.name!r}"
                                  f" ({metric} {worst.metric:.4g}): check it, or leave it out")
    minima = [f.optimal_metric for f in fits]
    saturating, note = fit_saturating_law(budgets, minima)
    laws = ScalingLaws(
        metric=metric, fits=fits,
        tokens_law=fit_power_law(budgets, [f.optimal_tokens for f in fits], "optimal tokens"),
        parameters_law=fit_power_law(budgets, [f.optimal_parameters for f in fits], "optimal parameters"),
        metric_law=fit_power_law(budgets, minima, f"the minimum {metric}"),
        prediction=None, saturating_law=saturating, metric_law_note=note)
    return laws if next_budget is None else replace(laws, prediction=laws.predict(next_budget))


__all__ = ["HUBER_K", "MAD_TO_SD", "MIN_BUDGETS_FOR_IRREDUCIBLE", "MIN_ROBUST_POINTS", "MIN_RUNS_PER_BUDGET",
           "OUTLIER_FLOOR", "OUTLIER_SIGMAS", "PARAMETERS_METHOD", "BudgetFit", "ExcludedRun", "PowerLaw",
           "RobustQuadratic", "SaturatingLaw", "ScalingFitError", "ScalingLaws", "ScalingPrediction", "ScalingRun",
           "fit_budget", "fit_power_law", "fit_saturating_law", "fit_scaling_laws", "huber_quadratic",
           "outlying_runs", "prediction_interval", "trimmed_quadratic"]
