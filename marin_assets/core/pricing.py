"""Pricing: a step's predicted wall time, device-hours and cost, with the basis of each number.

Work comes from the step (`Step.estimate`: FLOPs, tokens, bytes). Time comes from one of:

- `measured` — earlier materializations of the same kind and group of step on the same kind of device
  (`core/throughput.py`): seconds = fixed + work per device ÷ rate, fitted to them;
- `estimated` — FLOPs ÷ (peak FLOP/s × devices × assumed MFU), the peak from fray's datasheet table or the
  price file, the MFU from the price file (default `prices.DEFAULT_ASSUMED_MFU`);
- `unknown` — neither: no measurement, and no FLOPs or no peak (every CPU step's first run).

A step with no work model at all (an export, an evaluation) is predicted from the median of earlier steps
of its kind on the same devices, if any. Device-hours = wall × devices ÷ 3600 and cost = device-hours ×
the price table's price of the device kind. Wall time is the function's own work (a record's
`duration_s`), never start-up or waiting.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from marin_assets.core.estimate import BYTES, EstimateInputs, WorkEstimate
from marin_assets.core.prices import Devices, PriceTable, devices_of
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.step import Step, walk
from marin_assets.core.throughput import MAX_SAMPLES, History, Sample, fit, write_sample

MEASURED, ESTIMATED, UNKNOWN = "measured", "estimated", "unknown"


@dataclass(frozen=True)
class Prediction:
    """What running one step is predicted to take, and on what basis."""

    step: str
    kind: str
    work: WorkEstimate | None
    """The step's own estimate of its work; None: it has no work model (or it failed: see `how`)."""
    device: str
    devices: float
    wall_s: float | None
    device_hours: float | None
    cost: float | None
    basis: str
    """`measured`, `estimated` or `unknown`."""
    how: str
    """The basis in words: which samples or which peak and MFU, and any price missing."""

    def to_dict(self) -> dict[str, Any]:
        work = self.work.to_dict() if self.work is not None else None
        return {"step": self.step, "kind": self.kind, "work": work, "device": self.device, "devices": self.devices,
                "flops": self.work.flops if self.work else None, "tokens": self.work.tokens if self.work else None,
                "bytes": self.work.bytes if self.work else None, "wall_s": self.wall_s,
                "device_hours": self.device_hours, "cost": self.cost, "basis": self.basis, "how": self.how}


def work_of(step: Step, inputs: EstimateInputs) -> tuple[WorkEstimate | None, str]:
    """The step's estimate, or None and why not (no work model; the estimate raised)."""
    if step.estimate is None:
        return None, "no work model"
    try:
        return step.estimate(inputs), ""
    except Exception as e:  # an estimate is advice: it never stops a plan or a run
        return None, f"its estimate failed ({type(e).__name__}: {e})"


def predict(step: Step, inputs: EstimateInputs, history: History, prices: PriceTable) -> Prediction:
    """The step's predicted wall time, device-hours and cost on its resources (see the module docstring)."""
    work, why = work_of(step, inputs)
    devices = devices_of(step.resources)
    if work is not None:
        work = _tokens_as_measured(work, history.samples(devices.kind, step.kind))
    wall, basis, how = _wall(step, work, why, devices, history, prices)
    hours = wall * devices.count / 3600 if wall is not None else None
    price = prices.price(devices.kind)
    cost = hours * price if hours is not None and price is not None else None
    if hours is not None and price is None:
        how += f"; no price for {devices.kind} in {prices.source}"
    return Prediction(step.name, step.kind, work, devices.kind, devices.count, wall, hours, cost, basis, how)


def _tokens_as_measured(work: WorkEstimate, samples: Sequence[Sample]) -> WorkEstimate:
    """A step whose tokens follow from the bytes it reads (a tokenize step) predicts them at the tokens per byte its
    group measured before, where it did: its own rule of thumb ignores the tokenizer and any compression."""
    ratios = [s.tokens / s.bytes for s in samples
              if s.group == work.group and s.tokens and s.bytes and s.unit == BYTES]
    if work.unit != BYTES or work.bytes is None or work.tokens is None or not ratios:
        return work
    per_byte = statistics.median(ratios)
    return replace(work, tokens=work.bytes * per_byte,
                   note=f"{work.bytes:,.0f} bytes; tokens at {per_byte:.3g} per byte, measured by {len(ratios)} earlier"
                        f" {work.group} step(s)")


