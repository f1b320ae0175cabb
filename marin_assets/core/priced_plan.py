"""A plan's price: what the steps a plan would run are predicted to take and cost, as a table and as JSON.

`plan()` says which steps would run; `price_plan` predicts each of those (`core/pricing.py`) in the plan's
order, so a tokenize step that would run first hands its predicted bytes and tokens to what reads it; the
table is what `marin-assets plan` prints under the plan, and the budget guard reads the same totals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from marin_assets.core.plan import RUN, PlanRow
from marin_assets.core.prices import PriceTable, devices_of
from marin_assets.core.pricing import PricedPlan, price_steps, recorded_samples
from marin_assets.core.step import Step
from marin_assets.core.throughput import History


def price_plan(rows: Sequence[PlanRow], steps: Mapping[str, Step], prefix: str, prices: PriceTable,
               history: History | None = None) -> PricedPlan:
    """Predictions for the rows whose action is `run`, in the plan's (dependency) order. Without a `history`: the
    samples kept under the prefix, and those the records of `steps` give for the kinds of steps to run."""
    to_run = [steps[r.asset_key] for r in rows if r.action == RUN]
    if history is None:
        wanted = {(devices_of(s.resources).kind, s.kind) for s in to_run}
        history = History(prefix, recorded_samples(list(steps.values()), prefix, wanted) if to_run else ())
    return price_steps(to_run, prefix, prices, history)


def human_seconds(seconds: float | None) -> str:
    """`4.2 s`, `3m 05s`, `2h 10m`, `3d 4h`; `?` for unknown."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


def _number(value: float | None, digits: int = 3) -> str:
    return "?" if value is None else "0" if value == 0 else f"{value:.{digits}g}"


def plan_price_lines(priced: PricedPlan) -> list[str]:
    """The table `marin-assets plan` prints: per step that would run, then the total, then how each was found."""
    currency = priced.prices.currency
    if not priced.predictions:
        return ["nothing to run: no cost"]
    header = ("step", "devices", "FLOPs", "tokens", "wall", "device-h", f"cost {currency}", "basis")
    rows = [(p.step, f"{p.devices:g} × {p.device}", _number(p.work.flops if p.work else None),
             _number(p.work.tokens if p.work else None), human_seconds(p.wall_s), _number(p.device_hours),
             _number(p.cost), p.basis) for p in priced.predictions]
    t = priced.totals
    unknown = f" ({t['unknown_wall']} unknown)" if t["unknown_wall"] else ""
    rows.append((f"total: {t['steps']} step(s){unknown}", "", _number(t["flops"]), _number(t["tokens"]),
                 human_seconds(t["wall_s"]), _number(t["device_hours"]), _number(t["cost"]),
                 ", ".join(f"{n} {b}" for b, n in t["basis"].items() if n)))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(f"{c:<{w}}" if i in (0, 1, 7) else f"{c:>{w}}"
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [f"predicted cost (prices: {priced.prices.source}; wall: one after another) of the steps to run:",
           line(header), *[line(r) for r in rows[:-1]], line(rows[-1])]
    out += [f"  {p.step}: {p.how}" + (f" [{p.work.note}]" if p.work and p.work.note else "")
            for p in priced.predictions]
    return out


__all__ = ["human_seconds", "plan_price_lines", "price_plan"]
