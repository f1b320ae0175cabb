"""Generation: the engine (`training/generation.py`, Levanter's paged KV cache) ÷ the sampler it replaced in the RL step
(`levanter_rl.make_sampler`: every new token recomputes the whole sequence), in tokens written per second.

Same model (the demo's Llama shape, 787k parameters, random weights: the speed does not depend on them), same prompts
(random ids of a chat-templated arithmetic prompt's length), same number of new tokens for every sequence (no EOS in
the vocabulary: both write exactly `new` tokens), same temperature and seed. Both are compiled before timing (a
warm-up round each), then timed in rotated order. Two shapes: the RL experiment's rollout (16 prompts × 8 samples,
8 new tokens: `experiments/rl_arithmetic.py`) and longer completions (64 new tokens), where a KV cache counts more.
"""

from __future__ import annotations

import time

import numpy as np
from measure import compare, rotated

SHAPES = {"rl": (16, 8, 8), "long": (16, 8, 64)}
"""name → (prompts, samples per prompt, new tokens)."""
PROMPT_LEN = 24
VOCAB = 1024


def _model():
    import jax
    from haliax import Axis
    from levanter.models.llama import LlamaConfig, LlamaLMHeadModel

    config = LlamaConfig(max_seq_len=128, hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4,
                         num_kv_heads=4)
    return LlamaLMHeadModel.init(Axis("vocab", VOCAB), config, key=jax.random.PRNGKey(0))


def _contenders(model, prompts: int, n: int, new: int):
    import jax
    import jax.numpy as jnp
    from haliax import Axis

    from marin_assets.pipeline.training.generation import EngineSettings, Generator, Sampling
    from marin_assets.pipeline.training.rl.levanter_rl import layout, make_sampler

    rng = np.random.default_rng(0)
    unique = [[int(t) for t in rng.integers(3, VOCAB, size=PROMPT_LEN)] for _ in range(prompts)]
    length = PROMPT_LEN + new
    generator = Generator(model, settings=EngineSettings(max_seq_len=length, max_seqs=prompts * n))
    sampling = Sampling(max_tokens=new, temperature=1.0, n=n, seed=0)
    batch = [p for p in unique for _ in range(n)]
    sampler = make_sampler(Axis("batch", len(batch)), Axis("position", length), VOCAB, eos=-1, pad=0, max_new=new,
                           temperature=1.0, greedy=False)
    tokens, lengths = layout(batch, length, 0)
    tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)

    def engine() -> int:
        return sum(len(c.tokens) for row in generator.generate(unique, sampling) for c in row)

    def recompute() -> int:
        sampler(model, tokens, lengths, jax.random.PRNGKey(0)).block_until_ready()
        return len(batch) * new

    return {"engine": engine, "recompute": recompute}


def measure(reps: int = 5) -> list[dict]:
    model = _model()
    rows = []
    for shape, (prompts, n, new) in SHAPES.items():
        run = _contenders(model, prompts, n, new)
        for fn in run.values():  # compile both first
            fn()
        rates: dict[str, list[float]] = {k: [] for k in run}
        for rep in range(reps):
            for kind in rotated(list(run), rep):
                started = time.perf_counter()
                written = run[kind]()
                rates[kind].append(written / (time.perf_counter() - started))
        name = (f"RL sampling tokens/s, the engine ÷ the recomputing sampler ({prompts} prompts × {n} samples,"
                f" {new} new tokens)")
        rows.append(compare(f"generation_{shape}", name, rates["engine"], rates["recompute"], "tokens/s",
                            goal=("ratio", ">=", 10.0) if shape == "rl" else None))
    return rows
