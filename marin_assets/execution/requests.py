"""What a step asks of Ray: its `Resources` as Ray task options, and whether any node can give them.

Pure arithmetic, no Ray import: TPU slice shapes (chips, hosts, the slice's head resource),
CPU/GPU/memory requests, and the fail-fast feasibility check against the nodes a cluster
reports. `ray_runner` turns a `RayRequest` into a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marin_assets.core.step import Resources, Step


class InfeasibleRequestError(RuntimeError):
    """No node of the cluster can ever run the step as requested."""


_SINGLE_CORE_TPUS = ("v5litepod", "v5e", "v6e")
_EIGHT_CHIP_HOST_TPUS = ("v5litepod", "v5e", "v6e")


def tpu_slice_shape(tpu_type: str) -> tuple[int, int]:
    """(total chips, chips per host) of a slice type, in Ray's terms.

    `v4-16` counts cores (2 per chip: 8 chips, 2 hosts of 4); `v5litepod-16`/`v6e-16`
    count chips; single-host v5e/v6e slices of up to 8 chips are one host.
    """
    generation, _, size = tpu_type.partition("-")
    if not size.isdigit():
        raise ValueError(f"TPU type must look like 'v4-16' or 'v6e-8', got {tpu_type!r}")
    chips = int(size) if generation.startswith(_SINGLE_CORE_TPUS) else max(1, int(size) // 2)
    per_host = chips if generation.startswith(_EIGHT_CHIP_HOST_TPUS) and chips <= 8 else min(4, chips)
    return chips, per_host


@dataclass(frozen=True)
class RayRequest:
    """Ray task options for one step (per host for a TPU slice)."""

    num_cpus: float
    num_gpus: float = 0
    memory: int | None = None
    accelerator_type: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    hosts: int = 1
    """More than one: a multi-host TPU slice, run by a driver holding `slice_head`, or (no `slice_head`) that
    many distinct nodes held together by a placement group."""
    slice_head: str | None = None

    @classmethod
    def of(cls, r: Resources) -> RayRequest:
        if r.tpu_type:
            chips, per_host = tpu_slice_shape(r.tpu_type)
            per_host = r.tpu_count or per_host
            hosts = max(1, chips // per_host)
            head = f"TPU-{r.tpu_type}-head"
            resources = {"TPU": float(per_host)}
            if hosts == 1:
                resources[head] = 1.0
            return cls(num_cpus=r.cpu, memory=_bytes(r.memory_gb), resources=resources, hosts=hosts, slice_head=head)
        return cls(num_cpus=r.cpu, num_gpus=r.gpu, memory=_bytes(r.memory_gb), accelerator_type=r.gpu_type,
                   hosts=r.hosts)

    def task_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": 0}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.memory:
            options["memory"] = self.memory
        if self.accelerator_type:
            options["accelerator_type"] = self.accelerator_type
        if self.resources:
            options["resources"] = dict(self.resources)
        return options

    def per_node(self) -> dict[str, float]:
        """What one node must offer in total, in Ray's resource names."""
        need = {"CPU": self.num_cpus}
        if self.num_gpus:
            need["GPU"] = self.num_gpus
        if self.memory:
            need["memory"] = float(self.memory)
        if self.accelerator_type:
            need[f"accelerator_type:{self.accelerator_type}"] = 0.001
        need.update(self.resources)
        return {k: v for k, v in need.items() if v}

    @property
    def placed(self) -> bool:
        """Several hosts on distinct nodes, held together by a placement group (not a TPU slice)."""
        return self.hosts > 1 and self.slice_head is None

    def describe(self) -> str:
        need = _fmt(self.per_node())
        if self.placed:
            return f"{need} on each of {self.hosts} distinct nodes"
        return f"{need} on each of {self.hosts} hosts of a {self.slice_head} slice" if self.hosts > 1 else need


def _bytes(gb: float | None) -> int | None:
    return int(gb * 2**30) if gb else None


def _fmt(resources: dict[str, float]) -> str:
    parts = []
    for k, v in sorted(resources.items()):
        if k.startswith("node:") or k == "object_store_memory":
            continue
        parts.append(f"{k}={v / 2**30:.1f}GiB" if k == "memory" else f"{k}={v:g}")
    return "{" + ", ".join(parts) + "}"


def check_feasible(step: Step, request: RayRequest, nodes: list[dict[str, float]]) -> None:
    """Raise `InfeasibleRequestError` if no alive node could ever run the request."""
    def fits(node: dict[str, float], need: dict[str, float]) -> bool:
        return all(node.get(k, 0.0) >= v for k, v in need.items())

    need = request.per_node()
    problems = []
    fitting = sum(fits(n, need) for n in nodes)
    if request.placed and fitting < request.hosts:
        problems.append(f"needs {request.describe()} ({fitting} of its nodes can hold one)")
    elif not fitting:
        problems.append(f"needs {request.describe()} on one node")
    if request.hosts > 1 and not request.placed and not any(n.get(request.slice_head or "", 0) >= 1 for n in nodes):
        problems.append(f"needs a {request.slice_head} resource (a {request.hosts}-host slice)")
    if problems:
        offered = "; ".join(_fmt(n) for n in nodes) or "no alive nodes"
        raise InfeasibleRequestError(
            f"step {step.name!r} {' and '.join(problems)}, which this cluster can never provide."
            f" Nodes offer: {offered}. (On an autoscaling cluster set fail_fast=False on the ray resource.)"
        )
