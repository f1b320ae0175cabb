"""The generation engine (`pipeline/training/generation.py`, Levanter's paged-KV-cache engine behind one call):
greedy completions of a model trained on real text equal an independent numpy float64 forward pass decoding token by
token, and the RL step's recomputing sampler; every prompt is answered however many there are; seeded sampling is the
same in another process and under another batching; stops end a completion and are left out of it; padding rows of
the embedding are never written; bad requests are refused, naming the prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from marin_assets.pipeline.training.generation import (
    Completion,
    EngineSettings,
    GenerationError,
    Generator,
    Sampling,
)
from marin_assets.pipeline.training.specs import SpecError
from tests.support.helpers import ROOT, subprocess_env
from tests.support.looking_inside import MODEL, hf_llama_logits, log_softmax, looking_inside

TINY = {"vocab": 512, "seq_len": 128, "hidden_dim": 64, "intermediate_dim": 128, "num_layers": 2, "num_heads": 4}
"""A random Llama for what needs no trained weights: built the same in every process from PRNGKey(0)."""
VOCAB_LIMIT = 500
"""The tiny model's 'tokenizer' size: ids 500..511 are the embedding's padding rows."""


def tiny_model():
    import jax
    from haliax import Axis
    from levanter.models.llama import LlamaConfig, LlamaLMHeadModel

    config = LlamaConfig(max_seq_len=TINY["seq_len"], hidden_dim=TINY["hidden_dim"],
                         intermediate_dim=TINY["intermediate_dim"], num_layers=TINY["num_layers"],
                         num_heads=TINY["num_heads"], num_kv_heads=TINY["num_heads"])
    return LlamaLMHeadModel.init(Axis("vocab", TINY["vocab"]), config, key=jax.random.PRNGKey(0))


def tiny_prompts(count: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(3, VOCAB_LIMIT, size=int(rng.integers(4, 20)))] for _ in range(count)]


@pytest.fixture(scope="module")
def tiny():
    model = tiny_model()
    return SimpleNamespace(model=model, generator=Generator(model, settings=EngineSettings(
        max_seq_len=TINY["seq_len"], max_seqs=16), vocab_limit=VOCAB_LIMIT), prompts=tiny_prompts())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The BPE model of the looking-inside tests (trained on this Python's documentation), exported, loaded as
    every evaluation loads a model, with a Generator on it."""
    from marin_assets.pipeline.evals.kind import Checkpoint
    from marin_assets.pipeline.evals.token_scores import token_scorer

    with looking_inside(tmp_path_factory, "export_bpe") as (steps, _):
        folder = steps["export_bpe"].output_path
        checkpoint = Checkpoint(path=folder, model=MODEL, tokenizer_path=folder, vocab_size=None)
        with token_scorer(checkpoint, "the looking-inside export") as scorer:
            tokenizer = scorer.tokenizer
            generator = Generator(scorer.model, settings=EngineSettings(max_seq_len=MODEL.seq_len, max_seqs=8),
                                  vocab_limit=len(tokenizer), tokenizer=tokenizer)
            texts = ["The json module", "def main():", "Return the number of", "A list is a", "import os",
                     "Raises ValueError if", "This function", "class Path"]
            prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
            yield SimpleNamespace(folder=folder, generator=generator, tokenizer=tokenizer, prompts=prompts)


def greedy_by_numpy(folder: str, prompt: list[int], steps: int, vocab_limit: int):
    """Greedy decoding with the float64 numpy forward pass, token by token, recomputing the whole sequence; each
    step's log-softmax is returned beside, to tell a near-tie."""
    ids, dists = list(prompt), []
    for _ in range(steps):
        lp = log_softmax(hf_llama_logits(folder, ids)[-1][:vocab_limit])
        dists.append(lp)
        ids.append(int(np.argmax(lp)))
    return ids[len(prompt):], dists


