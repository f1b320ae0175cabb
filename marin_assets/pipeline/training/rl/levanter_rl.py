"""RL from verifiable rewards on Levanter's public pieces: a synchronous, on-policy, seeded loop.

Each RL iteration: choose `prompts_per_step` training problems (numpy, seeded by (seed, iteration)), sample
`samples_per_prompt` completions of each with the current policy (seeded by (seed, iteration)),
score them with the environment's reward, turn rewards into RLOO advantages, and take `updates_per_rollout`
optimizer steps of a clipped policy-gradient loss (PPO's ratio clip against the sampling policy's log-probs), with
an optional KL penalty to the initial policy (the k3 estimator, per completion token). The optimizer steps are
Levanter `Trainer.train_step`s, so checkpoints, resumption, hooks, the JSON metrics and the Hugging Face export are
Levanter's own, and checkpoints hold the policy alone (plain language-model checkpoints).

Nothing depends on wall time or on how many attempts a run took: the problems and the sampling keys are functions
of (seed, iteration) and the policy restored from a checkpoint is bit-identical, so a killed run resumes to exactly
the uninterrupted run's weights and metrics. When an iteration spans several optimizer steps, its rollout is kept
beside the checkpoints (`rollouts/iteration-N.npz`) so that a run stopped inside it resumes with the same data.

Sampling is the project's one generation engine (`training/generation.py`: Levanter's paged KV cache, the k samples
of a prompt sharing its prefill), its weights set to the policy's before each rollout and evaluation; the update
scores the written ids with the same model. `make_sampler`, the loop it replaced (every new token recomputing the
whole sequence), stays as the tests' and the benchmark's reference.

On several hosts (one JAX program, `rl_step(hosts=N)`) the updates are the program's, each host computing its share
of the batch; rollouts are not split: every host gathers the policy's weights and samples and scores the whole
rollout on its own first device, from the same seed and weights, so every host holds the same batch (host 0 alone
writes the samples and kept rollouts).

Imported only inside step functions (on the Ray workers).
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from marin_assets.core.paths import join_path
from marin_assets.pipeline.training.generation import Completion, EngineSettings, Generator, Sampling
from marin_assets.pipeline.training.rl.envs import Environment, Problem
from marin_assets.pipeline.training.rl.rloo import rloo_advantages

logger = logging.getLogger(__name__)

SAMPLES_DIR = "rl_samples"
"""Beside the checkpoints: completions with their rewards (held-out ones at every evaluation, a few training ones
per iteration), a JSON-lines file per write (`{split}-{step:09d}.jsonl`): a run adds files, never rewrites what it
wrote (object stores cannot append; a resumed run writes the step it repeats again, whole)."""
SAMPLES_FILE = "rl_samples.jsonl"
"""The one file runs before 0.2.0 rewrote at every write: still read."""
ROLLOUTS_DIR = "rollouts"


@dataclass
class RlRunConfig:
    """One RL run, as `rl_main` takes it: Levanter's configs, the environment and the RL settings."""

    trainer: Any
    """Levanter's `TrainerConfig`: its batch is prompts_per_step × samples_per_prompt sequences."""
    model: Any
    """Levanter's model config."""
    optimizer: Any
    tokenizer: str
    """The tokenizer folder (what renders prompts and decodes completions)."""
    chat_template: str
    """The template a prompt is rendered with, as a user turn and the assistant's header."""
    env: Environment
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    temperature: float
    clip_epsilon: float
    kl_coef: float
    updates_per_rollout: int
    seed: int
    """Seeds the problems chosen and the sampling keys (with the iteration)."""
    held_out_problems: int
    eval_every: int
    samples_logged: int
    """Completions written per evaluation and per iteration (under `output_path/rl_samples/`)."""
    output_path: str
    vocab_size: int
    """Rows of the model's embedding (the starting weights'; ids past the tokenizer's are never sampled)."""
    initialize_from_hf: str | bool = False
    initialize_from_checkpoint_path: str | None = None
    hf_save_path: str | None = None
    hf_save_steps: int = 10**9


# --- pure pieces: prompts, layout, decoding ---------------------------------------------------------------------