def _wall(step: Step, work: WorkEstimate | None, why: str, devices: Devices, history: History,
          prices: PriceTable) -> tuple[float | None, str, str]:
    samples = history.samples(devices.kind, step.kind)
    if work is None:
        if why == "no work model" and samples:
            seconds = statistics.median(s.seconds for s in samples)
            return seconds, MEASURED, (f"median of {len(samples)} earlier {step.kind} step(s) on {devices.kind}"
                                       " (no work model)")
        if why == "no work model":
            return None, UNKNOWN, f"no work model, and no earlier {step.kind} step on {devices.kind}"
        return None, UNKNOWN, why
    if work.work is None:
        return None, UNKNOWN, work.note or "work unknown"
    same = [s for s in samples if s.group == work.group and s.unit == work.unit]
    found = fit(same)
    if found is not None:
        per_device = work.work / devices.count
        return found.seconds(per_device), MEASURED, (
            f"measured: {found.samples} earlier {work.group} step(s) on {devices.kind}: {found.rate:.3g} {work.unit}/s"
            f" per device + {found.fixed_s:.3g} s fixed")
    peak = prices.peak(devices.kind)
    if work.flops and peak is not None:
        seconds = work.flops / (peak[0] * devices.count * prices.assumed_mfu)
        return seconds, ESTIMATED, (f"estimated: {work.flops:.3g} FLOPs ÷ ({peak[1]} × {devices.count:g} device(s)"
                                    f" × assumed MFU {prices.assumed_mfu:g})")
    missing = "no peak FLOP/s for it" if work.flops else f"no FLOP count for {work.group} work"
    return None, UNKNOWN, f"no earlier {work.group} step on {devices.kind}, and {missing}"


@dataclass(frozen=True)
class PricedPlan:
    """Predictions for the steps a plan would run, and their totals."""

    predictions: list[Prediction]
    prices: PriceTable
    totals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [p.to_dict() for p in self.predictions], "totals": self.totals,
                "prices": self.prices.to_dict()}

    def most_expensive(self, n: int = 3) -> list[Prediction]:
        """The `n` steps of largest cost (device-hours where no cost is known), largest first."""
        known = [p for p in self.predictions if p.device_hours is not None]
        return sorted(known, key=lambda p: (p.cost or 0.0, p.device_hours or 0.0), reverse=True)[:n]


def totals(predictions: Sequence[Prediction]) -> dict[str, Any]:
    """Sums over the steps (unknown numbers count 0, and how many were unknown is said); `wall_s` is the sum, the
    time of running them one after another."""
    def total(values: Iterable[float | None]) -> float:
        return float(sum(v for v in values if v is not None))

    return {
        "steps": len(predictions),
        "flops": total(p.work.flops if p.work else None for p in predictions),
        "tokens": total(p.work.tokens if p.work else None for p in predictions),
        "wall_s": total(p.wall_s for p in predictions),
        "device_hours": total(p.device_hours for p in predictions),
        "cost": total(p.cost for p in predictions),
        "unknown_wall": sum(p.wall_s is None for p in predictions),
        "unknown_cost": sum(p.cost is None for p in predictions),
        "basis": {b: sum(p.basis == b for p in predictions) for b in (MEASURED, ESTIMATED, UNKNOWN)},
    }


def price_steps(steps: Sequence[Step], prefix: str, prices: PriceTable, history: History | None = None) -> PricedPlan:
    """Predictions for `steps` (in dependency order: each would run after those before it), each estimate seeing
    the estimates of the steps before it as its upstream."""
    history = history or History(prefix)
    upstream: dict[str, WorkEstimate] = {}
    predictions = []
    for step in steps:
        prediction = predict(step, EstimateInputs(prefix, upstream), history, prices)
        if prediction.work is not None:
            upstream[step.name] = prediction.work
        predictions.append(prediction)
    return PricedPlan(predictions, prices, totals(predictions))


