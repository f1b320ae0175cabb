"""Run cost: what a training run spent — parameters, FLOPs, tokens/s, MFU, device-hours — measured by
the runner into every training record (`reports/run_costs.py` tables them across runs).

FLOPs are model FLOPs as Levanter counts them for its own `throughput/*` metrics, so our numbers
and Levanter's agree by construction (and are checked to). MFU needs a peak: a GPU's or TPU's
comes from the datasheet table Levanter's own MFU uses (`fray.device_flops`); a CPU, or an
accelerator the table lacks, has no published one, so its peak is the measured matmul throughput
of the device at the run's compute dtype — and the record says so in words, so that nobody reads
an MFU against a measured peak as one against a datasheet."""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marin_assets.pipeline.training.specs import ModelSpec

FLOPS_FORMULA = ("training FLOPs per token = 3 × forward (backward = 2 × forward), forward = Levanter's"
                 " LmConfig.flops_per_token: 2 per multiply-add of every projection (q, k, v, o, MLP) per"
                 " layer, attention over the full seq_len × seq_len map (QKᵀ, mask and softmax, AV), and the"
                 " LM head (2 × hidden × vocab); embedding lookups and norms count 0")
"""How `RunCost.flops_per_token` is counted: what Levanter's `train_lm` logs as
`throughput/flops_per_example` (3 × flops_per_token × seq_len)."""


class RunCostError(ValueError):
    """A run's cost cannot be computed: its metrics lack what it needs, or disagree with the model."""


@dataclass(frozen=True)
class DevicePeak:
    """The devices a run trains on and the peak FLOP/s of each, with where that number came from."""

    kind: str
    """JAX's `device_kind` (`cpu`, `NVIDIA H100 80GB HBM3`, `TPU v4`)."""
    count: int
    """Devices the run uses (JAX's global `device_count`)."""
    flops_per_device: float
    """Peak FLOP/s of one device at the run's compute dtype."""
    basis: str
    """`datasheet` (fray's table of published numbers) or `measured` (this device's matmul throughput)."""
    source: str
    """The peak in words: the table entry it came from, or what was measured and that it is an assumption."""


def compute_dtype(mixed_precision: str) -> str:
    """The dtype matmuls run in under a jmp policy (`f32` → `float32`, `p=f32,c=bfloat16` → `bfloat16`)."""
    import jmp
    import numpy as np

    return np.dtype(jmp.get_policy(mixed_precision).compute_dtype).name


FRAY_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int8": "int8"}
"""numpy dtype name → the dtype name of fray's datasheet table."""


def datasheet_peak(device_kind: str, dtype: str = "bfloat16") -> float | None:
    """Peak FLOP/s of one device of JAX's `device_kind` at `dtype` from fray's datasheet table (the one Levanter's
    MFU uses); None when the table has no entry (every CPU, and accelerators it does not list)."""
    from fray.device_flops import DEVICE_FLOPS, device_flops_for_jax_device, jax_device_kind_to_fray_device_type

    if dtype not in FRAY_DTYPES or jax_device_kind_to_fray_device_type(device_kind) not in DEVICE_FLOPS:
        return None  # checked first: fray warns of every kind it lacks, and a CPU is always one
    return device_flops_for_jax_device(device_kind, FRAY_DTYPES[dtype])


