"""What a training run's data must be, checked before any compute: one tokenizer across the mixture, enough tokens in
each component to fill a batch (and in each validation split a sequence), and no preference cache where a language
model trains on text. Every method that trains or scores on caches (pretraining, SFT, DPO, the reference log-probs)
raises `TrainDataError` from here, naming the step and the component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from marin_assets.core.step import Step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizeStep
from marin_assets.pipeline.training.specs import ModelSpec, Stages, TokenBudget, TrainerSpec

Weights = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]
"""Mixture weights: constant (component → weight), or staged ((start step, weights) pairs)."""


class TrainDataError(ValueError):
    """The data of a training step cannot make the run: too little of it, or tokenized differently."""


def check_tokenizers(step_name: str, caches: Mapping[str, TokenizedCache]) -> None:
    """All components were tokenized with one tokenizer (`TrainDataError` naming each one otherwise)."""
    if len({c.tokenizer_fingerprint for c in caches.values()}) > 1:
        listed = "; ".join(f"{k}: {c.tokenizer} (fingerprint {c.tokenizer_fingerprint})" for k, c in caches.items())
        raise TrainDataError(f"step {step_name!r}: the mixture's components were tokenized with different"
                             f" tokenizers — {listed}; tokenize them all with one tokenizer")


def preference_components(caches: Mapping[str, TokenizedCache | Step]) -> list[str]:
    """The components that are preference caches (chosen/rejected pairs): a cache's record says, and a tokenize step
    that makes one (`TokenizeStep.preference`)."""
    return sorted(k for k, c in caches.items()
                  if (c.preference if isinstance(c, (TokenizedCache, TokenizeStep)) else False))


def refuse_preference_caches(what: str, caches: Mapping[str, TokenizedCache | Step],
                             error: type[Exception] = TrainDataError) -> None:
    """`error` naming `what` (`step 'x'`) and its preference-cache components, if it has any: their rows are pairs of
    conversations that only DPO reads (`dpo_step`), not text a language model trains on."""
    found = preference_components(caches)
    if found:
        raise error(f"{what}: component(s) {found} are preference caches (chosen/rejected pairs, made by"
                    " preference_tokenize_step); only DPO trains on them: use dpo_step")


def check_data_fills_batches(step_name: str, caches: Mapping[str, TokenizedCache], stages: Stages,
                             trainer: TrainerSpec, model: ModelSpec, budget: TokenBudget | None = None) -> None:
    """Every component the run trains on holds at least one batch (train_batch_size × seq_len tokens) in its
    train split, within its token budget; every validation split holds a sequence (counts from the records).

    Levanter would otherwise fail inside its data loader (an IndexError) or evaluate nothing.
    """
    per_batch = trainer.batch_tokens(model)
    batch = f"one batch ({trainer.train_batch_size} sequences × {model.seq_len} tokens = {per_batch:,} tokens)"
    trained = [k for k in caches if any(w.get(k, 0) > 0 for _, w in stages)]
    budgets = (budget or TokenBudget()).component_tokens
    for k in trained:
        splits = caches[k].splits
        if "train" not in splits:
            raise TrainDataError(f"step {step_name!r}: component {k!r} has no train split (its splits:"
                                 f" {sorted(splits)}), but the mixture trains on it")
        stats = splits["train"]
        if stats.tokens < per_batch:
            raise TrainDataError(f"step {step_name!r}: component {k!r} has {stats.tokens:,} train tokens in"
                                 f" {_documents(stats.documents)}, less than {batch}; give it more data, or lower"
                                 " train_batch_size or seq_len")
        if k in budgets and budgets[k] > stats.tokens:
            raise TrainDataError(f"step {step_name!r}: the token budget asks for the first {budgets[k]:,} tokens of"
                                 f" component {k!r}, which has only {stats.tokens:,} train tokens")
    for k, cache in caches.items():
        held = cache.splits.get("validation")
        if held is not None and held.tokens < model.seq_len:
            raise TrainDataError(f"step {step_name!r}: component {k!r} has {held.tokens:,} validation tokens in"
                                 f" {_documents(held.documents)}, less than one sequence of {model.seq_len} tokens")


def _documents(n: int) -> str:
    return f"{n:,} document" + ("" if n == 1 else "s")