def unpriced(priced: PricedPlan, max_device_hours: float | None = None,
             max_cost: float | None = None) -> list[Prediction]:
    """The steps a budget cannot weigh: those for which a number it limits is unknown (device-hours under
    `max_device_hours`, cost under `max_cost`; with neither limit, cost). They count 0 against the budget."""
    def unknown(p: Prediction) -> bool:
        if max_device_hours is None and max_cost is None:
            return p.cost is None
        return (max_device_hours is not None and p.device_hours is None) or (max_cost is not None and p.cost is None)

    return [p for p in priced.predictions if unknown(p)]


UNPRICED_SHOWN = 5
"""How many unpriced steps a budget's words name; the rest are counted."""


def unpriced_words(steps: Sequence[Prediction]) -> str:
    """`2 step(s) could not be priced: a (why), b (why)`, the first UNPRICED_SHOWN named."""
    named = ", ".join(f"{p.step} ({p.how})" for p in steps[:UNPRICED_SHOWN])
    more = f" and {len(steps) - UNPRICED_SHOWN} more" if len(steps) > UNPRICED_SHOWN else ""
    return f"{len(steps)} step(s) could not be priced: {named}{more}"


def over_budget(priced: PricedPlan, max_device_hours: float | None = None, max_cost: float | None = None,
                refuse_unpriced: bool = False) -> str | None:
    """Why `priced` exceeds a budget (naming the steps that cost most), or None when it fits. Steps that could not
    be priced count 0, unless `refuse_unpriced`: then any of them refuses the plan, naming them."""
    t = priced.totals
    over = []
    if max_device_hours is not None and t["device_hours"] > max_device_hours:
        over.append(f"{t['device_hours']:.4g} device-hours > --max-device-hours {max_device_hours:g}")
    if max_cost is not None and t["cost"] > max_cost:
        over.append(f"{t['cost']:.4g} {priced.prices.currency} > --max-cost {max_cost:g}")
    missing = unpriced(priced, max_device_hours, max_cost)
    if refuse_unpriced and missing:
        refused = f"{unpriced_words(missing)}; --refuse-unpriced refuses a plan with any"
        return refused if not over else f"{_over_words(priced, over)}; {refused}"
    if not over:
        return None
    tail = f"; {unpriced_words(missing)}; they count 0" if missing else ""
    return _over_words(priced, over) + tail


def _over_words(priced: PricedPlan, over: Sequence[str]) -> str:
    top = "; ".join(f"{p.step} ({p.device_hours:.3g} device-hours"
                    + (f", {p.cost:.3g} {priced.prices.currency}" if p.cost is not None else "")
                    + f", {p.basis})" for p in priced.most_expensive())
    return f"the plan's {priced.totals['steps']} step(s) to run predict {' and '.join(over)}; most expensive: {top}"


def relative_error(predicted: float | None, actual: float | None) -> float | None:
    """(predicted − actual) ÷ actual: +0.5 predicted half again as much, −0.5 half as much."""
    if predicted is None or actual is None or actual <= 0:
        return None
    return (predicted - actual) / actual


def predicted_vs_actual(prediction: Prediction, seconds: float, actual: WorkEstimate | None,
                        prices: PriceTable) -> dict[str, Any]:
    """The record's comparison: the prediction made before the run, what the run measured, and the errors."""
    hours = seconds * prediction.devices / 3600
    price = prices.price(prediction.device)
    cost = hours * price if price is not None else None
    measured = {"wall_s": round(seconds, 6), "device_hours": hours, "cost": cost,
                "flops": actual.flops if actual else None, "tokens": actual.tokens if actual else None,
                "bytes": actual.bytes if actual else None, "work": actual.work if actual else None}
    predicted_work = prediction.work.work if prediction.work else None
    errors = {"wall_s": relative_error(prediction.wall_s, seconds),
              "device_hours": relative_error(prediction.device_hours, hours),
              "cost": relative_error(prediction.cost, measured["cost"]),
              "work": relative_error(predicted_work, measured["work"]),
              "tokens": relative_error(prediction.work.tokens if prediction.work else None, measured["tokens"])}
    return {"predicted": prediction.to_dict(), "actual": measured, "error": errors,
            "prices": prices.source, "currency": prices.currency}


