"""Per-token scores of one checkpoint: for every token of a sequence, the log-probability the model gave it,
the entropy of the distribution it was drawn from, and the token the model found most likely there — what the
log-probs evaluation (`log_probs.py`) and the perplexity gap (`perplexity_gap.py`) read.

The model is loaded with Levanter's public `levanter.model_loading` (a Levanter checkpoint or a Hugging Face
folder, as every evaluation loads it) and scored in fixed `[batch, seq_len]` blocks, so it compiles once. A
sequence longer than the model's length is scored in sliding windows (`windows`): every token is predicted exactly
once, from at least `min_context` tokens before it (or all of its document before it, near the start). The default
is half the model's length, which costs about twice the forward passes of Levanter's `perplexity_gap` chunking
(windows overlapping by one token, `min_context=1`, still available): there the first token of every window is
predicted from one token, a spike at each window start that belongs to the method, not the model. Levanter and JAX
are imported inside functions.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marin_assets.core.step import StepDefinitionError
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.tokens.tokenizer import TokenizerError, load_hf_tokenizer, model_vocab_size
from marin_assets.pipeline.training.export import is_hf_model
from marin_assets.pipeline.training.specs import TrainerSpec

logger = logging.getLogger(__name__)


class ModelTokenizerError(TokenizerError):
    """A model's tokenizer is missing or cannot serve (no tokenizer files, no offsets to map tokens to text)."""


@dataclass(frozen=True)
class TokenScores:
    """One sequence's scores: entry `i` is about token `i + 1`, predicted from tokens `0..i`."""

    log_probs: np.ndarray
    """float32, natural log: log p(token i+1 | tokens ≤ i)."""
    entropies: np.ndarray
    """float32, nats: entropy of the next-token distribution at position i (the one token i+1 was drawn from)."""
    top_ids: np.ndarray
    """int32: the id the model found most likely at position i."""


LEVANTER_CONTEXT = 1
"""The `min_context` of Levanter's `perplexity_gap` chunking: windows overlapping by one token."""


def stated_context(min_context: int | None, seq_len: int) -> int:
    """The context every scored token gets from a model of `seq_len` tokens: `min_context`, or half the model's
    length when None; a `ValueError` unless it leaves the window at least one token to score."""
    context = seq_len // 2 if min_context is None else min_context
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context < seq_len:
        raise ValueError(f"min_context must be at least 1 and below the model's length ({seq_len} tokens), got"
                         f" {min_context!r}")
    return context


def context_identity(min_context: int | None) -> dict[str, Any]:
    """What a scoring step's identity says about its windows: nothing for Levanter's one-token overlap (what every
    step scored before the setting existed, so those outputs keep their paths), else the stated context."""
    if min_context == LEVANTER_CONTEXT:
        return {}
    return {"min_context": "half the model's length" if min_context is None else min_context}


def checked_context(where: str, min_context: int | None) -> None:
    """A `StepDefinitionError` unless `min_context` is None or a positive number of tokens (the model's length,
    which bounds it, is checked when the model is loaded)."""
    if min_context is not None and (isinstance(min_context, bool) or not isinstance(min_context, int)
                                    or min_context < 1):
        raise StepDefinitionError(f"{where}: min_context must be a positive number of tokens (or None: half the"
                                  f" model's length), got {min_context!r}")


def windows(length: int, seq_len: int, min_context: int = LEVANTER_CONTEXT) -> list[tuple[int, int, int]]:
    """`(start, end, first)` per window of a sequence of `length`: the model reads tokens `[start, end)` (at most
    `seq_len`) and scores tokens `first … end - 1` from it, each with at least `min_context` tokens before it in the
    window (all of them near the sequence's start). Every token after the first is scored exactly once; the window
    moves by `seq_len - min_context` tokens (Hugging Face's sliding-window perplexity with that stride;
    `min_context=1`: Levanter's windows overlapping by one token)."""
    if seq_len < 2:
        raise ValueError(f"a model scoring windows needs a length of at least 2, got {seq_len}")
    context = stated_context(min_context, seq_len)
    spans, first = [], 1
    while first < length:
        start = max(first - context, 0)
        end = min(start + seq_len, length)
        spans.append((start, end, first))
        first = end
    return spans


