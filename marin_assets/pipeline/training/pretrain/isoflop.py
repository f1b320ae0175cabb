"""The candidate runs of an IsoFLOP ladder: for each training-FLOP budget, models of growing width, each
trained on the tokens the budget leaves it — Marin's heuristic (`experiments/isoflop_sweep.py`), at any scale.

Per budget C and hidden size h (from `hidden_start` to `hidden_stop` in steps of `hidden_step`):
layers = round(h / (64 + 4·log2 h − 9)) (at least 1), heads = h / head_dim (KV heads alike), MLP 4·h;
tokens = C / training FLOPs per token (the project's count, Levanter's: what the runner records, so a
run's recorded `total_flops` is its budget); batch = tokens / (reference_steps × seq_len) rounded up to a
power of two (at least `min_batch`), steps = the rest, rounded; lr = lr0·√(B/B0)·(T0/T)^0.3 with T the
run's tokens (Marin's 2025 recipe sets lr = 0.33·√B / h, capped at 0.01 by halving the batch: tuned for
h ≥ 512, it leaves the narrow widths of a CPU ladder no batch). A candidate is rejected, with the reason
recorded, when it would read more than `max_tokens_per_param` tokens per parameter or when rounding its
steps moves it off the budget by more than `flop_tolerance`. Only the rules live here: the sweep of
training steps is built from these candidates elsewhere.

Plain values, no Levanter at import nor when a ladder is computed (experiments define their ladders when
they are imported, where Levanter must not be): FLOPs per token and parameters are counted here as Levanter
counts them (`llama_training_flops_per_token`, `llama_parameters`; the tests hold both equal to Levanter's
own counts, which the runner records), in integers, so a candidate's FLOPs are exactly the run's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from marin_assets.pipeline.training.specs import ModelSpec, SpecError

MLP_RATIO = 4
"""Llama MLP width ÷ hidden size."""
DEPTH_BASE, DEPTH_SLOPE, DEPTH_OFFSET = 64, 4, 9
"""Marin's depth from width: layers = round(h / (DEPTH_BASE + DEPTH_SLOPE·log2 h − DEPTH_OFFSET))."""
LR_TOKEN_EXPONENT = 0.3
"""The learning rate falls as (T0/T)^0.3 with the tokens T a run trains on."""
MIN_CANDIDATES = 3
"""A budget needs at least this many candidates: its metric is fitted by a quadratic in log tokens."""


class IsoFlopError(SpecError):
    """An IsoFLOP ladder cannot be built as asked."""