def predict_for_run(step: Step, prefix: str) -> tuple[Prediction, PriceTable]:
    """The prediction a materialization records beside what it measures: made just before the function runs (its
    inputs exist, so its work is known), from the history under the prefix and the price table of
    `$MARIN_PRICES` (or the defaults)."""
    prices = PriceTable.load()
    return predict(step, EstimateInputs(prefix), recent_history(prefix), prices), prices


HISTORY_FOR_S = 60.0
"""How long a process reuses the history it read for run-time predictions: a run (or a Ray worker) materializing
thousands of steps lists each history folder once a minute instead of once per step (listing per step made a
graph of n steps cost O(n²)); a prediction missing the last minute's samples is as good."""

_RECENT: dict[str, tuple[float, History]] = {}
_RECENT_LOCK = threading.Lock()


def keep_sample(prefix: str, sample: Sample) -> None:
    """Keep a run's throughput under the prefix for later predictions, and in this process's recent history."""
    write_sample(prefix, sample)
    with _RECENT_LOCK:
        kept = _RECENT.get(prefix)
    if kept is not None:
        kept[1].add(sample)


def recent_history(prefix: str) -> History:
    """The history under `prefix` as this process read it in the last HISTORY_FOR_S seconds."""
    now = time.monotonic()
    with _RECENT_LOCK:
        kept = _RECENT.get(prefix)
        if kept is None or now - kept[0] > HISTORY_FOR_S:
            kept = _RECENT[prefix] = (now, History(prefix))
        return kept[1]


def measured_after_run(step: Step, prefix: str, seconds: float, result: Any, prediction: Prediction | None,
                       prices: PriceTable | None) -> tuple[dict[str, Any] | None, Sample]:
    """After the function ran: the record's predicted-vs-actual (None without a prediction) and the throughput
    sample to keep. The work done is the step's estimate given its own result."""
    actual = None
    if step.estimate is not None:
        try:
            actual = step.estimate(EstimateInputs(prefix, own_result=result))
        except Exception:  # the estimate is advice; the output already succeeded
            actual = None
    devices = devices_of(step.resources)
    sample = Sample(step.name_with_hash, step.kind, actual.group if actual else None, actual.unit if actual else None,
                    actual.work if actual else None, seconds, devices.kind, devices.count,
                    actual.tokens if actual else None, actual.bytes if actual else None,
                    actual.steady_rate if actual else None)
    comparison = (predicted_vs_actual(prediction, seconds, actual, prices)
                  if prediction is not None and prices is not None else None)
    return comparison, sample


def recorded_samples(steps: Sequence[Step], prefix: str, wanted: Collection[tuple[str, str]] | None = None,
                     limit: int = MAX_SAMPLES) -> list[Sample]:
    """Throughput samples read from the records of `steps` that succeeded — their seconds from the record, their work
    from their estimate given their own result — so outputs made before samples were kept (or under another
    prefix's history) still teach throughput. Only (device kind, step kind) pairs in `wanted` (None: all), at
    most `limit` each. Read-only."""
    found: list[Sample] = []
    per_kind: Counter[tuple[str, str]] = Counter()
    for step in walk(steps):
        key = (devices_of(step.resources).kind, step.kind)
        if (wanted is not None and key not in wanted) or per_kind[key] >= limit:
            continue
        try:
            record = read_record(step.output_path_under(prefix))
        except (RecordNotAvailableError, OSError, ValueError):
            continue
        found.append(measured_after_run(step, prefix, record.duration_s, record.result, None, None)[1])
        per_kind[key] += 1
    return found


def by_name(predictions: Sequence[Prediction]) -> Mapping[str, Prediction]:
    """Step name → its prediction."""
    return {p.step: p for p in predictions}


__all__ = ["ESTIMATED", "MEASURED", "UNKNOWN", "PricedPlan", "Prediction", "by_name", "measured_after_run",
           "over_budget", "predict", "predict_for_run", "predicted_vs_actual", "price_steps", "recorded_samples",
           "relative_error", "totals", "unpriced", "unpriced_words", "work_of"]
