"""Work estimates of training steps: FLOPs = training FLOPs per token × steps × batch × context, before the run.

Counted in plain Python, as Levanter counts them (`levanter.utils.flop_utils.lm_flops_per_token`, the count
`cost.training_flops_per_token` takes from Levanter and the tests hold equal to this one), so that planning a
sweep of thousands of runs imports no Levanter. The vocabulary — the LM head's share — comes from the
tokenizer's record when it exists, else from the tokenizer step's requested `vocab_size`; a model continued
from other weights takes theirs. After the run, the estimate reads what the run recorded: its tokens and FLOPs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marin_assets.core.estimate import FLOPS, EstimateInputs, Estimator, WorkEstimate
from marin_assets.core.paths import using_prefix
from marin_assets.core.step import Step
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec


def lm_training_flops_per_token(model: ModelSpec, vocab_size: int) -> float:
    """3 × Levanter's forward FLOPs per token (`lm_flops_per_token`) of a Llama (gated MLP) or GPT-2 (MLP of 4 ×
    hidden, as Levanter's `Gpt2Config` counts it) `model` over its `seq_len` context."""
    h, s, heads = model.hidden_dim, model.seq_len, model.num_heads
    glu = model.family == "llama"
    intermediate = model.intermediate_dim if glu else 4 * h
    kv_heads = model.num_kv_heads if glu else heads
    head_dim = h / heads
    mlp = 2 * (3 if glu else 2) * h * intermediate
    qkv = 2 * h * (heads * head_dim + 2 * kv_heads * head_dim)
    attention = (2 * s * s * heads * head_dim + 3 * s * s * heads + 2 * s * s * head_dim * heads) / s
    forward = model.num_layers * (mlp + 2 * h * h) + model.num_layers * (qkv + attention) + 2 * h * vocab_size
    return 3.0 * forward


def _rounded(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def planned_vocab(model: ModelSpec, data: Sequence[Step], init_from: Any, inputs: EstimateInputs,
                  depth: int = 0) -> tuple[int | None, str]:
    """The vocabulary the run's model will have, and where that number came from (None: not knowable yet)."""
    if init_from is not None:
        try:
            with using_prefix(inputs.prefix):
                return int(init_from.vocab_size()), "the starting weights' vocabulary"
        except Exception:
            source = _training_source(init_from.source)
            if source is None or depth > 8:
                return None, "the starting weights are not materialized"
            return planned_vocab(source.model, source.data, source.init_from, inputs, depth + 1)
    tokenizer = next((getattr(s, "tokenizer", None) for s in data if isinstance(getattr(s, "tokenizer", None), Step)),
                     None)
    if tokenizer is None:
        return None, "no tokenizer step known"
    recorded = inputs.result(tokenizer)
    if isinstance(recorded, dict) and isinstance(recorded.get("vocab_size"), int):
        return _rounded(recorded["vocab_size"], model.vocab_multiple), f"{tokenizer.name}'s record"
    asked = tokenizer.hash_attrs.get("vocab_size")
    if isinstance(asked, int):
        return _rounded(asked, model.vocab_multiple), f"{tokenizer.name}'s requested vocab_size"
    return None, f"{tokenizer.name} is not materialized"


def _training_source(step: Step | None) -> Any:
    """The training step whose weights `step` holds (itself, or the run an export exports), if any."""
    seen = 0
    while step is not None and seen < 4:
        if hasattr(step, "model") and hasattr(step, "data") and hasattr(step, "init_from"):
            return step
        step = step.deps[0] if step.deps else None
        seen += 1
    return None


def training_estimate(model: ModelSpec, trainer: TrainerSpec, data: Sequence[Step], init_from: Any = None,
                      group: str = "train", sequences_per_example: int = 1) -> Estimator:
    """The estimate of a run of `trainer.num_train_steps` steps (already resolved from any token budget) of
    `trainer.train_batch_size` examples of `sequences_per_example` sequences (DPO: 2, chosen and rejected)."""
    tokens = trainer.num_train_steps * trainer.train_batch_size * model.seq_len * sequences_per_example
    shape = (f"{trainer.num_train_steps} steps × {trainer.train_batch_size} × {sequences_per_example} ×"
             f" {model.seq_len} tokens" if sequences_per_example != 1 else
             f"{trainer.num_train_steps} steps × {trainer.train_batch_size} × {model.seq_len} tokens")

    def estimate(inputs: EstimateInputs) -> WorkEstimate:
        done = inputs.own_result if isinstance(inputs.own_result, dict) else None
        if done is not None:
            cost = done.get("cost") or {}
            flops, trained = cost.get("total_flops"), done.get("train_tokens") or cost.get("tokens")
            if flops is not None:  # the run's cost counts one sequence per example: a DPO example is a pair
                achieved, count, k = cost.get("flops_per_second"), cost.get("device_count") or 1, sequences_per_example
                rate = k * float(achieved) / count if achieved else None
                return WorkEstimate(group, FLOPS, k * float(flops), flops=k * float(flops),
                                    tokens=k * float(trained) if trained is not None else None,
                                    note="recorded by the run", steady_rate=rate)
        vocab, where = planned_vocab(model, data, init_from, inputs)
        if vocab is None:
            return WorkEstimate(group, FLOPS, None, tokens=float(tokens), note=f"{shape}; vocabulary unknown ({where})")
        flops = lm_training_flops_per_token(model, vocab) * tokens
        return WorkEstimate(group, FLOPS, flops, flops=flops, tokens=float(tokens),
                            note=f"3 × forward FLOPs per token (vocabulary {vocab}, from {where}) × {shape}")

    return estimate


__all__ = ["lm_training_flops_per_token", "planned_vocab", "training_estimate"]
