"""A model writes: Levanter's generation engine (`levanter.inference.engine`: a paged KV cache and a scheduler)
behind one call, `Generator.generate(prompts, sampling)`.

What this adds to the engine:
- **Every prompt is answered.** `InferenceEngine.generate` admits requests in one prefill and returns an empty
  completion, silently, for those that did not fit (more prompts than `max_seqs_in_prefill`, more prompt tokens than
  the prefill buffer, more samples than free slots). Prompts go in batches that fit, and a completion shorter than
  it may be without a stop is an error, never a short result.
- **Every sample is the model's**: each of a prompt's n samples is its own sequence. Levanter's clones, which
  share the first sample's prefill, decode from a cache that does not hold the prompt (their log-probs are not the
  model's), so they are not used.
- **Seeded sampling is deterministic**: prompt `i`'s key is `fold_in(PRNGKey(seed), i)` (sample `k > 0` folds in
  `k`), and the batches depend only on the prompts and the settings, so the same model, prompts
  and `Sampling` give the same tokens in any process. Greedy (`temperature == 0`) needs no key.
- **Padding rows of the embedding are never written**: a model's vocabulary is rounded up past its tokenizer's
  (`ModelSpec.vocab_multiple`); ids at or past `vocab_limit` get no probability.
- **Stops and finish reasons**: EOS ids and stop sequences end a completion, which then excludes them
  (`finish_reason="stop"`); otherwise it has `max_tokens` tokens (`"length"`), as OpenAI's API reports.

Levanter and JAX are imported inside functions, so importing this module costs nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from marin_assets.pipeline.training.specs import SpecError

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sampling:
    """How a model writes. Every field enters the identity of a step that generates: they decide the tokens."""

    max_tokens: int = 64
    """Most tokens written after each prompt (a stop ends a completion sooner)."""
    temperature: float = 0.0
    """0: greedy, the most likely token every time; above 0: sampled from the softmax of logits ÷ temperature."""
    top_p: float = 1.0
    """Nucleus sampling: only the likeliest tokens whose probabilities sum past `top_p` are drawn from (1: all)."""
    n: int = 1
    """Completions per prompt, each drawn with its own key (greedy ones are equal)."""
    seed: int = 0
    """The sampling key's seed: the same seed, model and prompts give the same completions."""
    stop: tuple[str, ...] = ()
    """Texts that end a completion where they appear (tokenized with the model's tokenizer), besides EOS."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise SpecError(f"sampling max_tokens must be at least 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SpecError(f"sampling temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SpecError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise SpecError(f"sampling n must be at least 1, got {self.n}")
        if any(not s for s in self.stop):
            raise SpecError("a stop sequence is empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Completion:
    """One completion of one prompt."""

    prompt: int
    """The prompt's index in the call."""
    sample: int
    """Which of the prompt's `n` samples (0 … n−1)."""
    tokens: list[int]
    """The tokens written, without the stop that ended them."""
    finish_reason: FinishReason
    """`stop` (EOS or a stop sequence ended it) or `length` (`max_tokens` written)."""
    logprobs: list[float] = field(default_factory=list)
    """Each token's log-probability under the distribution it was drawn from (temperature and top-p applied;
    greedy: the model's own)."""


class GenerationError(RuntimeError):
    """The engine did not answer a prompt whole, or a prompt cannot be answered (too long, a model without decode)."""


