"""Prices and peaks: what a device-hour costs, and how fast a device can go, per kind of device.

A step's resources name its devices (`Resources(gpu=8, gpu_type="H100")`, `tpu_type="v5e-16"`, or CPU
cores); `devices_of` turns them into a device kind and a count, the unit device-hours and prices are in.
The price table is the user's: `DEFAULT_PRICES` (on-demand list prices per device-hour, rounded; documented
in the README) until a TOML file replaces or extends them — `marin-assets plan --prices FILE`, or the file
named by `$MARIN_PRICES` for plans and for the predictions runs record. Peaks come from fray's datasheet
table (the one Levanter's MFU uses); a kind the table lacks (every CPU) has no peak unless the file gives one.

    # prices.toml
    currency = "USD"
    replace_defaults = false       # true: only the kinds below have prices
    assumed_mfu = 0.4              # FLOPs ÷ (peak × this) = the wall time of an "estimated" prediction
    [per_device_hour]              # device kind → price of one device for one hour
    h100 = 2.5
    cpu = 0.02                     # per core-hour
    [peak_flops]                   # device kind → peak FLOP/s per device, beside / over the datasheet
    cpu = 5e10
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marin_assets.core.step import Resources

PRICES_ENV = "MARIN_PRICES"
"""Environment variable naming a price file (TOML) used when no `--prices` is given."""

DEFAULT_PRICES: dict[str, float] = {
    "cpu": 0.04,        # one core (vCPU with ~4 GiB), an n2-standard-class VM
    "t4": 0.35, "l4": 0.70, "a10g": 1.00, "a100": 3.70, "a100-80g": 5.10, "h100": 11.00, "h200": 12.00,
    "b200": 14.00,
    "v4": 3.22, "v5litepod": 1.20, "v5p": 4.20, "v6e": 2.70,
}
"""Price of one device for one hour, in USD, by device kind (lower-case fray names; `cpu` is per core):
on-demand list prices of a large cloud, rounded, as a starting point only — spot, committed-use and
other clouds differ by 2–4×, so set your own (`PriceTable.load`)."""

DEFAULT_ASSUMED_MFU = 0.35
"""Model FLOPs utilization assumed where no earlier run measured one: a well-tuned dense transformer
reaches 0.35–0.55 on GPUs and TPUs; small models reach far less, which measured throughput corrects."""

_TPU_CHIPS_PER_SUFFIX = {"v2": 0.5, "v3": 0.5, "v4": 0.5, "v5p": 0.5, "v5litepod": 1.0, "v6e": 1.0}
"""A TPU type's suffix counts TensorCores (v2–v4, v5p: 2 per chip) or chips (v5e, v6e)."""


class PriceFileError(ValueError):
    """A price file cannot be read or has a bad entry."""


@dataclass(frozen=True)
class Devices:
    """What a step runs on, in the units of price tables: a device kind and how many of them."""

    kind: str
    """`cpu` (count = cores), a GPU kind (`h100`, or `gpu` for any), a TPU generation (`v4`, `v5litepod`)."""
    count: float

    def __str__(self) -> str:
        return f"{self.count:g} × {self.kind}"


def devices_of(resources: Resources) -> Devices:
    """The devices `resources` ask for: a TPU slice's chips, else the GPUs, else the CPU cores (of every host)."""
    if resources.tpu_type:
        generation, _, size = resources.tpu_type.lower().partition("-")
        generation = {"v5e": "v5litepod", "v5lite": "v5litepod", "v6lite": "v6e"}.get(generation, generation)
        chips = resources.tpu_count or (int(size) * _TPU_CHIPS_PER_SUFFIX.get(generation, 1.0) if size.isdigit()
                                        else 1)
        return Devices(generation, float(max(chips, 1)))
    if resources.gpu:
        kind = re.sub(r"[^a-z0-9]+", "-", (resources.gpu_type or "gpu").lower()).strip("-")
        return Devices(kind, float(resources.gpu * resources.hosts))
    return Devices("cpu", float((resources.cpu or 1) * resources.hosts))