@dataclass(frozen=True)
class IsoFlopScale:
    """Where a ladder sits: the widths it tries, its context, batch and learning-rate references and limits.

    The defaults are a CPU scale: with a vocabulary of about 500, budgets of 1e11–1e12 FLOPs put the
    compute-optimal model (about 20 tokens per parameter) inside the widths tried, and each run is a few
    minutes at most. Marin's own values are given per field. The rules that turn these into models are the
    same at every scale.
    """

    hidden_start: int = 16
    """Smallest hidden size tried (Marin: 512)."""
    hidden_stop: int = 128
    """Largest hidden size tried, inclusive (Marin: 4096)."""
    hidden_step: int = 16
    """Hidden sizes step by this (Marin: 128, 256 above 9e18 FLOPs)."""
    head_dim: int = 16
    """Width of one attention head: heads = hidden ÷ head_dim (Marin: 128)."""
    seq_len: int = 128
    """Training context (Marin: 4096)."""
    reference_steps: int = 128
    """The batch is chosen so a run takes about this many steps (Marin: 2^16)."""
    min_batch: int = 4
    """Smallest batch, in sequences (Marin: 8)."""
    learning_rate: float = 3e-3
    """lr0: the learning rate tuned at `reference_batch` sequences and `reference_tokens` tokens (these
    defaults are the project's CPU defaults: `OptimizerSpec` at `TrainerSpec`'s 16 × 200 steps × 256)."""
    reference_batch: int = 16
    """B0, in sequences."""
    reference_tokens: int = 819_200
    """T0, tokens."""
    max_tokens_per_param: float = 250.0
    """Reject candidates that would read more tokens per parameter than this (far past compute-optimal)."""
    flop_tolerance: float = 0.01
    """Reject candidates whose whole-step FLOPs miss the budget by more than this fraction (Marin: 1 %)."""

    def __post_init__(self) -> None:
        for name in ("hidden_start", "hidden_stop", "hidden_step", "head_dim", "seq_len", "reference_steps",
                     "min_batch", "reference_batch", "reference_tokens"):
            if getattr(self, name) <= 0:
                raise IsoFlopError(f"IsoFLOP scale {name} must be positive, got {getattr(self, name)}")
        if not (self.learning_rate > 0 and self.max_tokens_per_param > 0 and self.flop_tolerance > 0):
            raise IsoFlopError("IsoFLOP scale learning_rate, max_tokens_per_param and flop_tolerance must be"
                               f" positive, got {self.learning_rate}, {self.max_tokens_per_param},"
                               f" {self.flop_tolerance}")
        if self.hidden_stop < self.hidden_start:
            raise IsoFlopError(f"IsoFLOP scale hidden_stop {self.hidden_stop} is below hidden_start"
                               f" {self.hidden_start}")
        if self.hidden_start % self.head_dim or self.hidden_step % self.head_dim:
            raise IsoFlopError(f"IsoFLOP scale hidden_start {self.hidden_start} and hidden_step {self.hidden_step}"
                               f" must be multiples of head_dim {self.head_dim}, so every width has whole heads")

    def hidden_sizes(self) -> list[int]:
        """The widths a ladder tries, smallest first."""
        return list(range(self.hidden_start, self.hidden_stop + 1, self.hidden_step))


def num_layers_for(hidden: int) -> int:
    """Marin's depth for a width: round(h / (64 + 4·log2 h − 9)), at least 1 (Python rounds halves to even,
    as Marin's `round` does)."""
    return max(1, round(hidden / (DEPTH_BASE + DEPTH_SLOPE * math.log2(hidden) - DEPTH_OFFSET)))


def model_for(hidden: int, scale: IsoFlopScale) -> ModelSpec:
    """The Llama model of a ladder at width `hidden`: depth from width, heads of `head_dim`, MLP 4·h."""
    heads = hidden // scale.head_dim
    return ModelSpec(family="llama", hidden_dim=hidden, intermediate_dim=MLP_RATIO * hidden,
                     num_layers=num_layers_for(hidden), num_heads=heads, num_kv_heads=heads, seq_len=scale.seq_len,
                     max_seq_len=max(scale.seq_len, ModelSpec.max_seq_len))


def llama_parameters(model: ModelSpec, vocab_size: int) -> int:
    """Trained parameters of a Llama `model` with `vocab_size` embedding rows: embeddings, the LM head (unless
    tied), attention and MLP projections and the RMS norms — Levanter's `LlamaConfig.total_trainable_params`."""
    if model.family != "llama":
        raise IsoFlopError(f"an IsoFLOP ladder counts Llama parameters, got a {model.family} model")
    head_dim = model.hidden_dim // model.num_heads
    attention = 2 * model.hidden_dim * head_dim * (model.num_heads + model.num_kv_heads)
    mlp = 3 * model.hidden_dim * model.intermediate_dim
    layer = attention + mlp + 2 * model.hidden_dim
    embeddings = vocab_size * model.hidden_dim
    return model.num_layers * layer + model.hidden_dim + embeddings * (1 if model.tie_embeddings else 2)


def llama_training_flops_per_token(model: ModelSpec, vocab_size: int) -> float:
    """Training FLOPs per token of a Llama `model` over its `seq_len` context: 3 × forward (backward = 2 ×
    forward), the forward counted as Levanter's `lm_flops_per_token` does (the project's count,
    `cost.training_flops_per_token`) — 2 per multiply-add of the q, k, v, o and SwiGLU projections, 4·s·(heads ×
    head width) for QKᵀ and AV plus 3·s·heads for mask and softmax per layer, and the LM head; embeddings and
    norms 0. Integers throughout (head width = hidden ÷ heads, which `ModelSpec` keeps whole)."""
    if model.family != "llama":
        raise IsoFlopError(f"an IsoFLOP ladder counts Llama FLOPs, got a {model.family} model")
    h, s = model.hidden_dim, model.seq_len
    head = h // model.num_heads
    query, key_value = model.num_heads * head, model.num_kv_heads * head
    projections = 2 * h * (query + 2 * key_value) + 2 * h * h + 2 * 3 * h * model.intermediate_dim
    attention = 4 * s * query + 3 * s * model.num_heads
    return float(3 * (model.num_layers * (projections + attention) + 2 * h * vocab_size))