def test_greedy_completions_equal_a_numpy_forward_pass_token_by_token(trained):
    steps = 24
    completions = trained.generator.generate(trained.prompts, Sampling(max_tokens=steps))
    ties = compared = 0
    for prompt, [completion] in zip(trained.prompts, completions, strict=True):
        assert completion.finish_reason == "length" and len(completion.tokens) == steps
        expected, dists = greedy_by_numpy(trained.folder, prompt, steps, len(trained.tokenizer))
        for t, (got, want, lp) in enumerate(zip(completion.tokens, expected, dists, strict=True)):
            if got != want:  # float32 against float64: only a near-tie may go the other way, and then we stop
                assert lp[want] - lp[got] < 1e-4, (prompt, t, got, want, lp[want] - lp[got])
                ties += 1
                break
            # the log-prob the engine reports is the model's own for a greedy token
            assert completion.logprobs[t] == pytest.approx(lp[want], abs=2e-4)
            compared += 1
    assert ties <= 1, f"{ties} near-ties in {len(trained.prompts)} prompts"
    assert compared >= (len(trained.prompts) - 1) * steps


def test_a_stop_text_ends_the_completion_and_is_left_out(trained):
    """The trained model's tokenizer turns the stop text into ids (a model trained four steps writes few distinct
    tokens: the stop is one of them, a text that tokenizes back to it)."""
    [[free]] = trained.generator.generate(trained.prompts[:1], Sampling(max_tokens=24))
    tokens = free.tokens
    stop_id = next(t for t in tokens if trained.tokenizer(trained.tokenizer.decode([t]), add_special_tokens=False)[
        "input_ids"] == [t])
    [[stopped]] = trained.generator.generate(trained.prompts[:1], Sampling(
        max_tokens=24, stop=(trained.tokenizer.decode([stop_id]),)))
    assert stopped.finish_reason == "stop" and stopped.tokens == tokens[:tokens.index(stop_id)]


class SpacedIds:
    """A tokenizer of the tiny model's made-up vocabulary: text is ids written out, `"17 42"` → `[17, 42]`."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [int(word) for word in text.split()]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def test_a_stop_sequence_of_several_tokens_ends_where_it_first_appears(tiny):
    [[free]] = tiny.generator.generate(tiny.prompts[:1], Sampling(max_tokens=24))
    pair = free.tokens[9:11]
    first = next(i for i in range(len(free.tokens) - 1) if free.tokens[i:i + 2] == pair)
    stopping = Generator(tiny.model, settings=EngineSettings(max_seq_len=TINY["seq_len"], max_seqs=16),
                         vocab_limit=VOCAB_LIMIT, tokenizer=SpacedIds())
    [[stopped]] = stopping.generate(tiny.prompts[:1], Sampling(max_tokens=24, stop=(f"{pair[0]} {pair[1]}",)))
    assert stopped.finish_reason == "stop" and stopped.tokens == free.tokens[:first]
    assert stopped.logprobs == free.logprobs[:first]


def test_every_sampled_token_has_the_models_own_log_prob(trained):
    """n samples of each prompt at temperature 1: every token's log-prob, as the engine reports it, is the one the
    numpy float64 forward pass gives that token after its prompt and the sample's tokens before it — for every
    sample, not only the first (Levanter's clones, which share the first sample's prefill, missed by up to 4.8 nats
    and wrote text unrelated to the prompt; RL trained on them collapsed)."""
    n, steps = 3, 8
    completions = trained.generator.generate(trained.prompts, Sampling(max_tokens=steps, temperature=1.0, n=n,
                                                                        seed=5))
    checked = 0
    for prompt, row in zip(trained.prompts, completions, strict=True):
        assert [c.sample for c in row] == list(range(n))
        for c in row:
            ids = prompt + c.tokens
            lp = log_softmax(hf_llama_logits(trained.folder, ids)[:, :len(trained.tokenizer)])
            want = [lp[len(prompt) - 1 + t, token] for t, token in enumerate(c.tokens)]
            np.testing.assert_allclose(c.logprobs[:len(c.tokens)], want, atol=2e-4, err_msg=f"sample {c.sample}")
            checked += len(c.tokens)
    assert checked >= len(trained.prompts) * n * 2
    assert sum(len({tuple(c.tokens) for c in row}) > 1 for row in completions) > len(completions) // 2


def test_greedy_equals_the_recomputing_sampler_and_every_prompt_is_answered(tiny):
    """40 prompts on an engine of 16 sequences: Levanter's `generate` alone would answer only those one prefill
    admits (the rest come back empty); here every one has its tokens, the same as the RL step's own sampler's."""
    import jax
    import jax.numpy as jnp
    from haliax import Axis

    from marin_assets.pipeline.training.rl.levanter_rl import layout, make_sampler

    new = 16
    completions = tiny.generator.generate(tiny.prompts, Sampling(max_tokens=new))
    assert [len(row) for row in completions] == [1] * len(tiny.prompts)
    sampler = make_sampler(Axis("batch", len(tiny.prompts)), Axis("position", TINY["seq_len"]), VOCAB_LIMIT, eos=-1,
                           pad=0, max_new=new, temperature=1.0, greedy=True)
    tokens, lengths = layout(tiny.prompts, TINY["seq_len"], 0)
    reference = np.asarray(sampler(tiny.model, jnp.asarray(tokens), jnp.asarray(lengths), jax.random.PRNGKey(0)))
    for i, (prompt, [completion]) in enumerate(zip(tiny.prompts, completions, strict=True)):
        assert completion == Completion(i, 0, reference[i, len(prompt):len(prompt) + new].tolist(), "length",
                                        completion.logprobs), i


SAMPLING = Sampling(max_tokens=12, temperature=1.0, n=3, seed=7)

CHILD = """
import json, sys
from tests.test_generation import SAMPLING, TINY, VOCAB_LIMIT, tiny_model, tiny_prompts
from marin_assets.pipeline.training.generation import EngineSettings, Generator
g = Generator(tiny_model(), settings=EngineSettings(max_seq_len=TINY["seq_len"], max_seqs=int(sys.argv[1])),
              vocab_limit=VOCAB_LIMIT)