class TokenScorer:
    """A loaded checkpoint scoring token sequences (made by `token_scorer`)."""

    def __init__(self, tokenizer: Any, seq_len: int, batch_size: int, pad_id: int, forward: Any, model: Any,
                 Batch: Any, Pos: Any) -> None:
        self.tokenizer = tokenizer
        """The checkpoint's tokenizer (a transformers fast tokenizer)."""
        self.seq_len = seq_len
        self.batch_size = batch_size
        self._pad, self._forward, self._model, self._Batch, self._Pos = pad_id, forward, model, Batch, Pos

    @property
    def model(self) -> Any:
        """The loaded Levanter model, in inference mode (what a `Generator` writes with)."""
        return self._model

    def context(self, min_context: int | None) -> int:
        """The context `score` gives every token for `min_context` (None: half the model's length)."""
        return stated_context(min_context, self.seq_len)

    def score(self, sequences: Sequence[np.ndarray], min_context: int | None = None) -> list[TokenScores]:
        """Scores of each sequence of token ids (a sequence of n ids gets n - 1 scores), every token predicted from at
        least `self.context(min_context)` tokens before it (`windows`)."""
        import haliax as hax
        import jax

        context = self.context(min_context)
        pieces = [(i, start, end, first) for i, ids in enumerate(sequences)
                  for start, end, first in windows(len(ids), self.seq_len, context)]
        out_lp = [np.zeros(max(len(s) - 1, 0), np.float32) for s in sequences]
        out_h = [np.zeros(max(len(s) - 1, 0), np.float32) for s in sequences]
        out_top = [np.zeros(max(len(s) - 1, 0), np.int32) for s in sequences]
        for first in range(0, len(pieces), self.batch_size):
            block = pieces[first:first + self.batch_size]
            tokens = np.full((self.batch_size, self.seq_len), self._pad, dtype=np.int32)
            for row, (i, start, end, _) in enumerate(block):
                tokens[row, :end - start] = sequences[i][start:end]
            named = hax.named(jax.numpy.asarray(tokens), (self._Batch, self._Pos))
            lp, h, top = (np.asarray(jax.device_get(a)) for a in self._forward(self._model, named))
            for row, (i, start, end, first) in enumerate(block):
                # entry j of a window is about its token j + 1; entry t - 1 of a sequence's scores about token t
                read = slice(first - start - 1, end - start - 1)
                out_lp[i][first - 1:end - 1] = lp[row, read]
                out_h[i][first - 1:end - 1] = h[row, read]
                out_top[i][first - 1:end - 1] = top[row, read]
            if (first // self.batch_size) % 50 == 49:
                logger.info("scored %d of %d windows", first + len(block), len(pieces))
        return [TokenScores(a, b, c) for a, b, c in zip(out_lp, out_h, out_top, strict=True)]


def document_start_id(tokenizer: Any) -> int | None:
    """The token training put before every document: BOS, else EOS (which ends the one before); None: neither."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def checkpoint_tokenizer(checkpoint: Checkpoint, who: str) -> Any:
    """The checkpoint's tokenizer as a transformers fast tokenizer, or a `ModelTokenizerError` naming `who`."""
    try:
        tokenizer = load_hf_tokenizer(checkpoint.tokenizer_path)
    except TokenizerError as e:
        raise ModelTokenizerError(f"{who} ({checkpoint.path}) has no usable tokenizer: {e}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelTokenizerError(f"{who} ({checkpoint.path}): its tokenizer at {checkpoint.tokenizer_path} is not a"
                                  " fast tokenizer, so it cannot map tokens to the text they cover")
    return tokenizer


@contextlib.contextmanager
def token_scorer(checkpoint: Checkpoint, who: str, batch_size: int = 8) -> Iterator[TokenScorer]:
    """`checkpoint` loaded for scoring (a Levanter checkpoint or a Hugging Face folder), in float32 unless the
    checkpoint's platform computes otherwise; `who` names it in errors (`model_a (step 'x')`)."""
    from marin_assets.pipeline.training.levanter_trainer import use_platform

    use_platform(checkpoint.platform, f"scoring {who}")  # before Levanter starts JAX
    tokenizer = checkpoint_tokenizer(checkpoint, who)
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from levanter.analysis.entropy import entropy_from_logits
    from levanter.layers.attention_mask import AttentionMask
    from levanter.model_loading import load_hf_checkpoint, load_levanter_checkpoint
    from levanter.models.loss import next_token_loss
    from levanter.utils.tree_utils import inference_mode

    from marin_assets.pipeline.tokens.levanter_cache import levanter_tokenizer
    from marin_assets.pipeline.training.levanter_model import model_config, shared_reference_config
    from marin_assets.pipeline.training.levanter_trainer import trainer_config

    model = checkpoint.model
    vocab = checkpoint.vocab_size or model_vocab_size(checkpoint.tokenizer_path, model.vocab_multiple)
    is_hf = is_hf_model(checkpoint.path)
    with tempfile.TemporaryDirectory(prefix="marin-scores-") as scratch:
        config = model_config(model, shared_reference_config(model, vocab), checkpoint.tokenizer_path)
        trainer = trainer_config(TrainerSpec(num_train_steps=1, train_batch_size=batch_size), "scores", scratch,
                                 "marin.scores", require_accelerator=checkpoint.platform not in (None, "cpu"))
        with trainer.use_device_mesh():
            if is_hf:  # its embedding keeps the folder's own rows
                lm = load_hf_checkpoint(config, checkpoint.path, axis_mapping=trainer.parameter_axis_mapping,
                                        tokenizer=levanter_tokenizer(checkpoint.tokenizer_path),
                                        compute_dtype=trainer.mp.compute_dtype, cache_ttl_days=0)
            else:
                lm = load_levanter_checkpoint(config, checkpoint.path, Vocab=hax.Axis("vocab", vocab),
                                              axis_mapping=trainer.parameter_axis_mapping, key=jax.random.PRNGKey(0))
            lm = inference_mode(lm, True)
            Batch, Pos, mp = trainer.EvalBatch.resize(batch_size), lm.Pos.resize(model.seq_len), trainer.mp

            @hax.named_jit(axis_resources=trainer.compute_axis_mapping)
            def forward(lm: Any, tokens: Any) -> tuple[Any, Any, Any]:
                logits = mp.cast_to_compute(lm)(tokens, AttentionMask.causal()).astype(jnp.float32)
                loss = next_token_loss(Pos, lm.Vocab, logits=logits, true_ids=tokens, reduction=None)
                return ((-loss).array, entropy_from_logits(logits, axis=lm.Vocab).array,
                        hax.argmax(logits, axis=lm.Vocab).array.astype(jnp.int32))

            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
            yield TokenScorer(tokenizer, model.seq_len, batch_size, pad, forward, lm, Batch, Pos)