def learning_rate_for(batch: int, tokens: int, scale: IsoFlopScale) -> float:
    """lr0·√(B/B0)·(T0/T)^0.3: larger batches take larger steps, longer runs smaller ones."""
    return (scale.learning_rate * math.sqrt(batch / scale.reference_batch)
            * (scale.reference_tokens / tokens) ** LR_TOKEN_EXPONENT)


def batch_for(tokens: float, scale: IsoFlopScale) -> int:
    """Sequences per batch: tokens ÷ (reference_steps × seq_len) rounded up to a power of two, at least
    `min_batch`."""
    exact = tokens / (scale.reference_steps * scale.seq_len)
    return max(scale.min_batch, 1 if exact <= 1 else 2 ** math.ceil(math.log2(exact)))


def budget_label(budget: float) -> str:
    """A budget as it appears in a run name: `1e+12` → `1e12`, `2.5e+11` → `2.5e11`."""
    return f"{budget:g}".replace("+", "")


@dataclass(frozen=True)
class IsoFlopCandidate:
    """One run of a ladder: a model and how long, at what batch and learning rate, it trains on a budget."""

    budget: float
    """The training-FLOP budget this run spends."""
    model: ModelSpec
    parameters: int
    """Trained parameters (embeddings and LM head included, as Levanter counts them)."""
    flops_per_token: float
    """Training FLOPs per token (forward + backward), the project's count."""
    batch_size: int
    """Sequences per step."""
    num_train_steps: int
    tokens: int
    """Tokens the run reads: num_train_steps × batch_size × seq_len."""
    learning_rate: float
    flops: float
    """The run's training FLOPs: flops_per_token × tokens (within `flop_tolerance` of the budget)."""
    tokens_per_param: float

    @property
    def label(self) -> str:
        """`{budget}-d{hidden}-L{layers}-B{batch}`, as Marin names its IsoFLOP runs."""
        return (f"{budget_label(self.budget)}-d{self.model.hidden_dim}-L{self.model.num_layers}"
                f"-B{self.batch_size}")


@dataclass(frozen=True)
class RejectedCandidate:
    """A width a budget does not train, and why."""

    budget: float
    hidden_dim: int
    num_layers: int
    tokens: float
    """The tokens it would have read (exact, before rounding to whole steps)."""
    reason: str


@dataclass(frozen=True)
class IsoFlopLadder:
    """The runs of an IsoFLOP sweep: per budget, the candidates kept (smallest model first) and those rejected."""

    budgets: tuple[float, ...]
    vocab_size: int
    scale: IsoFlopScale
    candidates: tuple[IsoFlopCandidate, ...]
    rejected: tuple[RejectedCandidate, ...]

    def for_budget(self, budget: float) -> tuple[IsoFlopCandidate, ...]:
        """The candidates of one budget, smallest model (most tokens) first."""
        if budget not in self.budgets:
            raise IsoFlopError(f"budget {budget:g} is not one of this ladder's {[f'{b:g}' for b in self.budgets]}")
        return tuple(c for c in self.candidates if c.budget == budget)