print(json.dumps([[c.tokens for c in row] for row in g.generate(tiny_prompts(), SAMPLING)]))
"""


def test_seeded_sampling_is_the_same_in_another_process_and_under_another_batching(tiny):
    here = [[c.tokens for c in row] for row in tiny.generator.generate(tiny.prompts, SAMPLING)]
    # another process, an engine of 8 sequences instead of 16: other batches, the same tokens
    child = subprocess.run([sys.executable, "-c", CHILD, "8"], cwd=ROOT, env=subprocess_env(), capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.strip().splitlines()[-1]) == here
    # the n samples of a prompt differ, another seed gives others, and sample 0 is what n=1 draws
    assert sum(row[0] != row[1] for row in here) > len(here) // 2
    other = tiny.generator.generate(tiny.prompts, Sampling(max_tokens=12, temperature=1.0, n=3, seed=8))
    assert sum(a[0] != b[0].tokens for a, b in zip(here, other, strict=True)) > len(here) // 2
    single = tiny.generator.generate(tiny.prompts, Sampling(max_tokens=12, temperature=1.0, seed=7))
    assert [row[0].tokens for row in single] == [row[0] for row in here]


def test_padding_rows_of_the_embedding_are_never_written(tiny):
    limited = Generator(tiny.model, settings=EngineSettings(max_seq_len=TINY["seq_len"], max_seqs=16),
                        vocab_limit=64)
    completions = limited.generate(tiny.prompts, Sampling(max_tokens=12, temperature=2.0, seed=1))
    written = {t for [c] in completions for t in c.tokens}
    assert written and max(written) < 64
    # the unlimited model does write ids past 64 with the same settings: the limit is what kept them out
    free = tiny.generator.generate(tiny.prompts, Sampling(max_tokens=12, temperature=2.0, seed=1))
    assert max(t for [c] in free for t in c.tokens) >= 64


def test_an_eos_id_ends_a_completion(tiny):
    [[free]] = tiny.generator.generate(tiny.prompts[:1], Sampling(max_tokens=16))
    eos = free.tokens[5]
    first = free.tokens.index(eos)
    ending = Generator(tiny.model, settings=EngineSettings(max_seq_len=TINY["seq_len"], max_seqs=16),
                       vocab_limit=VOCAB_LIMIT, eos_ids=[eos])
    [[stopped]] = ending.generate(tiny.prompts[:1], Sampling(max_tokens=16))
    assert stopped.finish_reason == "stop" and stopped.tokens == free.tokens[:first]
    assert len(stopped.logprobs) == len(stopped.tokens)


def test_bad_requests_are_refused_naming_the_prompt(tiny):
    long_prompt = [5] * (TINY["seq_len"] - 4)
    with pytest.raises(GenerationError, match="prompt 1 has 124 tokens: with max_tokens=8"):
        tiny.generator.generate([[5, 6], long_prompt], Sampling(max_tokens=8))
    with pytest.raises(GenerationError, match="prompt 0 is empty"):
        tiny.generator.generate([[]], Sampling(max_tokens=8))
    with pytest.raises(GenerationError, match="n=17 samples per prompt"):
        tiny.generator.generate([[5]], Sampling(max_tokens=8, n=17, temperature=1.0))
    with pytest.raises(GenerationError, match="stop sequences need"):
        tiny.generator.generate([[5]], Sampling(max_tokens=8, stop=("x",)))
    for bad in ({"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"n": 0}, {"stop": ("",)}):
        with pytest.raises(SpecError):
            Sampling(**bad)


def test_a_checkpoint_loaded_again_generates_without_compiling(tmp_path_factory, trained):
    """Two generation steps of one training run on a warm worker each load its Levanter checkpoint: the second load
    must be the same model to JAX, so its engine reuses the first's compiled prefill and decode. Before, the model's
    config named a fresh temporary reference folder on every load, and JAX's cache keys on it: the second engine
    compiled both again (the generation step ran at 0.13 of the engine alone in bench/generation.py)."""
    import jax

    from marin_assets import load_result
    from marin_assets.pipeline.evals.kind import Checkpoint
    from marin_assets.pipeline.evals.token_scores import token_scorer
    from marin_assets.pipeline.training.training_run import TrainResult

    with looking_inside(tmp_path_factory, "train_bpe") as (steps, _):
        run = load_result(steps["train_bpe"], TrainResult)
    model, tokenizer_path = run.model_and_tokenizer()
    checkpoint = Checkpoint(run.checkpoint_path(), model, tokenizer_path, run.vocab_size)
    sampling = Sampling(max_tokens=8)
    compiles: list[str] = []

    def listen(event: str, duration: float, **kwargs) -> None:
        if event.endswith("backend_compile_duration"):
            compiles.append(event)

    def load_and_generate(count: bool) -> list:
        with token_scorer(checkpoint, "checkpoints/inside-bpe") as scorer:
            generator = Generator(scorer.model, settings=trained.generator.settings,
                                  vocab_limit=len(scorer.tokenizer), tokenizer=scorer.tokenizer)
            if count:
                jax.monitoring.register_event_duration_secs_listener(listen)
            try:  # twice: the engine's second call resets its state, which compiles once more in a fresh process
                return [generator.generate(trained.prompts, sampling) for _ in range(2)]
            finally:
                if count:
                    jax.monitoring.unregister_event_duration_listener(listen)

    first = load_and_generate(count=False)
    again = load_and_generate(count=True)
    assert compiles == [], compiles
    assert [[c.tokens for c in row] for row in again[0]] == [[c.tokens for c in row] for row in first[0]]


def test_a_model_without_paged_decode_is_refused_by_name():
    with pytest.raises(GenerationError, match="the gpt2 run .* has no paged decode"):
        Generator(object(), settings=EngineSettings(max_seq_len=64), who="the gpt2 run")


def test_new_weights_and_a_new_generator_of_the_same_model_compile_nothing(tiny):
    """An RL update hands the engine new weights every iteration, and a generation step on a warm worker builds a
    new Generator: neither may compile the engine's prefill and decode again (each compile costs seconds)."""
    import jax
    import jax.numpy as jnp

    compiles: list[str] = []

    def listen(event: str, duration: float, **kwargs) -> None:
        if event.endswith("backend_compile_duration"):
            compiles.append(event)

    sampling = Sampling(max_tokens=6, temperature=1.0, n=2, seed=1)
    # compiled (if no test before did); the engine's state reset compiles again on its second call, then never
    first = tiny.generator.generate(tiny.prompts[:4], sampling)
    assert tiny.generator.generate(tiny.prompts[:4], sampling) == first
    updated = jax.tree_util.tree_map(lambda x: x * 1.01 if isinstance(x, jax.Array) and
                                     jnp.issubdtype(x.dtype, jnp.floating) else x, tiny.model)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        tiny.generator.set_weights(updated)
        again = tiny.generator.generate(tiny.prompts[:4], sampling)
        tiny.generator.set_weights(tiny.model)
        other = Generator(tiny.model, settings=tiny.generator.settings, vocab_limit=VOCAB_LIMIT)
        fresh = other.generate(tiny.prompts[:4], sampling)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == [], compiles
    assert [[c.tokens for c in row] for row in fresh] == [[c.tokens for c in row] for row in first]
    assert [[c.tokens for c in row] for row in again] != [[c.tokens for c in row] for row in first]  # new weights