def render_prompts(tokenizer: Any, template: str, problems: list[Problem]) -> list[list[int]]:
    """Each problem's prompt as a user turn followed by the assistant's header, as SFT on the same template saw it."""
    ids = []
    for p in problems:
        got = tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}], chat_template=template,
                                            add_generation_prompt=True, tokenize=True)
        if isinstance(got, dict) or hasattr(got, "keys"):
            got = got["input_ids"]
        ids.append([int(i) for i in got])
    return ids


def layout(prompts: list[list[int]], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts left-aligned in a `[len(prompts), length]` array of `pad`, and their lengths."""
    tokens = np.full((len(prompts), length), pad, dtype=np.int32)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = p
    return tokens, np.array([len(p) for p in prompts], dtype=np.int32)


def written(prompts: list[list[int]], completions: list[Completion], length: int, eos: int,
            pad: int) -> np.ndarray:
    """Each prompt followed by its completion (and the EOS that ended it, as the policy wrote it), in a
    `[len(prompts), length]` array of `pad`: the layout the update scores."""
    tokens = np.full((len(prompts), length), pad, dtype=np.int32)
    for i, (prompt, done) in enumerate(zip(prompts, completions, strict=True)):
        row = prompt + done.tokens + ([eos] if done.finish_reason == "stop" else [])
        tokens[i, :len(row)] = row
    return tokens


def completion_spans(tokens: np.ndarray, prompt_len: np.ndarray, max_new: int, eos: int) -> np.ndarray:
    """Tokens generated per row, up to and including the first EOS (max_new if none)."""
    n = np.full(len(tokens), max_new, dtype=np.int32)
    for i in range(len(tokens)):
        generated = tokens[i, prompt_len[i]:prompt_len[i] + max_new]
        stops = np.flatnonzero(generated == eos)
        if len(stops):
            n[i] = stops[0] + 1
    return n


def decode_completions(tokenizer: Any, tokens: np.ndarray, prompt_len: np.ndarray, n: np.ndarray,
                       eos: int) -> list[str]:
    """The completions' text: generated ids before EOS, special tokens skipped."""
    texts = []
    for i in range(len(tokens)):
        ids = [int(t) for t in tokens[i, prompt_len[i]:prompt_len[i] + n[i]] if int(t) != eos]
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return texts


def loss_mask(prompt_len: np.ndarray, n: np.ndarray, length: int) -> np.ndarray:
    """1 at the completion's positions (each token predicted from the one before), 0 elsewhere."""
    positions = np.arange(length)[None, :]
    return ((positions >= prompt_len[:, None]) & (positions < (prompt_len + n)[:, None])).astype(np.float32)


def iteration_seed(seed: int, iteration: int) -> int:
    """The sampling seed of one iteration's rollout: the run's seed and the iteration alone decide it."""
    return (seed * 1_000_003 + iteration) % (2**31)


def choose_problems(count: int, available: int, seed: int, iteration: int) -> np.ndarray:
    """The training problems of an iteration: `count` indices, distinct while there are enough, from (seed,
    iteration) alone."""
    rng = np.random.Generator(np.random.PCG64([seed, iteration, 1]))
    return rng.choice(available, size=count, replace=count > available)


# --- the model's side: sampling and log-probs ---------------------------------------------------------------------

def _logits(model: Any, tokens: Any, Batch: Any, Pos: Any, vocab_limit: int, temperature: float) -> Any:
    """[batch, position, vocab] logits ÷ temperature, ids past the tokenizer's (embedding padding) impossible."""
    import haliax as hax
    import jax.numpy as jnp
    from levanter.layers.attention import AttentionMask

    out = model(hax.named(tokens, (Batch, Pos)), attn_mask=AttentionMask.causal(), key=None)
    logits = out.rearrange((Batch, Pos, model.Vocab)).array.astype(jnp.float32) / temperature
    return jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, -1e9)


