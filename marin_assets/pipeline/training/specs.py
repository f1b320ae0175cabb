"""Typed settings of training and evaluation: the hash_attrs of train, export and eval steps.

Plain frozen dataclasses with defaults that train on a laptop CPU; every field changes the
output and so enters identity (`DeviceLayout` alone is how a run computes, not what: never identity).
They are translated into Levanter configs only inside the step function (`levanter_model.py`,
`levanter_data.py`, `levanter_trainer.py`), so defining experiments never imports Levanter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MODEL_FAMILIES = ("llama", "gpt2")
DEFAULT_VOCAB_MULTIPLE = 128
"""A fresh model's vocabulary is rounded up to a multiple of this (Megatron's and GPT-NeoX's
`make_vocab_size_divisible_by`): matrix shapes that tile evenly on GPU tensor cores and TPU meshes."""
MIXTURE_BLOCK_SIZE = 2048
"""Levanter's default mixing block (sequences): each block holds every component's exact share."""

Stages = list[tuple[int, dict[str, float]]]
"""Staged mixture weights: (first step, weights) pairs, as Levanter's `train_weights` takes them."""


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
    vocab_multiple: int = DEFAULT_VOCAB_MULTIPLE
    """A fresh model's vocabulary is the tokenizer's largest id + 1 rounded up to a multiple of this (1: no
    rounding). A model continued from other weights keeps their vocabulary instead."""
    norm_epsilon: float = 1e-5
    """Epsilon of the RMS (Llama) or layer (GPT-2) norms."""
    rope_theta: float = 10000.0
    """Llama rotary embedding base."""
    tie_embeddings: bool = False
    """Llama: the output projection is the input embedding (GPT-2 always ties them)."""

    def __post_init__(self) -> None:
        if self.family not in MODEL_FAMILIES:
            raise SpecError(f"model family must be one of {MODEL_FAMILIES}, got {self.family!r}")
        for name in ("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "seq_len",
                     "vocab_multiple"):
            if getattr(self, name) <= 0:
                raise SpecError(f"model {name} must be positive, got {getattr(self, name)}")
        if not self.norm_epsilon > 0 or not self.rope_theta > 0:
            raise SpecError(f"norm_epsilon and rope_theta must be positive, got {self.norm_epsilon}, {self.rope_theta}")
        if self.hidden_dim % self.num_heads:
            raise SpecError(f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")
        if self.seq_len > self.max_seq_len:
            raise SpecError(f"seq_len {self.seq_len} is longer than the model allows (max_seq_len {self.max_seq_len})")

    def weight_fields(self) -> dict[str, Any]:
        """What weights trained for this model fit: its shape and the settings they were trained under.

        Llama has no position parameters, so its `seq_len` is free; GPT-2 learns one per position.
        """
        fields: dict[str, Any] = {"family": self.family, "hidden_dim": self.hidden_dim,
                                  "num_layers": self.num_layers, "num_heads": self.num_heads,
                                  "norm_epsilon": self.norm_epsilon}
        if self.family == "llama":
            fields.update(intermediate_dim=self.intermediate_dim, num_kv_heads=self.num_kv_heads,
                          rope_theta=self.rope_theta, tie_embeddings=self.tie_embeddings)
        else:
            fields.update(seq_len=self.seq_len)
        return fields

    def differences(self, source: ModelSpec) -> list[str]:
        """How weights of a `source` model would not fit this one: `field: this X, source Y` lines."""
        mine, theirs = self.weight_fields(), source.weight_fields()
        return [f"{k}: this model {mine[k]!r}, the source {theirs.get(k)!r}" for k in mine if theirs.get(k) != mine[k]]

    def hf_differences(self, config: Mapping[str, Any]) -> list[str]:
        """How a Hugging Face model (its `config.json`) does not fit this one: `field: this X, source Y (key)`."""
        if config.get("model_type") != self.family:
            return [f"family: this model {self.family!r}, the source {config.get('model_type')!r} (model_type)"]
        if self.family == "llama":
            heads = config.get("num_attention_heads") or 1
            head_dim = config.get("head_dim") or (config.get("hidden_size") or 0) // heads
            pairs = [("hidden_dim", "hidden_size"), ("intermediate_dim", "intermediate_size"),
                     ("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads"),
                     ("num_kv_heads", "num_key_value_heads"), ("norm_epsilon", "rms_norm_eps"),
                     ("rope_theta", "rope_theta"), ("tie_embeddings", "tie_word_embeddings")]
            found = {key: config.get(key) for _, key in pairs}
            found["num_key_value_heads"] = found["num_key_value_heads"] or found["num_attention_heads"]
            rope = config.get("rope_parameters") or {}  # transformers 5 (older folders: rope_theta, rope_scaling)
            theta = found["rope_theta"] if found["rope_theta"] is not None else rope.get("rope_theta")
            found["rope_theta"] = theta if theta is not None else 10000.0
            found["tie_word_embeddings"] = bool(found["tie_word_embeddings"])
            problems = [f"{mine}: this model {getattr(self, mine)!r}, the source {found[key]!r} ({key})"
                        for mine, key in pairs if not _same(getattr(self, mine), found[key])]
            if head_dim != self.hidden_dim // self.num_heads:
                problems.append(f"head dimension: this model {self.hidden_dim // self.num_heads}, the source"
                                f" {head_dim} (head_dim)")
            if config.get("rope_scaling"):
                problems.append(f"rope scaling: this model none, the source {config['rope_scaling']!r} (rope_scaling)")
            elif rope.get("rope_type", "default") != "default":
                problems.append(f"rope scaling: this model none, the source {rope!r} (rope_parameters)")
            if config.get("hidden_act", "silu") != "silu":
                problems.append(f"activation: this model 'silu', the source {config['hidden_act']!r} (hidden_act)")
            return problems
        pairs = [("hidden_dim", "n_embd"), ("num_layers", "n_layer"), ("num_heads", "n_head"),
                 ("seq_len", "n_positions"), ("norm_epsilon", "layer_norm_epsilon")]
        problems = [f"{mine}: this model {getattr(self, mine)!r}, the source {config.get(key)!r} ({key})"
                    for mine, key in pairs if not _same(getattr(self, mine), config.get(key))]
        if config.get("n_inner") not in (None, 4 * self.hidden_dim):
            problems.append(f"MLP width: this model {4 * self.hidden_dim}, the source {config['n_inner']!r} (n_inner)")
        if config.get("activation_function", "gelu_new") != "gelu_new":
            problems.append(f"activation: this model 'gelu_new', the source {config['activation_function']!r}"
                            " (activation_function)")
        return problems


def _same(mine: Any, theirs: Any) -> bool:
    if isinstance(mine, float) and isinstance(theirs, (int, float)) and not isinstance(theirs, bool):
        return math.isclose(mine, theirs, rel_tol=1e-9)
    return bool(mine == theirs)


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

    def batch_tokens(self, model: ModelSpec) -> int:
        """Tokens in one training batch: train_batch_size × seq_len."""
        return self.train_batch_size * model.seq_len


@dataclass(frozen=True)
class DeviceLayout:
    """How a run splits its devices (Levanter's mesh): `replica` copies × `model`-way tensor parallel × the rest as
    `data` (Levanter's default: the batch split and the parameters sharded over it, FSDP). It changes how a run
    computes, not what: not part of identity (the loss differs by float32 summation order only; docs/production.md
    has the measured difference)."""

    replica: int = 1
    """Pure data-parallel copies: the batch split across them, the parameters replicated in each."""
    model: int = 1
    """Tensor parallelism: attention heads and MLP columns split this many ways (it must divide both)."""

    def __post_init__(self) -> None:
        if self.replica < 1 or self.model < 1:
            raise SpecError(f"a device layout's axes must be at least 1, got {self}")

    def mesh_config(self) -> Any:
        """Levanter's `MeshConfig`: `data` absorbs the devices `replica` and `model` leave."""
        from levanter.utils.mesh import MeshConfig

        return MeshConfig(axes={"data": -1, "replica": self.replica, "model": self.model})


@dataclass(frozen=True)
class TokenBudget:
    """How many tokens a run reads: in all, and from the start of each component's train split."""

    train_tokens: int | None = None
    """Stop after this many tokens: the run takes ⌈train_tokens ÷ (train_batch_size × seq_len)⌉ steps, in
    place of `TrainerSpec.num_train_steps` (Levanter's `trainer.num_train_steps`)."""
    component_tokens: dict[str, int] = field(default_factory=dict)
    """Component → train only on the first N tokens of its train split, repeated as often as the mixture
    asks (Levanter's `data.max_train_batches`, which counts whole batches: N ÷ (train_batch_size ×
    seq_len), rounded down)."""

    def __post_init__(self) -> None:
        if self.train_tokens is not None and self.train_tokens <= 0:
            raise SpecError(f"train_tokens must be positive, got {self.train_tokens}")
        bad = {k: v for k, v in self.component_tokens.items() if v <= 0}
        if bad:
            raise SpecError(f"component token budgets must be positive, got {bad}")

    def num_train_steps(self, trainer: TrainerSpec, model: ModelSpec) -> int:
        """The run's steps: from `train_tokens` when set, else the trainer's `num_train_steps`."""
        if self.train_tokens is None:
            return trainer.num_train_steps
        return -(-self.train_tokens // trainer.batch_tokens(model))

    def max_train_batches(self, trainer: TrainerSpec, model: ModelSpec) -> dict[str, int]:
        """Component → whole batches of its first tokens (Levanter's `max_train_batches`); `SpecError` for a
        budget smaller than one batch."""
        per_batch = trainer.batch_tokens(model)
        small = {k: v for k, v in self.component_tokens.items() if v < per_batch}
        if small:
            raise SpecError(f"token budgets {small} are smaller than one batch ({trainer.train_batch_size} sequences"
                            f" × {model.seq_len} tokens = {per_batch} tokens)")
        return {k: v // per_batch for k, v in self.component_tokens.items()}


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


def as_stages(weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]) -> Stages:
    """Constant weights as one stage from step 0; staged weights as a list of (step, weights) pairs."""
    if isinstance(weights, Mapping):
        return [(0, dict(weights))]
    stages = []
    for stage in weights:
        if not (isinstance(stage, (tuple, list)) and len(stage) == 2 and isinstance(stage[1], Mapping)):
            raise SpecError(f"a mixture stage must be a (start step, weights) pair, got {stage!r}")
        stages.append((stage[0], dict(stage[1])))
    return stages


def check_stages(stages: Stages, components: Sequence[str], num_train_steps: int | None = None) -> None:
    """Staged weights: the first stage starts at step 0, starts increase (and fall before the last step),
    every stage's weights are valid and name only known components (`SpecError` otherwise)."""
    if not stages:
        raise SpecError("a mixture needs at least one stage of weights")
    starts = [start for start, _ in stages]
    if any(not isinstance(s, int) or isinstance(s, bool) for s in starts):
        raise SpecError(f"stage start steps must be integers, got {starts}")
    if starts[0] != 0:
        raise SpecError(f"the first mixture stage must start at step 0, got {starts[0]} (stages start at {starts})")
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        raise SpecError(f"mixture stage starts must increase, got {starts}")
    if num_train_steps is not None and starts[-1] >= num_train_steps:
        raise SpecError(f"mixture stage at step {starts[-1]} starts after the last step (the run has"
                        f" {num_train_steps} steps)")
    for start, weights in stages:
        unknown = sorted(set(weights) - set(components))
        if unknown:
            where = f"the stage at step {start} weighs" if len(stages) > 1 else "weights for"
            raise SpecError(f"{where} unknown components {unknown} (known: {sorted(components)})")
        try:
            check_weights(weights)
        except SpecError as e:
            raise SpecError(f"the stage at step {start}: {e}" if len(stages) > 1 else str(e)) from None


def mixture_block_size(stages: Stages, train_batch_size: int) -> int:
    """Levanter mixes in blocks of sequences and changes weights only between blocks: the largest block,
    up to `MIXTURE_BLOCK_SIZE`, that every stage start (step × batch size sequences) falls on.

    Each block takes ⌊weight × block⌋ sequences of each component (the rest from the largest), so a
    stage whose positive weight would get none is a `SpecError`.
    """
    block = math.gcd(MIXTURE_BLOCK_SIZE, *(start * train_batch_size for start, _ in stages))
    for start, weights in stages:
        total = sum(weights.values())
        starved = sorted(k for k, v in weights.items() if 0 < v and int(v / total * block) == 0)
        if starved:
            raise SpecError(f"the stage at step {start} gives {starved} no sequence of each mixing block of {block}"
                            f" sequences (block = gcd({MIXTURE_BLOCK_SIZE}, stage start × batch size)); start stages"
                            f" at steps whose start × train_batch_size is a multiple of a larger power of two, or"
                            " raise those weights")
    return block
