"""What an RL run records beyond the loss: reward, pass rates, KL and completion length per step, as curves
(`[step, value]`) the UI plots, the held-out pass rate before and after, throughput of sampling and of updates, and
a sample of completions with their rewards (a table in the UI).

Read from the run's JSON metrics (`levanter_rl.rl_main` logs `rl/*` per iteration, `eval/*` per held-out evaluation,
Levanter's trainer `train/kl`, `train/clip_fraction` per update) and from its samples file.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Curve = list[list[float]]


@dataclass(frozen=True)
class CompletionSample:
    """One completion and its reward."""

    split: str
    """`held_out` (a greedy completion at an evaluation) or `train` (a sampled completion of an iteration)."""
    step: int
    """The optimizer steps taken before it was generated."""
    prompt: str
    answer: str
    """The environment's reference answer."""
    completion: str
    """The completion's text (special tokens and the final EOS left out)."""
    reward: float


@dataclass(frozen=True)
class RlMetrics:
    """Reward, held-out pass rate, KL and completion length of an RL run, as curves and before/after values."""

    environment: dict[str, Any]
    """The environment's identity (its kind and settings)."""
    held_out_problems: int
    """Held-out problems evaluated (greedy completions) at every evaluation."""
    reward_curve: Curve = field(default_factory=list)
    """[step, mean reward of that step's sampled completions]."""
    train_pass_rate_curve: Curve = field(default_factory=list)
    """[step, fraction of that step's sampled completions that solve their problem]."""
    held_out_pass_rate_curve: Curve = field(default_factory=list)
    """[steps taken, fraction of held-out problems solved by the greedy completion]."""
    held_out_reward_curve: Curve = field(default_factory=list)
    """[steps taken, mean reward of the greedy held-out completions]."""
    kl_curve: Curve = field(default_factory=list)
    """[step, KL(policy ‖ initial policy) per completion token (k3 estimate), on that step's batch]."""
    completion_tokens_curve: Curve = field(default_factory=list)
    """[step, mean tokens per sampled completion (EOS included)]."""
    clip_fraction_curve: Curve = field(default_factory=list)
    """[step, fraction of completion tokens whose probability ratio was clipped]."""
    initial_held_out_pass_rate: float | None = None
    """Held-out pass rate of the starting weights (before any update)."""
    final_held_out_pass_rate: float | None = None
    """Held-out pass rate after the last update."""
    final_reward: float | None = None
    """Mean reward of the last step's sampled completions."""
    sampling_tokens_per_second: float | None = None
    """Median over steps of completion tokens generated per second (the first step includes compilation)."""
    update_tokens_per_second: float | None = None
    """Median over steps of sequence tokens (prompt, completion and padding) per second of an optimizer step."""
    samples: list[CompletionSample] = field(default_factory=list)
    """Held-out completions at the first and the last evaluation, and the last step's sampled ones."""


def _curve(metrics: Mapping[int, Mapping[str, Any]], key: str) -> Curve:
    return [[step, float(m[key])] for step, m in sorted(metrics.items()) if step >= 0 and key in m]


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def rl_metrics(metrics: Mapping[int, Mapping[str, Any]], environment: dict[str, Any], held_out_problems: int,
               samples: Sequence[Mapping[str, Any]]) -> RlMetrics:
    """The RL record of a run from its metrics (step → what was logged) and samples file rows."""
    held = _curve(metrics, "eval/pass_rate")
    reward = _curve(metrics, "rl/reward")
    chosen: list[CompletionSample] = []
    for split in ("held_out", "train"):
        steps = sorted({int(s["step"]) for s in samples if s["split"] == split})
        keep = {steps[0], steps[-1]} if split == "held_out" and steps else set(steps[-1:])
        chosen += [CompletionSample(split=s["split"], step=int(s["step"]), prompt=s["prompt"], answer=s["answer"],
                                    completion=s["completion"], reward=float(s["reward"]))
                   for s in samples if s["split"] == split and int(s["step"]) in keep]
    return RlMetrics(
        environment=dict(environment), held_out_problems=held_out_problems,
        reward_curve=reward, train_pass_rate_curve=_curve(metrics, "rl/pass_rate"),
        held_out_pass_rate_curve=held, held_out_reward_curve=_curve(metrics, "eval/reward"),
        kl_curve=_curve(metrics, "train/kl"), completion_tokens_curve=_curve(metrics, "rl/completion_tokens"),
        clip_fraction_curve=_curve(metrics, "train/clip_fraction"),
        initial_held_out_pass_rate=held[0][1] if held else None,
        final_held_out_pass_rate=held[-1][1] if held else None,
        final_reward=reward[-1][1] if reward else None,
        sampling_tokens_per_second=_median([float(m["throughput/sampling_tokens_per_second"])
                                            for m in metrics.values() if "throughput/sampling_tokens_per_second" in m]),
        update_tokens_per_second=_median([float(m["throughput/update_tokens_per_second"])
                                          for m in metrics.values() if "throughput/update_tokens_per_second" in m]),
        samples=chosen)


__all__ = ["CompletionSample", "RlMetrics", "rl_metrics"]