def token_logprobs(model: Any, tokens: Any, Batch: Any, Pos: Any, vocab_limit: int, temperature: float) -> Any:
    """log p(token at p | tokens before p) for every position p ≥ 1 ([batch, position]; 0 at position 0)."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(_logits(model, tokens, Batch, Pos, vocab_limit, temperature)[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1)


def make_sampler(Batch: Any, Pos: Any, vocab_limit: int, eos: int, pad: int, max_new: int, temperature: float,
                 greedy: bool) -> Any:
    """A compiled (model, tokens, prompt_len, key) → tokens with up to `max_new` tokens sampled after each prompt
    (greedy: the most likely), stopping a row at EOS (pad after it). Every token recomputes the whole sequence: the
    sampler the generation engine replaced, kept as a reference (tests, the benchmark's RL sampling row)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    rows = jnp.arange(Batch.size)

    @eqx.filter_jit
    def sample(model: Any, tokens: Any, prompt_len: Any, key: Any) -> Any:
        def body(t: Any, carry: Any) -> Any:
            toks, done = carry
            logits = _logits(model, toks, Batch, Pos, vocab_limit, 1.0 if greedy else temperature)
            last = logits[rows, prompt_len + t - 1]
            if greedy:
                chosen = jnp.argmax(last, axis=-1)
            else:
                chosen = jax.random.categorical(jax.random.fold_in(key, t), last, axis=-1)
            chosen = jnp.where(done, pad, chosen).astype(toks.dtype)
            toks = toks.at[rows, prompt_len + t].set(chosen)
            return toks, done | (chosen == eos)

        out, _ = jax.lax.fori_loop(0, max_new, body, (tokens, jnp.zeros(Batch.size, dtype=bool)))
        return out

    return sample


def rl_objective(logp: Any, old_logp: Any, ref_logp: Any, mask: Any, advantages: Any, clip_epsilon: float,
                 kl_coef: float) -> tuple[Any, dict[str, Any]]:
    """The clipped policy-gradient loss per completion token (−min(ρA, clip(ρ, 1±ε)A), ρ = π/π_sampling), plus
    kl_coef × the k3 estimate of KL(π ‖ π_initial) per token; both averaged over every completion token of the
    batch. Returns (loss, metrics)."""
    import jax.numpy as jnp

    ratio = jnp.exp(logp - old_logp)
    a = advantages[:, None]
    objective = jnp.minimum(ratio * a, jnp.clip(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * a)
    tokens = jnp.maximum(mask.sum(), 1.0)
    pg = -(objective * mask).sum() / tokens
    d = ref_logp - logp
    kl = ((jnp.exp(d) - d - 1) * mask).sum() / tokens
    clipped = ((jnp.abs(ratio - 1) > clip_epsilon) * mask).sum() / tokens
    return pg + kl_coef * kl, {"pg_loss": pg, "kl": kl, "clip_fraction": clipped}


# --- rollouts ------------------------------------------------------------------------------------------------------

@dataclass
class Rollout:
    """One iteration's sampled completions, as the update reads them (numpy, `[sequences, length]`)."""

    tokens: np.ndarray
    mask: np.ndarray
    advantages: np.ndarray
    old_logprobs: np.ndarray
    ref_logprobs: np.ndarray

    def save(self, url: str) -> None:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **self.__dict__)
        from marin_assets.core.files import atomic_write

        atomic_write(url, buffer.getvalue())

    @classmethod
    def load(cls, url: str) -> Rollout | None:
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.exists(path):
            return None
        with np.load(io.BytesIO(fs.cat_file(path))) as data:
            return cls(**{k: data[k] for k in data.files})


def _write_samples(output_path: str, split: str, step: int, rows: list[dict[str, Any]]) -> None:
    """One write's sample rows as a file of their own under `SAMPLES_DIR` (atomic, any fsspec URL)."""
    from marin_assets.core.files import atomic_write

    url = join_path(output_path, SAMPLES_DIR, f"{split}-{step:09d}.jsonl")
    atomic_write(url, "".join(json.dumps(r) + "\n" for r in rows).encode())


def read_samples(output_path: str) -> list[dict[str, Any]]:
    """The samples a run wrote, a later write of the same (split, step, index) replacing an earlier one (a resumed
    run repeats its last iteration's)."""
    fs, old = fsspec.core.url_to_fs(join_path(output_path, SAMPLES_FILE))
    _, folder = fsspec.core.url_to_fs(join_path(output_path, SAMPLES_DIR))
    files = [old] if fs.exists(old) else []
    if fs.exists(folder):
        files += sorted(f for f in fs.ls(folder, detail=False) if f.endswith(".jsonl"))
    rows: dict[tuple[str, int, int], dict[str, Any]] = {}
    for file in files:
        for line in fs.cat_file(file).decode().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[(row["split"], row["step"], row["index"])] = row
    return [rows[k] for k in sorted(rows)]


class SamplingPlace:
    """Where rollouts are written and scored. One host: the trainer's devices and mesh, the weights as they are. Several
    hosts: this host's first device alone, outside the program's mesh, with the weights gathered from every host
    (the engine reads its results on the host, which a value spread over hosts does not allow)."""

    def __init__(self) -> None:
        import jax

        self.hosts = jax.process_count()
        self.lead = jax.process_index() == 0
        self.device = jax.local_devices()[0]
        self.mesh = jax.sharding.Mesh(np.array([self.device]), ("data",)) if self.hosts > 1 else None

    def __enter__(self) -> SamplingPlace:
        import contextlib

        import haliax as hax

        self._stack = contextlib.ExitStack()
        if self.mesh is not None:
            self._stack.enter_context(hax.partitioning.set_mesh(self.mesh))
            self._stack.enter_context(hax.axis_mapping({}))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def weights(self, model: Any) -> Any:
        """`model` as sampling reads it: itself on one host; on several, its whole values on this host's device."""
        if self.mesh is None:
            return model
        import jax
        from jax.experimental import multihost_utils

        return jax.device_put(multihost_utils.process_allgather(model, tiled=True), self.device)

    def batch(self, values: np.ndarray, axes: tuple[Any, ...], mesh: Any, mapping: Any) -> Any:
        """A rollout's array (the same on every host) as the update reads it: on several hosts, one value over the
        program's devices, each host holding its share."""
        import haliax as hax
        import jax
        import jax.numpy as jnp

        if self.mesh is None:
            return hax.named(jnp.asarray(values), axes)
        sharding = jax.sharding.NamedSharding(mesh, hax.partitioning.pspec_for_axis(axes, mapping))
        return hax.named(jax.make_array_from_callback(values.shape, sharding, lambda index: values[index]), axes)


def rl_main(config: RlRunConfig) -> None:
    """Train the policy on the environment's training problems with RLOO and a clipped policy gradient, resuming
    from the run's last checkpoint; evaluate greedy completions of the held-out problems every `eval_every` steps
    and at the end."""
    import jax
    import jax.numpy as jnp
    import jax.random as jrandom
    import levanter
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning
    from levanter import callbacks
    from levanter.adaptor import AdaptorExportConfig, NoAdaptorConfig
    from levanter.compat.hf_checkpoints import build_generation_config
    from levanter.main.model_init import load_model_from_source, prepare_model_init_context
    from levanter.trainer import Trainer
    from levanter.utils.jax_utils import parameter_count
    from levanter.utils.tree_utils import inference_mode

    from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer

    if bool(config.initialize_from_hf) == (config.initialize_from_checkpoint_path is not None):
        raise ValueError("start the policy from one of a Hugging Face folder or a checkpoint")
    tokenizer = load_hf_tokenizer(config.tokenizer)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"the tokenizer {config.tokenizer} has no EOS token: a completion could not end")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    env = config.env
    train_problems, held_out = env.problems("train"), env.problems("held_out")[:config.held_out_problems]
    train_prompts = render_prompts(tokenizer, config.chat_template, train_problems)
    held_prompts = render_prompts(tokenizer, config.chat_template, held_out)
    length = max(len(p) for p in train_prompts + held_prompts) + config.max_new_tokens
    if length > config.model.max_seq_len:
        raise ValueError(f"the longest prompt and {config.max_new_tokens} new tokens take {length} tokens, more"
                         f" than the model's seq_len {config.model.max_seq_len}")
    k, per_step = config.samples_per_prompt, config.prompts_per_step

    context = prepare_model_init_context(config.model, tokenizer=tokenizer,
                                         initialize_from_hf=config.initialize_from_hf, use_hf_model_config=False)
    levanter.trainer.initialize(config)
    optimizer = config.optimizer.build(config.trainer.num_train_steps)
    Pos = Axis("position", length)
    vocab_limit = len(tokenizer)

    def loss_function(model: Any, batch: dict[str, Any], *, key: Any = None) -> Any:
        del key
        tokens = batch["tokens"].array
        B = batch["tokens"].axes[0]
        logp = token_logprobs(model, tokens, B, Pos, vocab_limit, config.temperature)
        return rl_objective(logp, batch["old_logprobs"].array, batch["ref_logprobs"].array, batch["mask"].array,
                            batch["advantages"].array, config.clip_epsilon, config.kl_coef)

    with Trainer(config.trainer, optimizer, loss_function) as trainer:
        model_key, training_key = jrandom.split(jrandom.PRNGKey(config.trainer.seed), 2)
        Vocab = round_axis_for_partitioning(Axis("vocab", config.vocab_size), trainer.parameter_axis_mapping)
        source = {"hf_ref": config.initialize_from_hf} if config.initialize_from_hf else (
            {"checkpoint_path": config.initialize_from_checkpoint_path})

        def initial() -> Any:
            return load_model_from_source(context=context, Vocab=Vocab, model_key=model_key,
                                          parameter_axis_mapping=trainer.parameter_axis_mapping,
                                          compute_dtype=trainer.mp.compute_dtype,
                                          cast_to_param=trainer.mp.cast_to_param, **source)

        def policy(state: Any) -> Any:
            return inference_mode(trainer.mp.cast_to_compute(state.model), True)

        place = SamplingPlace()
        reference = inference_mode(trainer.mp.cast_to_compute(initial()), True)  # the KL's anchor, never trained
        local_reference = place.weights(reference)
        _, resuming = trainer.checkpoint_load_plan()
        if resuming:
            state = trainer.initial_state(training_key, model_init=lambda: config.model.build(Vocab, key=model_key))
        else:
            state = trainer.initial_state(training_key, model=initial())
        levanter.tracker.log_summary({"parameter_count": parameter_count(state.model)})
        trainer.add_hook(callbacks.log_performance_stats(length, trainer.config.batch_schedule), every=1)
        NoAdaptorConfig().install_export_hooks(
            trainer=trainer, converter=context.converter, tokenizer=tokenizer,
            export=AdaptorExportConfig(hf_save_path=config.hf_save_path, hf_save_steps=config.hf_save_steps,
                                       generation_config=build_generation_config(tokenizer, None)))

        Batch = Axis(trainer.config.batch_axis_name or "batch", per_step * k)
        # One engine (a paged KV cache) writes every completion, its weights set to the policy's before each use
        first = place.weights(policy(state))  # gathered outside the sampling mesh: the values span the hosts
        with place:
            generator = Generator(first, settings=EngineSettings(max_seq_len=length, max_seqs=Batch.size),
                                  vocab_limit=vocab_limit, eos_ids=[eos], tokenizer=tokenizer, who="the policy")
        scorer = jax.jit(lambda m, t: token_logprobs(m, t, Batch, Pos, vocab_limit, config.temperature))

        def evaluate(model: Any, step: int) -> None:
            """Greedy completions of every held-out problem: the pass rate and mean reward, and a few samples."""
            rewards, rows = [], []
            local = place.weights(model)
            with place:
                generator.set_weights(local)
                completions = [c for [c] in generator.generate(held_prompts,
                                                               Sampling(max_tokens=config.max_new_tokens))]
            for i, done in enumerate(completions):
                problem, text = held_out[i], tokenizer.decode(done.tokens, skip_special_tokens=True)
                rewards.append(env.reward(problem, text))
                if i < config.samples_logged:
                    rows.append({"split": "held_out", "step": step, "index": i, "prompt": problem.prompt,
                                 "answer": problem.answer, "completion": text, "reward": rewards[-1]})
            passed = float(np.mean([r >= 1.0 for r in rewards]))
            levanter.tracker.log({"eval/pass_rate": passed, "eval/reward": float(np.mean(rewards))}, step=step)
            logger.info("step %d: held-out pass rate %.3f (%d problems)", step, passed, len(rewards))
            if place.lead:
                _write_samples(config.output_path, "held_out", step, rows)

        def rollout(model: Any, iteration: int, step: int) -> Rollout:
            """Sample k completions of this iteration's problems, score them, and their advantages."""
            chosen = choose_problems(per_step, len(train_problems), config.seed, iteration)
            unique = [train_prompts[int(i)] for i in chosen]
            prompts = [p for p in unique for _ in range(k)]
            plen = np.array([len(p) for p in prompts], dtype=np.int32)
            started = time.perf_counter()
            local = place.weights(model)
            with place:
                generator.set_weights(local)
                # k samples of each prompt share its prefill; the seed is the run's and the iteration's alone
                completions = [c for row in generator.generate(unique, Sampling(
                    max_tokens=config.max_new_tokens, temperature=config.temperature, n=k,
                    seed=iteration_seed(config.seed, iteration))) for c in row]
            sampling = time.perf_counter() - started
            out = written(prompts, completions, length, eos, pad)
            n = completion_spans(out, plen, config.max_new_tokens, eos)
            texts = decode_completions(tokenizer, out, plen, n, eos)
            rewards = np.array([env.reward(train_problems[int(chosen[i // k])], t) for i, t in enumerate(texts)],
                               dtype=np.float32)
            advantages = rloo_advantages(rewards.reshape(per_step, k)).reshape(-1)
            mask = loss_mask(plen, n, length)
            with place:
                old = np.asarray(scorer(local, jnp.asarray(out)))
                ref = np.asarray(scorer(local_reference, jnp.asarray(out)))
            levanter.tracker.log({
                "rl/reward": float(rewards.mean()), "rl/pass_rate": float(np.mean(rewards >= 1.0)),
                "rl/completion_tokens": float(n.mean()),
                "rl/sequence_tokens": float((plen + n).sum()),
                "rl/truncated": float(np.mean(out[np.arange(len(out)), plen + n - 1] != eos)),
                "rl/zero_advantage_prompts": float(np.mean(np.all(advantages.reshape(per_step, k) == 0, axis=1))),
                "throughput/sampling_tokens_per_second": float(n.sum() / sampling),
                "throughput/sampling_seconds": sampling}, step=step)
            if place.lead:
                _write_samples(config.output_path, "train", step, [
                    {"split": "train", "step": step, "index": i, "prompt": train_problems[int(chosen[i // k])].prompt,
                     "answer": train_problems[int(chosen[i // k])].answer, "completion": texts[i],
                     "reward": float(rewards[i])} for i in range(min(config.samples_logged, len(texts)))])
            return Rollout(out, mask, advantages, old, ref)

        u = config.updates_per_rollout
        current: tuple[int, Rollout] | None = None
        info = None
        while int(state.step) < config.trainer.num_train_steps:
            step = int(state.step)
            if step % config.eval_every == 0:
                evaluate(policy(state), step)
            iteration = step // u
            if current is None or current[0] != iteration:
                url = join_path(config.output_path, ROLLOUTS_DIR, f"iteration-{iteration}.npz")
                made = Rollout.load(url) if u > 1 else None
                if made is None:
                    made = rollout(policy(state), iteration, step)
                    if u > 1 and place.lead:
                        made.save(url)
                current = (iteration, made)
            r = current[1]
            mesh, mapping = trainer.device_mesh, trainer.compute_axis_mapping
            batch = {"tokens": place.batch(r.tokens, (Batch, Pos), mesh, mapping),
                     "mask": place.batch(r.mask, (Batch, Pos), mesh, mapping),
                     "advantages": place.batch(r.advantages, (Batch,), mesh, mapping),
                     "old_logprobs": place.batch(r.old_logprobs, (Batch, Pos), mesh, mapping),
                     "ref_logprobs": place.batch(r.ref_logprobs, (Batch, Pos), mesh, mapping)}
            info = trainer.train_step(state, batch)
            levanter.tracker.log({"throughput/update_tokens_per_second": float(r.mask.size / info.step_duration)},
                                 step=step)
            state = info.state
        evaluate(policy(state), int(state.step))
        if info is not None:
            trainer.run_hooks(info, force=True)

    trainer.tracker.finish()


__all__ = ["RlRunConfig", "Rollout", "SAMPLES_DIR", "SAMPLES_FILE", "choose_problems", "completion_spans",
           "decode_completions", "iteration_seed", "layout", "loss_mask", "make_sampler", "read_samples",
           "render_prompts", "rl_main", "rl_objective", "token_logprobs", "written"]
