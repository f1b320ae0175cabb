"""A speedrun-style table of what the training runs of a sweep or an experiment spent: parameters,
tokens, FLOPs, tokens/s, MFU, wall time, device-hours and final loss, one row per run (each run's
`RunCost`, measured by the runner, is in its record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by

if TYPE_CHECKING:
    from marin_assets.pipeline.training.training_run import TrainResult


TABLE_FILE = "run_costs.md"


@dataclass(frozen=True)
class RunCostRow:
    """One run in a speedrun-style table: size, tokens, FLOPs, speed, utilization, time and quality."""

    name: str
    """The training step's name."""
    parameters: int | None
    tokens: int | None
    flops_per_token: float | None
    total_flops: float | None
    tokens_per_second: float | None
    mfu: float | None
    """A fraction; against a measured peak where `peak` says `measured`."""
    peak: str | None
    """`datasheet` or `measured` (see the run's `cost.peak_source`)."""
    device: str | None
    """`count × device_kind`."""
    wall_seconds: float | None
    device_hours: float | None
    final_train_loss: float | None
    final_eval_loss: float | None
    final_eval_bpb: float | None
    """Bits per byte on the validation sets, when Levanter logged it."""


def run_cost_row(name: str, result: TrainResult) -> RunCostRow:
    """The table row of a training record; the cost columns are None for a record made before costs were."""
    cost = result.cost
    return RunCostRow(
        name=name, parameters=cost.parameters if cost else result.parameter_count,
        tokens=cost.tokens if cost else result.train_tokens,
        flops_per_token=cost.flops_per_token if cost else None, total_flops=cost.total_flops if cost else None,
        tokens_per_second=cost.tokens_per_second if cost else result.tokens_per_second,
        mfu=cost.mfu if cost else None, peak=cost.peak_basis if cost else None,
        device=f"{cost.device_count} × {cost.device_kind}" if cost else None,
        wall_seconds=cost.wall_seconds if cost else result.train_seconds,
        device_hours=cost.device_hours if cost else None,
        final_train_loss=result.final_train_loss, final_eval_loss=result.final_eval_loss,
        final_eval_bpb=result.final_eval_bpb,
    )


@record_type("run_cost_table")
@dataclass(frozen=True)
class RunCostTable:
    """Runs side by side, speedrun style; also written as a Markdown table (`run_costs.md`)."""

    rows: list[RunCostRow]
    """One per training run, in the order given."""
    table_file: str
    """The Markdown table under the output path."""


def run_cost_table(output_path: str, results: Mapping[str, TrainResult]) -> RunCostTable:
    """A row per training record (name → `TrainResult`), written as `run_costs.md` under `output_path`."""
    rows = [run_cost_row(name, result) for name, result in results.items()]
    path = join_path(output_path, TABLE_FILE)
    fs, target = fsspec.core.url_to_fs(path)
    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(target, "w") as f:
        f.write(markdown_table(rows))
    return RunCostTable(rows, TABLE_FILE)


_COLUMNS = [("run", "name", "{}"), ("params", "parameters", "{:,}"), ("tokens", "tokens", "{:,}"),
            ("FLOPs", "total_flops", "{:.3g}"), ("tokens/s", "tokens_per_second", "{:,.0f}"),
            ("MFU", "mfu", "{:.2%}"), ("peak", "peak", "{}"), ("device", "device", "{}"),
            ("wall s", "wall_seconds", "{:,.1f}"), ("device-h", "device_hours", "{:.4f}"),
            ("train loss", "final_train_loss", "{:.4f}"), ("eval loss", "final_eval_loss", "{:.4f}"),
            ("eval bpb", "final_eval_bpb", "{:.4f}")]


def markdown_table(rows: Sequence[RunCostRow]) -> str:
    """The rows as a Markdown table (— where a record has no value)."""
    lines = ["| " + " | ".join(title for title, _, _ in _COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for row in rows:
        cells = [("—" if getattr(row, key) is None else fmt.format(getattr(row, key))) for _, key, fmt in _COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def every_run_costed(output_path: str, result: dict) -> CheckOutcome:
    """Every row has a cost (a record made before costs were has none) with a positive MFU, at most 1 against
    a datasheet peak (above it the FLOP count would be wrong; a measured peak is only an estimate)."""
    rows = result.get("rows") or []
    uncosted = [r["name"] for r in rows if r.get("mfu") is None]
    odd = [r["name"] for r in rows if r.get("mfu") is not None
           and not (r["mfu"] > 0 and (r["mfu"] <= 1 or r.get("peak") != "datasheet"))]
    problems = ([f"no cost recorded for {uncosted} (re-materialize them to record one)"] if uncosted else []) + (
        [f"MFU not in (0, 1] against a datasheet peak for {odd}"] if odd else [])
    return CheckOutcome(not problems, "; ".join(problems) or f"{len(rows)} runs costed",
                        {"runs": len(rows), "uncosted": len(uncosted)})


EVERY_RUN_COSTED = Check("every_run_costed", every_run_costed,
                         "Every training run in the table recorded its cost, with a plausible MFU.")


def run_costs_step(name: str, runs: Sequence[Step]) -> Step:
    """A speedrun-style table of the training steps among `runs` (a sweep's steps, an experiment's): their
    evaluation and other steps are left out; rows follow the order given.

    Identity: the names of the training steps among `runs` (and those steps).
    """
    from marin_assets.pipeline.training.training_run import TrainStep

    trains = [s for s in runs if isinstance(s, TrainStep)]
    if not trains:
        raise StepDefinitionError(f"step {name!r}: none of the {len(runs)} steps given is a training step"
                                  " (made by train_step); give the steps of a sweep or of an experiment")

    def run(out: str) -> RunCostTable:
        from marin_assets.core.record import load_result
        from marin_assets.pipeline.training.training_run import TrainResult

        return run_cost_table(out, {s.name: load_result(s, TrainResult) for s in trains})

    return Step(name=name, fn=run, deps=trains, hash_attrs={"runs": [s.name for s in trains]}, kind="report",
                description=made_by(run_cost_table), checks=[EVERY_RUN_COSTED])
