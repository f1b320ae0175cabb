"""What a DPO run records beyond the loss: preference accuracy, the implicit rewards and their margin, on the
training batches and on the held-out pairs, as curves (`[step, value]`) the UI plots, and the final values.

Read from the run's JSON metrics under Levanter's names: `train/dpo_*` are what `levanter.dpo.dpo_loss` returns per
batch (the trainer prefixes them); `eval/dpo_*` are what the DPO method logs after scoring every held-out pair
(`levanter_dpo.held_out_metrics`). Levanter logs `dpo_margin_policy` and `dpo_margin_ref` (the mean log-prob margins
chosen − rejected of the policy and of the reference); the reward margin recorded here is the implicit rewards'
difference, chosen − rejected = β × (policy margin − reference margin).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Curve = list[list[float]]

TRAIN_PREFIX = "train/"
EVAL_PREFIX = "eval/"
LOSS = "dpo_loss"
ACCURACY = "dpo_accuracy"
"""The fraction of pairs whose implicit reward prefers the chosen answer: β × (policy margin − reference margin) > 0."""
CHOSEN_REWARD = "dpo_chosen_reward"
REJECTED_REWARD = "dpo_rejected_reward"
LOGPROB_ACCURACY = "dpo_logprob_accuracy"
"""The fraction of pairs whose chosen answer the policy gives a higher summed log-prob than the rejected one (held
out only): comparable with the reference model's own (`ReferenceLogprobs`), where the implicit reward's accuracy
starts at 0 (every pair a tie)."""


@dataclass(frozen=True)
class DpoMetrics:
    """Preference metrics of a DPO run: curves for the training batches and the held-out pairs, and final values."""

    beta: float
    """The DPO β: the implicit reward is β × (policy log-prob − reference log-prob) of an answer."""
    train_accuracy_curve: Curve = field(default_factory=list)
    """[step, preference accuracy of the implicit reward on that step's training batch]."""
    train_chosen_reward_curve: Curve = field(default_factory=list)
    """[step, mean implicit reward of the chosen answers of the batch]."""
    train_rejected_reward_curve: Curve = field(default_factory=list)
    """[step, mean implicit reward of the rejected answers of the batch]."""
    train_margin_curve: Curve = field(default_factory=list)
    """[step, mean reward margin (chosen − rejected) of the batch]."""
    validation_loss_curve: Curve = field(default_factory=list)
    """[step, DPO loss over every held-out pair]."""
    validation_accuracy_curve: Curve = field(default_factory=list)
    """[step, preference accuracy of the implicit reward over every held-out pair]."""
    validation_chosen_reward_curve: Curve = field(default_factory=list)
    """[step, mean implicit reward of the held-out chosen answers]."""
    validation_rejected_reward_curve: Curve = field(default_factory=list)
    """[step, mean implicit reward of the held-out rejected answers]."""
    validation_margin_curve: Curve = field(default_factory=list)
    """[step, mean held-out reward margin (chosen − rejected)]."""
    validation_logprob_accuracy_curve: Curve = field(default_factory=list)
    """[step, fraction of held-out pairs whose chosen answer the policy finds likelier than the rejected one]."""
    final_train_accuracy: float | None = None
    """Implicit-reward accuracy on the last logged training batch."""
    final_validation_loss: float | None = None
    """DPO loss over the held-out pairs at the last evaluation (None: no held-out pairs)."""
    final_validation_accuracy: float | None = None
    """Implicit-reward preference accuracy over the held-out pairs at the last evaluation."""
    final_validation_margin: float | None = None
    """Mean held-out reward margin at the last evaluation."""
    final_validation_logprob_accuracy: float | None = None
    """The policy's log-prob preference accuracy on the held-out pairs at the last evaluation."""
    reference_logprob_accuracy: dict[str, float] = field(default_factory=dict)
    """Per split, the reference model's log-prob preference accuracy (from its reference log-prob step): the
    number `final_validation_logprob_accuracy` improves on."""
    validation_pairs: int = 0
    """Held-out pairs scored at each evaluation (all of the cache's validation split)."""


def _curve(metrics: Mapping[int, Mapping[str, Any]], key: str) -> Curve:
    return [[step, float(m[key])] for step, m in sorted(metrics.items()) if step >= 0 and key in m]


def _difference(a: Curve, b: Curve) -> Curve:
    """a − b at the steps both have."""
    other = {step: value for step, value in b}
    return [[step, value - other[step]] for step, value in a if step in other]


def _last(curve: Curve) -> float | None:
    return curve[-1][1] if curve else None


def dpo_metrics(metrics: Mapping[int, Mapping[str, Any]], beta: float,
                reference_logprob_accuracy: Mapping[str, float] | None = None,
                validation_pairs: int = 0) -> DpoMetrics:
    """The DPO metrics of a run from its JSON metrics (step → Levanter's logged values)."""
    train = {name: _curve(metrics, TRAIN_PREFIX + name) for name in (ACCURACY, CHOSEN_REWARD, REJECTED_REWARD)}
    held = {name: _curve(metrics, EVAL_PREFIX + name)
            for name in (LOSS, ACCURACY, CHOSEN_REWARD, REJECTED_REWARD, LOGPROB_ACCURACY)}
    validation_margin = _difference(held[CHOSEN_REWARD], held[REJECTED_REWARD])
    return DpoMetrics(
        beta=beta,
        train_accuracy_curve=train[ACCURACY], train_chosen_reward_curve=train[CHOSEN_REWARD],
        train_rejected_reward_curve=train[REJECTED_REWARD],
        train_margin_curve=_difference(train[CHOSEN_REWARD], train[REJECTED_REWARD]),
        validation_loss_curve=held[LOSS], validation_accuracy_curve=held[ACCURACY],
        validation_chosen_reward_curve=held[CHOSEN_REWARD], validation_rejected_reward_curve=held[REJECTED_REWARD],
        validation_margin_curve=validation_margin, validation_logprob_accuracy_curve=held[LOGPROB_ACCURACY],
        final_train_accuracy=_last(train[ACCURACY]), final_validation_loss=_last(held[LOSS]),
        final_validation_accuracy=_last(held[ACCURACY]), final_validation_margin=_last(validation_margin),
        final_validation_logprob_accuracy=_last(held[LOGPROB_ACCURACY]),
        reference_logprob_accuracy=dict(reference_logprob_accuracy or {}), validation_pairs=validation_pairs)


__all__ = ["ACCURACY", "CHOSEN_REWARD", "DpoMetrics", "LOGPROB_ACCURACY", "LOSS", "REJECTED_REWARD", "dpo_metrics"]
