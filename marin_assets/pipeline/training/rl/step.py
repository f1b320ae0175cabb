"""RL from verifiable rewards as a content-addressed step, on the training-method seam.

As Marin's `make_rl_step` (RLOO on math and on small synthetic environments), with one difference that matters here:
Marin puts a timestamp in its RL run names because its runs are not reproducible, so nothing could be cached. Here
the sampling is seeded — the problems of iteration i and its sampling keys are functions of (seed, i), and the seed
is in the step's identity — so two runs of the same RL step make identical records, a re-run is a cache hit, and a
killed run resumes from its last checkpoint to the uninterrupted run's result.

The policy starts from existing weights (`from_hf(export or folder)`, `from_checkpoint(training step)`: an SFT
model, usually) and learns on an environment (`rl_envs`: a prompt source with train and held-out splits and a
verifiable reward) by a synchronous on-policy loop (`levanter_rl.rl_main`): k sampled completions per prompt, their
rewards, RLOO advantages, a clipped policy-gradient update, an optional KL penalty to the initial policy. The step
is a `TrainStep` whose record is a `TrainResult` with `rl` (`RlMetrics`: reward, held-out pass rate, KL and
completion length per step, completions with rewards) and whose checkpoints are plain language-model checkpoints, so
export, loss evaluation and per-checkpoint evaluations work on it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.record import load_result
from marin_assets.core.step import Resources, StepDefinitionError, made_by
from marin_assets.pipeline.tokens.tokenize import TokenizedCache
from marin_assets.pipeline.tokens.tokenizer import largest_token_id, load_hf_tokenizer
from marin_assets.pipeline.training.estimates import training_estimate
from marin_assets.pipeline.training.export import ExportStep
from marin_assets.pipeline.training.rl.envs import Environment, check_environment
from marin_assets.pipeline.training.runner import RunPlaces, platform_for, run_training
from marin_assets.pipeline.training.sources import InitFrom, InitWeights, TrainSourceError, model_of, resolve_weights
from marin_assets.pipeline.training.specs import DeviceLayout, ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.tracking import Tracking
from marin_assets.pipeline.training.training_run import TrainResult, TrainStep

SAMPLER = "levanter-engine-v2"
"""Enters identity: what writes the rollouts (since 0.2.0 the generation engine, `training/generation.py`; 0.1's
loop recomputed every sequence and drew other tokens from the same seed, so its runs are other outputs). v2: each
of a prompt's samples is its own sequence; v1's were Levanter's clones, which wrote from a cache without the prompt
(the experiment's held-out pass rate fell from 0.273 to 0.030 on them)."""

RL_OPTIMIZER = OptimizerSpec(learning_rate=1e-4, weight_decay=0.0, warmup=0.0, lr_schedule="constant",
                             min_lr_ratio=1.0)
"""Policy-gradient AdamW: constant rate, no decay (the rollouts keep changing, so no schedule is tuned to them)."""


@dataclass(frozen=True)
class RlSpec:
    """How an RL run samples and updates: every field changes the result, so every field is identity."""

    prompts_per_step: int = 8
    """Training problems per iteration."""
    samples_per_prompt: int = 8
    """Completions sampled per problem (k ≥ 2: RLOO's baseline for one is the mean of the others)."""
    max_new_tokens: int = 8
    """A completion stops at EOS or after this many tokens."""
    temperature: float = 1.0
    """Sampling temperature; the policy's log-probs in the loss are of the same tempered distribution."""
    clip_epsilon: float = 0.2
    """PPO's ratio clip: a token's probability ratio to the sampling policy counts only within 1 ± ε."""
    kl_coef: float = 0.0
    """Weight of the KL(policy ‖ initial policy) penalty per token (0: measured, not penalized)."""
    updates_per_rollout: int = 1
    """Optimizer steps on each iteration's completions (1: strictly on-policy, the ratio is 1 and the clip idle)."""
    seed: int = 0
    """Seeds which problems each iteration samples and the sampling keys."""
    held_out_problems: int = 64
    """Held-out problems evaluated (greedy) every `eval_every` steps and at the end (at most the split's size)."""
    eval_every: int = 10
    samples_logged: int = 8
    """Completions kept per evaluation and per iteration (the record keeps the first and last evaluation's)."""

    def __post_init__(self) -> None:
        problems = []
        if self.prompts_per_step < 1:
            problems.append(f"prompts_per_step must be positive, got {self.prompts_per_step}")
        if self.samples_per_prompt < 2:
            problems.append(f"samples_per_prompt must be at least 2 (RLOO leaves one out), got"
                            f" {self.samples_per_prompt}")
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if not self.temperature > 0:
            problems.append(f"temperature must be positive, got {self.temperature}")
        if not self.clip_epsilon > 0:
            problems.append(f"clip_epsilon must be positive, got {self.clip_epsilon}")
        if self.kl_coef < 0:
            problems.append(f"kl_coef must not be negative, got {self.kl_coef}")
        if self.updates_per_rollout < 1 or self.eval_every < 1 or self.held_out_problems < 1:
            problems.append("updates_per_rollout, eval_every and held_out_problems must be positive")
        if problems:
            raise StepDefinitionError("RlSpec: " + "; ".join(problems))

    @property
    def batch_size(self) -> int:
        """Sequences per optimizer step: prompts × samples."""
        return self.prompts_per_step * self.samples_per_prompt


@dataclass(frozen=True)
class RlTraining:
    """RL as a method on the runner (`levanter_rl.rl_main`): the policy, from pretrained weights, on an
    environment's problems."""

    output_path: str
    tokenizer_path: str
    chat_template: str
    env: Environment
    rl: RlSpec
    model: ModelSpec
    optimizer: OptimizerSpec
    trainer: TrainerSpec
    vocab_size: int
    init: InitWeights
    tracking: Tracking | None = None
    name: str = "rl"

    @property
    def caches(self) -> dict[str, str]:
        return {}  # the data is sampled, not read

    def entry_point(self) -> Callable[[Any], Any]:
        from marin_assets.pipeline.training.rl.levanter_rl import rl_main

        return rl_main

    def config(self, places: RunPlaces) -> Any:
        from marin_assets.pipeline.training.levanter_model import model_config, optimizer_config
        from marin_assets.pipeline.training.levanter_trainer import trainer_config
        from marin_assets.pipeline.training.rl.levanter_rl import RlRunConfig

        rl = self.rl
        return RlRunConfig(
            trainer=trainer_config(self.trainer, places.run_id, places.local_dir, places.metrics_logger,
                                   places.checkpoints, require_accelerator=places.platform not in (None, "cpu"),
                                   tracking=self.tracking, layout=places.layout),
            model=model_config(self.model, places.reference, self.tokenizer_path),
            optimizer=optimizer_config(self.optimizer), tokenizer=self.tokenizer_path,
            chat_template=self.chat_template, env=self.env, prompts_per_step=rl.prompts_per_step,
            samples_per_prompt=rl.samples_per_prompt, max_new_tokens=rl.max_new_tokens, temperature=rl.temperature,
            clip_epsilon=rl.clip_epsilon, kl_coef=rl.kl_coef, updates_per_rollout=rl.updates_per_rollout,
            seed=rl.seed, held_out_problems=rl.held_out_problems, eval_every=rl.eval_every,
            samples_logged=rl.samples_logged, output_path=places.output_path, vocab_size=self.vocab_size,
            # the initial weights, always: the KL's reference (a resumed run's policy comes from its own checkpoint)
            initialize_from_hf=self.init.path if self.init.model is None else False,
            initialize_from_checkpoint_path=None if self.init.model is None else self.init.path,
            hf_save_path=places.hf_save_path)

    def finish(self, result: TrainResult, metrics: dict[int, dict[str, Any]]) -> TrainResult:
        from marin_assets.pipeline.training.rl.levanter_rl import read_samples
        from marin_assets.pipeline.training.rl.metrics import rl_metrics

        held = min(self.rl.held_out_problems, len(self.env.problems("held_out")))
        samples = read_samples(self.output_path)
        # the tokens trained on: each rollout's real sequences (prompt and completion, EOS included; no padding),
        # once per update made on it
        u, steps = self.rl.updates_per_rollout, self.trainer.num_train_steps
        rolled = [(s, float(m["rl/sequence_tokens"])) for s, m in metrics.items() if "rl/sequence_tokens" in m]
        tokens = int(sum(t * min(u, steps - s) for s, t in rolled)) if rolled else result.train_tokens
        return replace(result, train_tokens=tokens,
                       method_metrics=rl_metrics(metrics, self.env.identity(), held, samples))


def rl_train(output_path: str, tokenizer_path: str, chat_template: str, env: Environment, rl: RlSpec,
             model: ModelSpec, optimizer: OptimizerSpec, trainer: TrainerSpec, init: InitWeights,
             platform: str | None = None, *, tracking: Tracking | None = None,
             layout: DeviceLayout | None = None) -> TrainResult:
    """Train the weights `init` with RL on `env` (resumes if interrupted): prompts rendered with `chat_template`
    and the tokenizer at `tokenizer_path`, sampling and updates as `rl` says, `trainer.num_train_steps` optimizer
    steps of `rl.batch_size` sequences. `platform`: the JAX platform (`cuda`; None: JAX's choice); `layout`: how
    the devices are split (None: Levanter's default)."""
    import os

    largest = largest_token_id(load_hf_tokenizer(tokenizer_path))
    if init.vocab_size <= largest:
        raise TrainSourceError(f"{init.path} has a vocabulary of {init.vocab_size}, but the tokenizer {tokenizer_path}"
                               f" has ids up to {largest}")
    if "://" not in output_path:
        output_path = os.path.abspath(output_path)  # as the runner places it
    method = RlTraining(output_path, tokenizer_path, chat_template, env, rl, model, optimizer, trainer,
                        init.vocab_size, init, tracking)
    return run_training(output_path, method, platform=platform, tracking=tracking, initialized_from=init.path,
                        layout=layout)


def trained_step(init_from: InitFrom) -> TrainStep | None:
    """The training step behind the starting weights: the source itself, or the one an export step exports."""
    source = init_from.source
    if isinstance(source, ExportStep):
        source = source.exports
    return source if isinstance(source, TrainStep) else None


def source_tokenizer_and_template(init_from: InitFrom, weights: InitWeights) -> tuple[str, str]:
    """The tokenizer the starting weights were trained with, and the chat template prompts are rendered with: the
    template of the chat caches the source trained on (an SFT model's), else the tokenizer's own (`chat_template_for`).
    A plain Hugging Face folder is its own tokenizer (an export writes one)."""
    from marin_assets.pipeline.tokens.chat import chat_template_for

    train = trained_step(init_from)
    tokenizer = load_result(train, TrainResult).model_and_tokenizer()[1] if train is not None else weights.path
    templates = [] if train is None else [t for t in (load_result(d, TokenizedCache).chat_template
                                                      for d in train.data) if t]
    return tokenizer, templates[0] if templates else chat_template_for(load_hf_tokenizer(tokenizer))


def pass_rate_measured(output_path: str, result: dict) -> CheckOutcome:
    """The held-out pass rate was measured before and after; says whether RL raised it."""
    rl = result.get("method_metrics") or result.get("rl") or {}  # "rl": before 0.2.0
    before, after = rl.get("initial_held_out_pass_rate"), rl.get("final_held_out_pass_rate")
    if before is None or after is None:
        return CheckOutcome(False, "the held-out pass rate was not measured before and after")
    verdict = "rose" if after > before else "did not rise"
    return CheckOutcome(True, f"held-out pass rate {before:.3f} → {after:.3f} ({verdict})",
                        {"initial_pass_rate": before, "final_pass_rate": after})


PASS_RATE_MEASURED = Check("held_out_pass_rate", pass_rate_measured,
                           "The held-out pass rate was measured before and after RL (the message says how it moved).")


def rl_step(name: str, init_from: InitFrom, env: Environment, rl: RlSpec = RlSpec(), model: ModelSpec | None = None,
            optimizer: OptimizerSpec = RL_OPTIMIZER, trainer: TrainerSpec = TrainerSpec(num_train_steps=50), *,
            cpu: float = 1, gpu: float = 0, gpu_type: str | None = None,
            tracking: Tracking | None = None, hosts: int = 1, layout: DeviceLayout | None = None) -> TrainStep:
    """RL from verifiable rewards on `env` (an `rl_envs` environment), starting from the weights `init_from` names
    (`from_hf(export step or folder)`, `from_checkpoint(train)`).

    `rl`: the sampling and update settings (its seed, with every other field, is identity); `trainer`: steps,
    checkpoints and the training seed (its `train_batch_size` becomes `rl.batch_size`). `model`: None takes the
    source's. Prompts are rendered with the chat template the source was fine-tuned with (the SFT caches'), else
    the tokenizer's. `tracking` (W&B, TensorBoard) is not identity. `hosts=N` updates on N hosts (Ray nodes, each
    with `cpu` and `gpu`) as one JAX program, every host writing the same rollouts on its first device; `layout`
    splits the devices (`DeviceLayout`).

    Identity: `env`, `rl`, `model`, `optimizer`, `trainer`, `init_from`; not `cpu`, `gpu`, `gpu_type`, `hosts`,
    `layout` nor `tracking`.
    """
    who = f"RL step {name!r}"
    if not isinstance(init_from, InitFrom):
        raise StepDefinitionError(f"{who}: init_from must say where the weights to train are:"
                                  " from_hf(export step or folder) or from_checkpoint(training step)")
    if not isinstance(rl, RlSpec):
        raise StepDefinitionError(f"{who}: rl must be an RlSpec, got {type(rl).__name__}")
    check_environment(who, env)
    model = model_of(who, model, init_from, check_config=True)
    trainer = replace(trainer, train_batch_size=rl.batch_size)
    resources = Resources(cpu=cpu, gpu=gpu, gpu_type=gpu_type, hosts=hosts)

    def run(out: str) -> TrainResult:
        weights = resolve_weights(who, init_from, model)
        tokenizer, template = source_tokenizer_and_template(init_from, weights)
        return rl_train(out, tokenizer, template, env, rl, model, optimizer, trainer, weights,
                        platform_for(resources), tracking=tracking, layout=layout)

    behind = trained_step(init_from)
    return TrainStep(
        name=name,
        fn=run,
        deps=[init_from.source] if init_from.source is not None else [],
        hash_attrs={"env": env.identity(), "rl": rl, "model": model, "optimizer": optimizer, "trainer": trainer,
                    "init_from": init_from.identity(), "method": "rl", "sampler": SAMPLER},
        resources=resources,
        kind="train",
        description=made_by(rl_train),
        kinds=["levanter", "jax", "rl"],
        checks=[PASS_RATE_MEASURED],
        # the updates' FLOPs (rollouts at the full context); sampling's recomputed forward passes come on top
        estimate=training_estimate(model, trainer, behind.data if behind is not None else (), init_from, group="rl"),
        model=model,
        data=behind.data if behind is not None else (),  # the tokenizer's caches: what reading checkpoints needs
        init_from=init_from,
    )


__all__ = ["PASS_RATE_MEASURED", "RL_OPTIMIZER", "RlSpec", "RlTraining", "rl_step", "rl_train"]