@dataclass(frozen=True)
class EngineSettings:
    """How much the engine holds at once: not identity (the tokens do not depend on it, only the speed)."""

    max_seq_len: int
    """Prompt plus completion, at most (the model's `seq_len`)."""
    max_seqs: int = 32
    """Sequences decoded together (prompts × n in one batch)."""
    page_size: int = 16
    """Tokens per KV-cache page."""
    max_prefill_tokens: int = 2048
    """Prompt tokens prefilled in one call (a prompt longer than this is refused)."""
    max_rounds: int = 16
    """Decode steps per compiled loop call."""
    max_stop_tokens: int = 16
    """Longest stop sequence, in tokens."""
    max_stop_seqs: int = 4
    """Stop sequences per completion, EOS ids included."""
    max_pages: int | None = None
    """KV-cache pages in all. None: four times what lets every sequence reach `max_seq_len` (n > 1 samples need more
    than that minimum: `Generator._batches` sizes their batches to the pages)."""

    @classmethod
    def for_length(cls, seq_len: int, max_seqs: int = 32, **settings: Any) -> EngineSettings:
        """Settings for a model of `seq_len` positions: a prefill holds a whole prompt of that length."""
        return cls(max_seq_len=seq_len, max_seqs=max_seqs, max_prefill_tokens=max(2048, seq_len), **settings)

    def engine_config(self) -> Any:
        """Levanter's `InferenceEngineConfig` for these settings, in float32 (what the Generator and the server
        build their engine from)."""
        import jax.numpy as jnp
        from levanter.inference.engine import InferenceEngineConfig

        pages_per_seq = -(-self.max_seq_len // self.page_size)
        return InferenceEngineConfig(
            max_seq_len=self.max_seq_len, page_size=self.page_size,
            max_pages=self.max_pages or 4 * self.max_seqs * pages_per_seq, max_seqs=self.max_seqs,
            max_seqs_in_prefill=self.max_seqs, max_prefill_size=self.max_prefill_tokens,
            max_queued_tokens=max(64, self.max_seqs), max_rounds=self.max_rounds, compute_dtype=jnp.float32,
            max_stop_seqs=self.max_stop_seqs, max_stop_tokens=self.max_stop_tokens)


def vocab_limited(model: Any, vocab_limit: int) -> Any:
    """`model` whose logits give no probability to ids at or past `vocab_limit` (the embedding's padding rows)."""
    if vocab_limit >= model.Vocab.size:
        return model
    return _vocab_limited_class()(model, vocab_limit)


@functools.cache
def _vocab_limited_class() -> type:
    """One class for every wrapped model: the engine's compiled prefill and decode are keyed by the model's type,
    so a class made per call (per RL update's new weights, per generation step) would compile them anew each time."""
    import equinox as eqx
    import haliax as hax
    import jax.numpy as jnp

    class VocabLimited(eqx.Module):
        inner: Any
        limit: int = eqx.field(static=True)

        @property
        def Vocab(self) -> Any:  # noqa: N802 (Levanter's name)
            return self.inner.Vocab

        @property
        def Pos(self) -> Any:  # noqa: N802
            return self.inner.Pos

        def initial_cache(self, spec: Any, *, dtype: Any) -> Any:
            return self.inner.initial_cache(spec, dtype=dtype)

        def decode(self, input_ids: Any, kv_cache: Any, batch_info: Any, pos_ids: Any, *, key: Any = None) -> Any:
            logits, cache = self.inner.decode(input_ids, kv_cache, batch_info, pos_ids, key=key)
            allowed = hax.arange(self.inner.Vocab) < self.limit
            return hax.where(allowed, logits, jnp.finfo(jnp.float32).min), cache

    return VocabLimited


class Generator:
    """One loaded model writing completions with Levanter's engine (built once: its KV cache is allocated here)."""

    def __init__(self, model: Any, *, settings: EngineSettings, vocab_limit: int | None = None,
                 eos_ids: Sequence[int] = (), tokenizer: Any = None, who: str = "the model") -> None:
        """`model`: a Levanter LM-head model with paged decode (`decode`, `initial_cache`: Llama's); `vocab_limit`:
        the tokenizer's size (ids past it are padding); `eos_ids`: tokens that end a completion; `tokenizer`:
        what turns stop texts into ids (a transformers tokenizer); `who` names the model in errors."""
        from levanter.inference.engine import InferenceEngine

        if not (hasattr(model, "decode") and hasattr(model, "initial_cache")):
            raise GenerationError(f"{who} ({type(model).__name__}) has no paged decode in Levanter, so it cannot"
                                  " generate with the engine; Llama-family models can")
        self.who, self.settings, self.tokenizer = who, settings, tokenizer
        self.eos_ids = tuple(int(t) for t in eos_ids)
        self.vocab_limit = vocab_limit if vocab_limit is not None else model.Vocab.size
        self.model = vocab_limited(model, self.vocab_limit)
        self.config = settings.engine_config()
        self.engine = InferenceEngine.from_model_with_config(self.model, _Detokenizer(tokenizer), self.config)

    def set_weights(self, model: Any) -> None:
        """Write with new weights of the same model (an RL policy after an update): the cache is kept."""
        self.model = vocab_limited(model, self.vocab_limit)
        self.engine.model = self.model

    def stop_ids(self, sampling: Sampling) -> list[list[int]]:
        """The token sequences that end a completion: each EOS id, then each stop text's tokens."""
        stops = [[t] for t in self.eos_ids]
        for text in sampling.stop:
            if self.tokenizer is None:
                raise GenerationError(f"stop sequences need {self.who}'s tokenizer")
            stops.append(list(self.tokenizer(text, add_special_tokens=False)["input_ids"]))
        too_long = [s for s in stops if len(s) > self.settings.max_stop_tokens]
        if too_long or len(stops) > self.settings.max_stop_seqs:
            raise GenerationError(f"{len(stops)} stop sequences (EOS included), the longest {max(map(len, stops))}"
                                  f" tokens; the engine holds {self.settings.max_stop_seqs} of at most"
                                  f" {self.settings.max_stop_tokens} tokens (EngineSettings)")
        return stops

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[list[Completion]]:
        """`sampling.n` completions of each prompt (token ids), in the prompts' order."""
        s = self.settings
        if sampling.n > s.max_seqs:
            raise GenerationError(f"n={sampling.n} samples per prompt, more than the engine's {s.max_seqs} sequences"
                                  " (EngineSettings.max_seqs)")
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise GenerationError(f"prompt {i} is empty")
            if len(prompt) + sampling.max_tokens > s.max_seq_len:
                raise GenerationError(f"prompt {i} has {len(prompt)} tokens: with max_tokens={sampling.max_tokens}"
                                      f" it passes {self.who}'s {s.max_seq_len} positions")
            if len(prompt) > s.max_prefill_tokens:
                raise GenerationError(f"prompt {i} has {len(prompt)} tokens, more than one prefill holds"
                                      f" ({s.max_prefill_tokens}: EngineSettings.max_prefill_tokens)")
        stops = self.stop_ids(sampling)
        out: list[list[Completion]] = []
        for batch in self._batches(prompts, sampling.n):
            out.extend(self._generate_batch(prompts, batch, sampling, stops))
        return out

    def _batches(self, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        """Prompt indices in runs that one engine call admits whole: at most `max_seqs // n` prompts and
        `max_prefill_tokens` prompt tokens each (each of a prompt's n samples is its own sequence and prefill). They
        depend only on the prompts and the settings (the tokens do not depend on them)."""
        per_batch = max(1, self.settings.max_seqs // n)
        batches: list[list[int]] = []
        current: list[int] = []
        tokens = 0
        for i, prompt in enumerate(prompts):
            if current and (len(current) == per_batch
                            or tokens + n * len(prompt) > self.settings.max_prefill_tokens):
                batches.append(current)
                current, tokens = [], 0
            current.append(i)
            tokens += n * len(prompt)
        if current:
            batches.append(current)
        return batches

    def _generate_batch(self, prompts: Sequence[Sequence[int]], batch: list[int], sampling: Sampling,
                        stops: list[list[int]]) -> list[list[Completion]]:
        import haliax as hax
        import jax.numpy as jnp
        import numpy as np
        from levanter.inference.engine import Request
        from levanter.inference.jit_scheduler import SeqDecodingParams
        from levanter.inference.utils import INVALID

        stop_array = None
        if stops:
            width = max(map(len, stops))
            padded = [[INVALID] * (width - len(s)) + s for s in stops]  # left-padded, as the engine reads them
            stop_array = hax.named(jnp.asarray(padded, dtype=jnp.int32), ("stop_seq", "position"))
        keys = _sample_keys(sampling.seed, batch, sampling.n)
        # Plain numpy values: the engine reads each request's parameters back to the host (`np.asarray`), so
        # device scalars would cost a transfer each (128 requests: ~0.4 s of a 2.5 s call).
        temperature, top_p = np.float32(sampling.temperature), np.float32(sampling.top_p)
        # Each of a prompt's n samples is a request of its own, with its own prefill: Levanter's clones
        # (`n_generations` > 1) decode from a cache that does not hold the prompt as the first sample's does
        # (marin-levanter 0.2.227: the clones' log-probs differ from the model's by up to 4.8 nats on a prompt the
        # first sample matches exactly, and they write text unrelated to it), which broke RL's rollouts.
        requests = [Request(prompt_tokens=[int(t) for t in prompts[i]], request_id=j * sampling.n + k,
                            n_generations=1,
                            decode_params=SeqDecodingParams(
                                max_num_tokens=np.int32(len(prompts[i]) + sampling.max_tokens),
                                stop_tokens=stop_array, temperature=temperature, top_p=top_p,
                                key=keys[j * sampling.n + k]))
                    for j, i in enumerate(batch) for k in range(sampling.n)]
        try:
            result = self.engine.generate(requests)
        except Exception as e:  # noqa: BLE001 - the engine's page allocator fails inside a JAX callback
            if "Out of free pages" not in str(e):
                raise
            raise GenerationError(f"the engine ran out of KV-cache pages ({self.config.max_pages} of"
                                  f" {self.settings.page_size} tokens) writing {len(requests)} prompts × {sampling.n}"
                                  " samples: give EngineSettings(max_pages=…) more, or max_seqs less") from None
        completions: list[list[Completion]] = []
        for j, i in enumerate(batch):
            row = []
            for k in range(sampling.n):
                tokens = [int(t) for t in result.tokens[j * sampling.n + k]]
                logprobs = list(result.logprobs[j * sampling.n + k]) if result.logprobs else []
                row.append(self._completion(i, k, tokens, logprobs, sampling, stops))
            completions.append(row)
        return completions

    def _completion(self, prompt: int, sample: int, tokens: list[int], logprobs: list[float], sampling: Sampling,
                    stops: list[list[int]]) -> Completion:
        for stop in stops:
            if len(tokens) >= len(stop) and tokens[len(tokens) - len(stop):] == stop:
                cut = len(tokens) - len(stop)
                return Completion(prompt, sample, tokens[:cut], "stop", logprobs[:cut])
        if len(tokens) >= sampling.max_tokens:
            return Completion(prompt, sample, tokens[:sampling.max_tokens], "length", logprobs[:sampling.max_tokens])
        raise GenerationError(f"the engine wrote {len(tokens)} of prompt {prompt}'s (sample {sample})"
                              f" {sampling.max_tokens} tokens without a stop: it did not answer the prompt whole")


def cut_at_stop_texts(tokenizer: Any, completion: Completion, stops: Sequence[str]) -> tuple[Completion, str]:
    """The completion's text cut before the first stop text in it, and the completion cut to the tokens before that.

    The engine stops on a stop text's own tokens; a model can write the same text through other tokens (`"\\n\\n"`
    as one token or two, a word's leading space joined to it), which only the text shows. lm-eval cuts
    `generate_until` answers the same way (at the first occurrence of any `until` text)."""
    text = tokenizer.decode(completion.tokens, skip_special_tokens=True)
    cut = min((i for s in stops if s and (i := text.find(s)) >= 0), default=-1)
    if cut < 0:
        return completion, text
    text = text[:cut]
    keep = 0
    while keep < len(completion.tokens):
        prefix = tokenizer.decode(completion.tokens[:keep + 1], skip_special_tokens=True)
        if len(prefix) > cut or not text.startswith(prefix):
            break
        keep += 1
    return replace(completion, tokens=completion.tokens[:keep], logprobs=completion.logprobs[:keep],
                   finish_reason="stop"), text


def _sample_keys(seed: int, prompts: Sequence[int], n: int) -> Any:
    """The PRNG keys of prompts' samples as one host array, row `j * n + k` for sample k of `prompts[j]`: the seed,
    the prompt's index and the sample alone decide a key (sample 0's is `fold_in(PRNGKey(seed), i)`, what n=1 draws;
    sample k > 0 folds k into that)."""
    import jax
    import numpy as np

    index = np.repeat(np.asarray(prompts, dtype=np.uint32), n)
    sample = np.tile(np.arange(n, dtype=np.uint32), len(prompts))
    return np.asarray(_fold_keys()(jax.random.PRNGKey(seed), index, sample))


@functools.cache
def _fold_keys() -> Any:
    """One compiled call that folds every sample's key (folding them one by one costs ~3 ms of dispatch each)."""
    import jax
    import jax.numpy as jnp

    def one(base: Any, i: Any, k: Any) -> Any:
        first = jax.random.fold_in(base, i)
        return jnp.where(k == 0, first, jax.random.fold_in(first, k))

    return jax.jit(jax.vmap(one, in_axes=(None, 0, 0)))


class _Detokenizer:
    """What the engine asks of a tokenizer: only `decode`, for its debug log."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pad_token_id = getattr(tokenizer, "pad_token_id", None)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))
