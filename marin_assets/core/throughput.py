"""Throughput history: what earlier materializations measured, per kind of device and kind of step.

Each computed step leaves one small JSON file — its work (`core/estimate.py`), the seconds its function
took and the devices it had — at `{prefix}/.marin-throughput/{device kind}/{step kind}/{name}_{hash}.json`.
A prediction lists one folder, not the whole store; the folder is hidden, so `marin-assets gc` leaves it
alone, and a file is rewritten (not appended to) by a recompute, so concurrent writers never collide.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import fsspec

from marin_assets.core.files import atomic_write
from marin_assets.core.paths import join_path

HISTORY_DIR = ".marin-throughput"
MAX_SAMPLES = 64
"""The newest samples read per device and step kind: enough to fit, bounded on a large store."""


@dataclass(frozen=True)
class Sample:
    """One materialization's measurement."""

    step: str
    """`name_with_hash` of the step measured."""
    kind: str
    group: str | None
    """The estimate's group (None: the step has no work model)."""
    unit: str | None
    work: float | None
    """Work actually done, in `unit`."""
    seconds: float
    """Wall seconds of the function's own work (the record's `duration_s`)."""
    device: str
    devices: float
    tokens: float | None = None
    bytes: float | None = None
    steady_rate: float | None = None
    """Work per second per device once warm, when the step measured it (`WorkEstimate.steady_rate`)."""


def _folder(prefix: str, device: str, kind: str) -> str:
    return join_path(prefix, HISTORY_DIR, _safe(device), _safe(kind))


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text) or "-"


def write_sample(prefix: str, sample: Sample) -> None:
    """Record `sample` under the prefix (one file per step identity)."""
    name = _safe(sample.step.replace("/", "--"))
    atomic_write(join_path(_folder(prefix, sample.device, sample.kind), f"{name}.json"),
                 json.dumps(asdict(sample), sort_keys=True).encode())


class History:
    """The samples under a prefix, read once per (device, step kind) and kept for the life of the object."""

    def __init__(self, prefix: str, extra: Sequence[Sample] = ()) -> None:
        """`extra`: more samples (read from records: `pricing.recorded_samples`); a step's kept sample wins."""
        self.prefix = prefix
        self._read: dict[tuple[str, str], list[Sample]] = {}
        self._extra = list(extra)

    def samples(self, device: str, kind: str) -> list[Sample]:
        """The newest samples of `kind` steps on `device` devices (unreadable files are skipped)."""
        key = (device, kind)
        if key not in self._read:
            kept = self._load(device, kind)
            known = {s.step for s in kept}
            self._read[key] = kept + [s for s in self._extra
                                      if s.device == device and s.kind == kind and s.step not in known]
        return self._read[key]

    def add(self, sample: Sample) -> None:
        """Count a sample this process just kept, as if read (the newest first; replacing its step's older one)."""
        key = (sample.device, sample.kind)
        if key in self._read:
            self._read[key] = [sample, *(s for s in self._read[key] if s.step != sample.step)][:MAX_SAMPLES]

    def _load(self, device: str, kind: str) -> list[Sample]:
        fs, path = fsspec.core.url_to_fs(_folder(self.prefix, device, kind))
        try:
            entries = fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        files = sorted((e for e in entries if str(e.get("name", "")).endswith(".json")),
                       key=lambda e: _mtime(e), reverse=True)[:MAX_SAMPLES]
        found = []
        for entry in files:
            try:
                data: dict[str, Any] = json.loads(fs.cat_file(entry["name"]))
                found.append(Sample(**data))
            except (OSError, ValueError, TypeError):
                continue
        return found


def _mtime(entry: dict[str, Any]) -> float:
    for key in ("mtime", "updated", "LastModified", "last_modified"):
        value = entry.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if value is not None and hasattr(value, "timestamp"):
            return float(value.timestamp())
    return 0.0


@dataclass(frozen=True)
class Fit:
    """Seconds = fixed_s + work per device ÷ rate: throughput fitted to earlier samples."""

    rate: float
    """Work per second per device (FLOP/s, tokens/s, bytes/s)."""
    fixed_s: float
    """Seconds every run spends whatever its size (start-up, compilation, a final checkpoint)."""
    samples: int

    def seconds(self, work_per_device: float) -> float:
        return self.fixed_s + work_per_device / self.rate


def fit(samples: Sequence[Sample]) -> Fit | None:
    """Seconds as a fixed part plus work per device ÷ rate. Samples that measured their own steady rate give
    both parts each (the median of each is taken); otherwise a least-squares line with a non-negative fixed
    part when the samples differ in size, else a rate through the origin. None without a usable sample."""
    points: list[tuple[float, float, float | None]] = [  # (work per device, seconds, steady rate)
        (s.work / s.devices, s.seconds, s.steady_rate) for s in samples
        if s.work is not None and s.work > 0 and s.devices > 0 and s.seconds > 0]
    steady = [(x, y, r) for x, y, r in points if r is not None and r > 0]
    if steady:
        rate = statistics.median(r for _, _, r in steady)
        return Fit(rate, statistics.median(max(0.0, y - x / rate) for x, y, _ in steady), len(steady))
    if not points:
        return None
    xs = [x for x, _, _ in points]
    if len(set(xs)) >= 2:
        mx, my = statistics.fmean(xs), statistics.fmean(y for _, y, _ in points)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y, _ in points) / sxx
        fixed = my - slope * mx
        if slope > 0 and fixed >= 0:
            return Fit(1 / slope, fixed, len(points))
    slope = sum(x * y for x, y, _ in points) / sum(x * x for x in xs)  # through the origin
    return Fit(1 / slope, 0.0, len(points)) if slope > 0 else None


__all__ = ["HISTORY_DIR", "MAX_SAMPLES", "Fit", "History", "Sample", "fit", "write_sample"]