def candidate(budget: float, hidden: int, vocab_size: int,
              scale: IsoFlopScale) -> IsoFlopCandidate | RejectedCandidate:
    """The run a `budget` gives width `hidden`, or why it gives none."""
    model = model_for(hidden, scale)
    per_token = llama_training_flops_per_token(model, vocab_size)
    exact = budget / per_token
    parameters = llama_parameters(model, vocab_size)

    def rejected(reason: str) -> RejectedCandidate:
        return RejectedCandidate(budget, hidden, model.num_layers, exact, reason)

    if exact / parameters > scale.max_tokens_per_param:
        return rejected(f"{exact / parameters:.0f} tokens per parameter ({exact:.3g} tokens, {parameters:,}"
                        f" parameters), over max_tokens_per_param {scale.max_tokens_per_param:g}")
    batch = batch_for(exact, scale)
    steps = round(exact / (batch * scale.seq_len))
    if steps < 1:
        return rejected(f"{exact:.3g} tokens do not fill one batch of {batch} × {scale.seq_len} tokens")
    tokens = steps * batch * scale.seq_len
    flops = per_token * tokens
    miss = abs(flops - budget) / budget
    if miss > scale.flop_tolerance:
        return rejected(f"{steps} whole steps of {batch} × {scale.seq_len} tokens spend {flops:.4g} FLOPs,"
                        f" {miss:.1%} off the budget (flop_tolerance {scale.flop_tolerance:.1%})")
    return IsoFlopCandidate(budget=budget, model=model, parameters=parameters, flops_per_token=per_token,
                            batch_size=batch, num_train_steps=steps, tokens=tokens,
                            learning_rate=learning_rate_for(batch, tokens, scale), flops=flops,
                            tokens_per_param=tokens / parameters)


def isoflop_ladder(budgets: Sequence[float], vocab_size: int, scale: IsoFlopScale = IsoFlopScale()) -> IsoFlopLadder:
    """Every budget × width of `scale`, kept or rejected; `IsoFlopError` when a budget keeps fewer than three.

    `vocab_size`: the model's vocabulary (the tokenizer's rounded up to `ModelSpec.vocab_multiple`, what
    the runner counts FLOPs with): it weighs on small models' FLOPs and parameters.
    """
    if not budgets:
        raise IsoFlopError("an IsoFLOP ladder needs at least one FLOP budget")
    bad = [b for b in budgets if not (math.isfinite(b) and b > 0)]
    if bad:
        raise IsoFlopError(f"FLOP budgets must be positive and finite, got {bad}")
    if len(set(budgets)) != len(budgets):
        raise IsoFlopError(f"FLOP budgets must differ, got {list(budgets)}")
    if len({budget_label(b) for b in budgets}) != len(budgets):
        raise IsoFlopError(f"FLOP budgets {list(budgets)} print alike in run names; give budgets that differ in"
                           " their first 6 significant digits")
    if vocab_size <= 0:
        raise IsoFlopError(f"vocab_size must be positive, got {vocab_size}")
    kept: list[IsoFlopCandidate] = []
    dropped: list[RejectedCandidate] = []
    ordered = tuple(sorted(float(b) for b in budgets))
    for budget in ordered:
        results = [candidate(budget, hidden, vocab_size, scale) for hidden in scale.hidden_sizes()]
        mine = [r for r in results if isinstance(r, IsoFlopCandidate)]
        refused = [r for r in results if isinstance(r, RejectedCandidate)]
        if len(mine) < MIN_CANDIDATES:
            why = "; ".join(f"d{r.hidden_dim}: {r.reason}" for r in refused)
            raise IsoFlopError(f"budget {budget:g} keeps {len(mine)} of {len(results)} widths"
                               f" ({scale.hidden_start}–{scale.hidden_stop}), a quadratic fit of its metric needs"
                               f" {MIN_CANDIDATES}: {why}. Change the budget or the widths")
        kept += mine
        dropped += refused
    return IsoFlopLadder(budgets=ordered, vocab_size=vocab_size, scale=scale, candidates=tuple(kept),
                         rejected=tuple(dropped))


__all__ = ["DEPTH_BASE", "DEPTH_OFFSET", "DEPTH_SLOPE", "LR_TOKEN_EXPONENT", "MIN_CANDIDATES", "MLP_RATIO",
           "IsoFlopCandidate", "IsoFlopError", "IsoFlopLadder", "IsoFlopScale", "RejectedCandidate", "batch_for",
           "budget_label", "candidate", "isoflop_ladder", "learning_rate_for", "llama_parameters",
           "llama_training_flops_per_token", "model_for", "num_layers_for"]