def measure_matmul_flops(dtype: str = "float32", size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the fastest of `repeats` jitted `size`×`size` matmuls on JAX's default device: what it
    reaches on dense work, an assumed peak where no datasheet gives one. The operands come from NumPy (a
    matmul's time does not depend on its values): JAX's random normal compiles kernels of its own first, which on
    a CPU takes longer than the measurement itself, in every training process that measures its peak."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (jax.device_put(rng.standard_normal((size, size), dtype=np.float32).astype(jnp.dtype(dtype)))
            for _ in range(2))
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


@functools.cache
def _measured_peak(platform: str, kind: str, dtype: str, size: int) -> float:
    """Measured once per process and device kind: every run a process trains is held to one peak, and the
    measurement (up to a second) is not repeated per run."""
    return measure_matmul_flops(dtype, size)


def device_peak(dtype: str = "float32") -> DevicePeak:
    """The devices JAX trains on now and the peak of each at `dtype`: the datasheet number for a GPU or TPU
    that fray's table lists, else the measured matmul throughput of this device, said to be one."""
    import jax

    device = jax.local_devices()[0]  # on a multi-host run, one this process can compute on
    kind, count = str(device.device_kind), jax.device_count()
    listed = datasheet_peak(kind, dtype)
    if listed is not None:
        return DevicePeak(kind, count, float(listed), "datasheet",
                          f"datasheet: fray.device_flops.device_flops_for_jax_device({kind!r}, {FRAY_DTYPES[dtype]}) ="
                          f" {listed / 1e12:g} TFLOP/s per device (dense)")
    size = 1024 if device.platform == "cpu" else 8192
    measured = _measured_peak(device.platform, kind, dtype, size)
    what = "CPU" if device.platform == "cpu" else f"{kind} (not in fray's datasheet table)"
    return DevicePeak(kind, count, measured, "measured",
                      f"{what}: no published peak; peak = measured {dtype} matmul throughput of this host"
                      f" ({size}×{size} @ {size}×{size}, best of 5), {measured / 1e9:.1f} GFLOP/s per device"
                      " — an assumption, not a datasheet number")


@dataclass(frozen=True)
class RunCost:
    """What a training run cost: model size, model FLOPs, throughput, utilization and device time."""

    parameters: int | None
    """Trained parameters (Levanter's `parameter_count`: every array, embeddings and LM head included)."""
    flops_per_token: float
    """Training model FLOPs per token, forward + backward (see `flops_formula`)."""
    flops_formula: str
    """How `flops_per_token` is counted."""
    tokens: int
    """Tokens trained on: steps × train_batch_size × seq_len."""
    total_flops: float
    """Model FLOPs of the run: flops_per_token × tokens."""
    tokens_per_second: float
    """Median over steps of Levanter's per-step throughput (steady state: the first step also compiles; the
    upper median of an even count, a logged value, as `TrainResult.tokens_per_second` unrounded)."""
    flops_per_second: float
    """Achieved model FLOP/s: tokens_per_second × flops_per_token."""
    device_kind: str
    """JAX's `device_kind` of the devices trained on."""
    device_count: int
    """Devices trained on."""
    peak_flops_per_device: float
    """Peak FLOP/s of one device at the run's compute dtype."""
    peak_basis: str
    """`datasheet` or `measured` (an assumed peak: see `peak_source`)."""
    peak_source: str
    """Where the peak came from, in words."""
    mfu: float
    """Model FLOPs utilization, a fraction: flops_per_second ÷ (peak_flops_per_device × device_count)."""
    levanter_mfu: float | None
    """The median MFU Levanter itself logged (as a fraction; its peak is the bf16 datasheet number), when it
    had a peak for the device; None on CPU."""
    step_seconds: float
    """Sum of Levanter's per-step durations (Marin speedrun's "training time"; compilation included)."""
    wall_seconds: float
    """Wall time of every training call that trained this run (a resumed run counts each attempt that returned;
    one killed mid-way is lost with its process): startup, evaluation and checkpoints included."""
    device_hours: float
    """wall_seconds × device_count ÷ 3600."""


def training_flops_per_token(model: ModelSpec, vocab_size: int) -> float:
    """3 × Levanter's forward FLOPs per token for `model` over its `seq_len` context (see `FLOPS_FORMULA`): the
    number its `train_lm` uses."""
    from marin_assets.pipeline.training.levanter_model import model_config

    forward = model_config(model, reference="", tokenizer="").flops_per_token(vocab_size, model.seq_len)
    if forward is None:
        raise RunCostError(f"Levanter has no FLOP count for a {model.family} model")
    return 3.0 * float(forward)


def run_cost(run: str, metrics: Mapping[int, Mapping[str, Any]], summary: Mapping[str, Any], model: ModelSpec,
             vocab_size: int, tokens: int, wall_seconds: float, peak: DevicePeak) -> RunCost:
    """The cost of run `run` from its Levanter metrics (step → metrics, and the run `summary`).

    FLOPs per token are Levanter's; where Levanter logged `throughput/flops_per_example` it must equal
    them × seq_len, or the model or vocabulary recorded is not the one trained (a `RunCostError`)."""
    per_token = training_flops_per_token(model, vocab_size)
    logged = summary.get("throughput/flops_per_example")
    if logged is not None and not math.isclose(logged, per_token * model.seq_len, rel_tol=1e-9):
        shape = (f"{model.family}, hidden {model.hidden_dim}, layers {model.num_layers}, seq_len {model.seq_len},"
                 f" vocabulary {vocab_size}")
        raise RunCostError(f"run {run!r}: Levanter logged {logged:,.0f} FLOPs per example, but the model recorded"
                           f" ({shape}) gives {per_token * model.seq_len:,.0f}: the record's model or vocabulary"
                           " is not the one trained")
    steps = [m for s, m in sorted(metrics.items()) if s >= 0]
    throughput = [m["throughput/tokens_per_second"] for m in steps if "throughput/tokens_per_second" in m]
    if not throughput:
        raise RunCostError(f"run {run!r}: its metrics have no throughput/tokens_per_second (no step was logged)")
    tokens_per_second = float(sorted(throughput)[len(throughput) // 2])  # as TrainResult.tokens_per_second
    levanter_mfu = [m["throughput/mfu"] for m in steps if "throughput/mfu" in m]
    achieved = tokens_per_second * per_token
    return RunCost(
        parameters=summary.get("parameter_count"), flops_per_token=per_token, flops_formula=FLOPS_FORMULA,
        tokens=tokens, total_flops=per_token * tokens, tokens_per_second=tokens_per_second,
        flops_per_second=achieved, device_kind=peak.kind, device_count=peak.count,
        peak_flops_per_device=peak.flops_per_device, peak_basis=peak.basis, peak_source=peak.source,
        mfu=achieved / (peak.flops_per_device * peak.count),
        levanter_mfu=statistics.median(levanter_mfu) / 100 if levanter_mfu else None,
        step_seconds=float(sum(m.get("throughput/duration", 0.0) for m in steps)),
        wall_seconds=wall_seconds, device_hours=wall_seconds * peak.count / 3600,
    )


__all__ = ["FLOPS_FORMULA", "DevicePeak", "RunCost", "RunCostError", "compute_dtype", "datasheet_peak", "device_peak",
           "measure_matmul_flops", "run_cost", "training_flops_per_token"]
