"""The budget guard of a Dagster run: run tags that refuse a run whose plan costs too much, before any work.

    dagster job execute -f definitions.py -j __ASSET_JOB -o '*checkpoints__big' \\
        --tags '{"marin/max-device-hours": "40"}'

Every step asset calls `check_run_budget` before its step function: it prices the plan of the run's whole
selection (`core/priced_plan.py`, the prices of `marin/prices` or `$MARIN_PRICES`) and, over a limit,
fails naming the steps that cost most. Steps that could not be priced count 0 and are named in the run's
log, or refuse the run when tagged `marin/refuse-unpriced=true`. The first asset to start sees the whole
plan, so nothing runs; the verdict is kept per run in the process, and an asset starting after others
succeeded prices only what is left. No budget tag: nothing is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dagster as dg

from marin_assets.core.lease import LeaseSettings
from marin_assets.core.plan import plan
from marin_assets.core.priced_plan import price_plan
from marin_assets.core.prices import PRICES_ENV, PriceFileError, PriceTable
from marin_assets.core.pricing import over_budget, unpriced, unpriced_words
from marin_assets.core.step import Step

MAX_DEVICE_HOURS_TAG = "marin/max-device-hours"
"""Run tag: refuse the run if what it would compute is predicted to take more device-hours."""
MAX_COST_TAG = "marin/max-cost"
"""Run tag: refuse the run if what it would compute is predicted to cost more (the price table's currency)."""
PRICES_TAG = "marin/prices"
"""Run tag: the price file (TOML) to price with; default `$MARIN_PRICES`, else the defaults."""
REFUSE_UNPRICED_TAG = "marin/refuse-unpriced"
"""Run tag: `true` refuses the run if any step it would compute could not be priced (by default they count 0
and are named in the run's log); alone, with no limit, it refuses steps without a predicted cost."""
BUDGET_TAGS = (MAX_DEVICE_HOURS_TAG, MAX_COST_TAG, REFUSE_UNPRICED_TAG)

_verdicts: dict[str, str | None] = {}
"""Run id → why it was refused (None: allowed), for the other assets of the run in this process."""


class BudgetTagError(ValueError):
    """A budget tag is not a non-negative number."""


def _limit(tags: dict[str, str], tag: str) -> float | None:
    value = tags.get(tag)
    if value is None or not value.strip():
        return None
    try:
        limit = float(value)
    except ValueError:
        raise BudgetTagError(f"run tag {tag}={value!r} is not a number") from None
    if not limit >= 0:
        raise BudgetTagError(f"run tag {tag}={value!r} is negative")
    return limit


def _flag(tags: dict[str, str], tag: str) -> bool:
    value = tags.get(tag, "").strip().lower()
    if value not in ("", "true", "false"):
        raise BudgetTagError(f"run tag {tag}={tags[tag]!r} is not true or false")
    return value == "true"


def run_steps(context: dg.AssetExecutionContext) -> list[Step]:
    """The steps of the assets the run materializes — its asset selection, else its op selection, else the job's
    (a partitioned asset: the step of the run's partition)."""
    layer = context.job_def.asset_layer
    keys: Iterable[dg.AssetKey] = context.run.asset_selection or layer.selected_asset_keys
    # `dagster job execute -o` selects ops: the run has no asset selection, and the job's layer has every asset.
    ops = None if context.run.asset_selection else context.job_def.resolved_op_selection  # the run's: unresolved
    found: list[Step] = []
    for key in keys:
        if not layer.asset_graph.has(key):
            continue
        assets_def = layer.asset_graph.get(key).assets_def
        if ops and assets_def.node_def.name not in ops:
            continue
        compute_fn: Any = getattr(assets_def.node_def, "compute_fn", None)
        family = getattr(compute_fn, "marin_partitioned", None)
        if family is not None:
            if context.has_partition_key:
                found.append(family.step_for(context.partition_key))
            continue
        step = getattr(compute_fn, "marin_step", None)
        if isinstance(step, Step):
            found.append(step)
    return found


def check_run_budget(context: dg.AssetExecutionContext, prefix: str, settings: LeaseSettings) -> None:
    """Fail (`dg.Failure`) when the run's tags set a budget its plan exceeds; nothing when they set none."""
    tags = dict(context.run.tags)
    if not any(tag in tags for tag in BUDGET_TAGS):
        return
    run_id = context.run.run_id
    if run_id not in _verdicts:
        _verdicts[run_id] = _verdict(context, tags, prefix, settings)
    refused = _verdicts[run_id]
    if refused:
        raise dg.Failure(description=f"run refused before any work by its budget tags: {refused}",
                         metadata={"refused": refused}, allow_retries=False)


def _verdict(context: dg.AssetExecutionContext, tags: dict[str, str], prefix: str,
             settings: LeaseSettings) -> str | None:
    try:
        max_hours, max_cost = _limit(tags, MAX_DEVICE_HOURS_TAG), _limit(tags, MAX_COST_TAG)
        refuse_unpriced = _flag(tags, REFUSE_UNPRICED_TAG)
    except BudgetTagError as e:
        return str(e)
    try:
        prices = PriceTable.load(tags.get(PRICES_TAG))
    except PriceFileError as e:
        named_by = f"run tag {PRICES_TAG}" if tags.get(PRICES_TAG) else f"${PRICES_ENV}"
        return f"{named_by}: {e}"
    steps = run_steps(context)
    names = {s.name for s in steps}
    rows = plan(steps, names, prefix, settings)
    priced = price_plan(rows, {s.name: s for s in steps}, prefix, prices)
    refused = over_budget(priced, max_hours, max_cost, refuse_unpriced)
    t = priced.totals
    context.log.info(f"budget: {t['steps']} step(s) to run, predicted {t['device_hours']:.4g} device-hours and"
                     f" {t['cost']:.4g} {prices.currency} ({t['unknown_wall']} without a prediction);"
                     f" limits {max_hours} device-hours, {max_cost} {prices.currency}: "
                     + ("refused" if refused else "allowed"))
    missing = unpriced(priced, max_hours, max_cost)
    if missing and not refused:
        context.log.warning(f"budget: {unpriced_words(missing)}; they count 0 against the budget (tag"
                            f" {REFUSE_UNPRICED_TAG}=true to refuse them)")
    return refused

__all__ = ["BUDGET_TAGS", "MAX_COST_TAG", "MAX_DEVICE_HOURS_TAG", "PRICES_TAG", "REFUSE_UNPRICED_TAG", "BudgetTagError",
           "check_run_budget", "run_steps"]