@dataclass(frozen=True)
class PriceTable:
    """Prices per device-hour and peak FLOP/s per device, by device kind, and the MFU assumed with a peak."""

    per_device_hour: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    peak_flops: Mapping[str, float] = field(default_factory=dict)
    """Peaks given by the user, over fray's datasheet table."""
    assumed_mfu: float = DEFAULT_ASSUMED_MFU
    currency: str = "USD"
    source: str = "defaults (marin_assets.core.prices.DEFAULT_PRICES)"
    """Where the table came from, shown beside every cost."""

    def price(self, kind: str) -> float | None:
        """Price of one `kind` device for one hour; None when the table has none."""
        found = self.per_device_hour.get(kind)
        if found is None and kind.startswith(("a100-", "h100-")):
            found = self.per_device_hour.get(kind[:4])
        return found

    def peak(self, kind: str, dtype: str = "bf16") -> tuple[float, str] | None:
        """Peak FLOP/s of one `kind` device and where it came from; None when neither table has one."""
        if kind in self.peak_flops:
            return float(self.peak_flops[kind]), f"peak {self.peak_flops[kind]:.3g} FLOP/s from {self.source}"
        if kind in ("cpu", "gpu"):
            return None
        from fray.device_flops import DEVICE_FLOPS

        listed = DEVICE_FLOPS.get(kind, {}).get(dtype)
        if not listed:
            return None
        return float(listed), f"datasheet peak {listed / 1e12:g} TFLOP/s ({dtype}, fray.device_flops)"

    def to_dict(self) -> dict[str, Any]:
        return {"currency": self.currency, "source": self.source, "assumed_mfu": self.assumed_mfu,
                "per_device_hour": dict(self.per_device_hour), "peak_flops": dict(self.peak_flops)}

    @classmethod
    def load(cls, path: str | None = None) -> PriceTable:
        """The table in `path` (TOML) over the defaults; no path: `$MARIN_PRICES`'s file, else the defaults."""
        path = path or os.environ.get(PRICES_ENV) or None
        if path is None:
            return cls()
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise PriceFileError(f"price file {path}: {e}") from None
        unknown = sorted(set(data) - {"currency", "assumed_mfu", "per_device_hour", "peak_flops", "replace_defaults"})
        if unknown:
            raise PriceFileError(f"price file {path}: unknown keys {unknown} (known: currency, assumed_mfu,"
                                 " per_device_hour, peak_flops, replace_defaults)")
        _expect(path, "currency", data, str, "a string")
        _expect(path, "replace_defaults", data, bool, "a boolean (true or false)")
        _expect(path, "per_device_hour", data, dict, "a table ([per_device_hour] with one number per device kind)")
        _expect(path, "peak_flops", data, dict, "a table ([peak_flops] with one number per device kind)")
        for table in ("per_device_hour", "peak_flops"):
            for kind, value in data.get(table, {}).items():
                if not _is_number(value) or not value >= 0:
                    raise PriceFileError(f"price file {path}: [{table}] {kind} = {value!r} is not a non-negative"
                                         f" number (found {_toml_type(value)})")
        mfu = data.get("assumed_mfu", DEFAULT_ASSUMED_MFU)
        if not _is_number(mfu) or not 0 < mfu <= 1:
            raise PriceFileError(f"price file {path}: assumed_mfu = {mfu!r} is not a fraction in (0, 1]"
                                 f" (expected a number, found {_toml_type(mfu)})")
        prices = {} if data.get("replace_defaults") else dict(DEFAULT_PRICES)
        prices.update({k.lower(): float(v) for k, v in data.get("per_device_hour", {}).items()})
        return cls(prices, {k.lower(): float(v) for k, v in data.get("peak_flops", {}).items()}, float(mfu),
                   data.get("currency", "USD"), f"price file {path}")


def _is_number(value: object) -> bool:
    """An integer or a float; TOML's `true` is a Python bool, an int subclass, and is not a number here."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _toml_type(value: object) -> str:
    """The TOML name of a parsed value's type, for errors that say what was found."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # dates and times


def _expect(path: str, key: str, data: Mapping[str, Any], kind: type, expected: str) -> None:
    """A top-level key of the wrong TOML type is an error naming the file, the key, the expected and found types."""
    if key in data and not isinstance(data[key], kind):
        raise PriceFileError(f"price file {path}: {key} = {data[key]!r} must be {expected}, found"
                             f" {_toml_type(data[key])}")

__all__ = ["DEFAULT_ASSUMED_MFU", "DEFAULT_PRICES", "PRICES_ENV", "Devices", "PriceFileError", "PriceTable",
           "devices_of"]
