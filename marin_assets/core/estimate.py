"""Work estimates: how much work a step will do, said by the step itself before it runs.

A step factory knows what its function will spend: a training run its FLOPs (model × steps × batch ×
context), a tokenize or curation step the bytes it reads. It gives the step an `estimate` function; the
pricing (`core/pricing.py`) turns the work into wall time, device-hours and money on the step's resources.
The same function, given the step's own result after it ran, says the work it actually did — so a
record holds the two side by side and earlier runs teach the throughput of later ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec

from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status

FLOPS, TOKENS, BYTES = "flops", "tokens", "bytes"
UNITS = (FLOPS, TOKENS, BYTES)


@dataclass(frozen=True)
class WorkEstimate:
    """What a step's function will do (or did): its work in one unit its wall time scales with, and the
    FLOPs, tokens and bytes behind it where known."""

    group: str
    """Steps whose throughput per unit of work is alike (`train`, `dpo`, `tokenize`, `curate/dedup`): a
    measured throughput is taken only from earlier steps of the same group on the same kind of device."""
    unit: str
    """`flops`, `tokens` or `bytes`: what `work` counts."""
    work: float | None
    """How much work, in `unit`; None when it cannot be known yet (its input is not materialized)."""
    flops: float | None = None
    """Model FLOPs (training: forward + backward), when the step does model arithmetic."""
    tokens: float | None = None
    """Tokens trained on or produced (a tokenize step's is a prediction from bytes until it ran)."""
    bytes: float | None = None
    """Bytes read."""
    note: str = ""
    """How the numbers were found, in words (`3 × forward FLOPs per token × 200 steps × 8 × 128 tokens`)."""
    steady_rate: float | None = None
    """After a run: the work per second per device the step itself measured once warm (a training run's median
    step throughput). It splits the run's wall time into a per-unit part and a fixed part (start-up,
    compilation, evaluation, checkpoints), so one earlier run predicts runs of other sizes."""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"work unit must be one of {UNITS}, got {self.unit!r}")
        if self.work is not None and not self.work >= 0:
            raise ValueError(f"work must be non-negative, got {self.work!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "unit": self.unit, "work": self.work, "flops": self.flops,
                "tokens": self.tokens, "bytes": self.bytes, "note": self.note, "steady_rate": self.steady_rate}


@dataclass(frozen=True)
class EstimateInputs:
    """What an estimate may read: upstream records and outputs under the prefix, the estimates of upstream
    steps not yet made, and — after the step ran — its own result."""

    prefix: str
    upstream: Mapping[str, WorkEstimate] = field(default_factory=dict)
    """Step name → the estimate of a dependency that would run first (its output does not exist yet)."""
    own_result: Any = None
    """The step's own result (as JSON) once it ran: the estimate then says the work actually done."""

    def result(self, step: Step) -> Any:
        """A dependency's recorded result (as JSON), or None when it has no successful output yet."""
        try:
            return read_record(step.output_path_under(self.prefix)).result
        except (RecordNotAvailableError, OSError, ValueError):
            return None

    def output_bytes(self, step: Step) -> int | None:
        """Bytes under a dependency's successful output folder (its data, not only its record); None if it has none."""
        out = step.output_path_under(self.prefix)
        status = read_status(out)
        if status is None or status.status is not Status.SUCCESS:
            return None
        fs, path = fsspec.core.url_to_fs(out)
        return int(fs.du(path, total=True))

    def upstream_bytes(self, step: Step) -> int | None:
        """A dependency's output bytes if it exists, else its predicted bytes (None when neither is known)."""
        found = self.output_bytes(step)
        if found is not None:
            return found
        predicted = self.upstream.get(step.name)
        return None if predicted is None or predicted.bytes is None else int(predicted.bytes)


Estimator = Callable[[EstimateInputs], WorkEstimate]
"""`estimate(inputs) -> WorkEstimate`: a step's work, before it runs (inputs.own_result None) or after."""


def bytes_read_estimate(group: str, inputs_of: Callable[[], list[Step]]) -> Estimator:
    """An estimate of a step whose time follows the bytes of its inputs (curation, tokenize-like copies)."""

    def estimate(inputs: EstimateInputs) -> WorkEstimate:
        sizes = [inputs.upstream_bytes(s) for s in inputs_of()]
        known = None if any(s is None for s in sizes) else float(sum(s for s in sizes if s is not None))
        names = ", ".join(s.name for s in inputs_of())
        note = f"bytes of {names}" if known is not None else f"{names} not materialized: size unknown"
        return WorkEstimate(group, BYTES, known, bytes=known, note=note)

    return estimate


__all__ = ["BYTES", "FLOPS", "TOKENS", "EstimateInputs", "Estimator", "WorkEstimate", "bytes_read_estimate"]
