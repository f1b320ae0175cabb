"""Typed settings of training and evaluation: the hash_attrs of train, export and eval steps.

Plain frozen dataclasses with defaults that train on a laptop CPU; every field changes the
output and so enters identity. They are translated into Levanter configs only inside the
step function (`levanter_configs.py`), so defining experiments never imports Levanter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MODEL_FAMILIES = ("llama", "gpt2")


class SpecError(ValueError):
    """A training setting is invalid."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only language model."""

    family: str = "llama"
    """`llama` or `gpt2`."""
    hidden_dim: int = 128
    intermediate_dim: int = 512
    """Llama MLP width (GPT-2 uses 4 × hidden)."""
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    """Llama grouped-query heads."""
    seq_len: int = 256
    max_seq_len: int = 2048
    """The longest context the architecture allows (positions)."""

    def __post_init__(self) -> None:
        if self.family not in MODEL_FAMILIES:
            raise SpecError(f"model family must be one of {MODEL_FAMILIES}, got {self.family!r}")
        for name in ("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "seq_len"):
            if getattr(self, name) <= 0:
                raise SpecError(f"model {name} must be positive, got {getattr(self, name)}")
        if self.hidden_dim % self.num_heads:
            raise SpecError(f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")
        if self.seq_len > self.max_seq_len:
            raise SpecError(f"seq_len {self.seq_len} is longer than the model allows (max_seq_len {self.max_seq_len})")


@dataclass(frozen=True)
class OptimizerSpec:
    """AdamW with warmup and a decay schedule."""

    learning_rate: float = 3e-3
    weight_decay: float = 0.1
    warmup: float = 0.05
    """Fraction of steps (or a step count if ≥ 1)."""
    lr_schedule: str = "cosine"
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise SpecError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.weight_decay < 0 or self.warmup < 0:
            raise SpecError("weight_decay and warmup must be non-negative")
        if self.lr_schedule not in ("cosine", "linear", "constant", "inv_sqrt"):
            raise SpecError(f"unknown lr_schedule {self.lr_schedule!r}")


@dataclass(frozen=True)
class TrainerSpec:
    """How long and how to train; where checkpoints and evaluations fall."""

    num_train_steps: int = 200
    train_batch_size: int = 16
    seed: int = 0
    checkpoint_every: int = 50
    """A permanent checkpoint every this many steps (and always at the last step)."""
    steps_per_eval: int = 50
    max_eval_batches: int | None = 8
    mixed_precision: str = "f32"

    def __post_init__(self) -> None:
        if self.num_train_steps <= 0:
            raise SpecError(f"num_train_steps must be positive, got {self.num_train_steps}")
        if self.train_batch_size <= 0:
            raise SpecError(f"train_batch_size must be positive, got {self.train_batch_size}")
        if self.checkpoint_every <= 0 or self.steps_per_eval <= 0:
            raise SpecError("checkpoint_every and steps_per_eval must be positive")


@dataclass(frozen=True)
class MixtureSpec:
    """Marin's mixture semantics: named components with weights; weight 0 = validation only."""

    weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_weights(self.weights)


def check_weights(weights: dict[str, float]) -> None:
    """Mixture weights must be non-negative and not all zero (`SpecError` otherwise)."""
    if not weights:
        raise SpecError("a mixture needs at least one component")
    negative = {k: v for k, v in weights.items() if v < 0}
    if negative:
        raise SpecError(f"mixture weights must be non-negative: {negative}")
    if not any(v > 0 for v in weights.values()):
        raise SpecError(f"mixture weights are all zero: {weights} (nothing to train on)")
