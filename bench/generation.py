"""Generation: the engine (`training/generation.py`, Levanter's paged KV cache) ÷ the sampler it replaced in the RL step
(`levanter_rl.make_sampler`: every new token recomputes the whole sequence), in tokens written per second.

Same model (the demo's Llama shape, 787k parameters, random weights: the speed does not depend on them), same prompts
(random ids of a chat-templated arithmetic prompt's length), same number of new tokens for every sequence (no EOS in
the vocabulary: both write exactly `new` tokens), same temperature and seed. Both are compiled before timing (a
warm-up round each), then timed in rotated order. Two shapes: the RL experiment's rollout (16 prompts × 8 samples,
8 new tokens: `experiments/rl_arithmetic.py`) and longer completions (64 new tokens), where a KV cache counts more.
"""

from __future__ import annotations

import os
import statistics
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


STEP_PROMPTS, STEP_NEW = 96, 96
"""The generation step's workload: 96 prompts, 96 new tokens each (sampled at temperature 1: EOS ends few)."""


def measure_step(reps: int = 3) -> dict:
    """The generation step ÷ the engine alone, in completion tokens per second of wall time: the step
    (`generate_step`, materialized: the checkpoint loaded from storage, the engine built and compiled, completions
    written as parquet, the record and status) against the same generation by a `Generator` on the model already in
    memory and compiled. Same checkpoint (the demo's Llama shape, trained 2 steps on generated stories), prompts,
    sampling and seed; a fresh step name each repetition, so the step is never a cache hit."""
    import tempfile

    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.record import load_result
    from marin_assets.core.step import walk
    from marin_assets.experiments import tiny_stories
    from marin_assets.pipeline.evals.completions import GenerationResult, generate_step
    from marin_assets.pipeline.evals.kind import Checkpoint
    from marin_assets.pipeline.evals.token_scores import document_start_id, token_scorer
    from marin_assets.pipeline.training.generation import EngineSettings, Generator, Sampling
    from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec
    from marin_assets.pipeline.training.training_run import TrainResult

    prefix = tempfile.mkdtemp(prefix="bench-generation-")
    os.environ["MARIN_PREFIX"] = prefix
    pipeline = tiny_stories.build("bench-gen", train_documents=400, validation_documents=40, vocab_size=512,
                                  model=ModelSpec(hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4,
                                                  num_kv_heads=4, seq_len=256),
                                  trainer=TrainerSpec(num_train_steps=2, train_batch_size=4, checkpoint_every=2,
                                                      steps_per_eval=2, max_eval_batches=1))
    for step in walk([pipeline.train]):
        materialize_step(step, prefix=prefix)
    prompts = [f"Story {i}: once upon a time there was" for i in range(STEP_PROMPTS)]
    sampling = Sampling(max_tokens=STEP_NEW, temperature=1.0, seed=3)
    train = load_result(pipeline.train, TrainResult)
    model, tokenizer_path = train.model_and_tokenizer()
    checkpoint = Checkpoint(train.checkpoint_path(), model, tokenizer_path, train.vocab_size)
    with token_scorer(checkpoint, "the benchmark's model") as scorer:
        tok = scorer.tokenizer
        ids = [[document_start_id(tok), *tok(p, add_special_tokens=False)["input_ids"]] for p in prompts]
        generator = Generator(scorer.model, settings=EngineSettings.for_length(model.seq_len, 32),  # the step's
                              vocab_limit=len(tok), eos_ids=[tok.eos_token_id], tokenizer=tok)

        def engine() -> int:
            return sum(len(c.tokens) for row in generator.generate(ids, sampling) for c in row)

        engine()  # compiled before timing
        step_rates, engine_rates, loads, generating = [], [], [], []
        for rep in range(reps):
            for kind in rotated(["step", "engine"], rep):
                started = time.perf_counter()
                if kind == "engine":
                    written = engine()
                    engine_rates.append(written / (time.perf_counter() - started))
                else:
                    step = generate_step(f"generations/bench-{rep}", pipeline.train, prompts, sampling)
                    materialize_step(step, prefix=prefix)
                    wall = time.perf_counter() - started
                    result = load_result(step, GenerationResult)
                    step_rates.append(result.completion_tokens / wall)
                    loads.append(result.load_seconds)
                    generating.append(result.seconds)
    note = (f"{STEP_PROMPTS} prompts × {STEP_NEW} tokens; the step's median load {statistics.median(loads):.1f} s,"
            f" engine build, compile and generation {statistics.median(generating):.1f} s")
    return compare("generation_step", "The generation step ÷ the engine alone (completion tokens/s, wall)",
                   step_rates, engine_rates, "tokens/s", goal=("ratio", ">=", 0.9), note=note)
