"""Train: Levanter `train_lm` on a weighted mixture of tokenized caches, resumable.

Checkpoints live under the output path with a run id taken from it, so materializing again
after a crash or an interruption resumes from the last checkpoint. The last step is always
checkpointed. The record holds the steps, final losses, tokens/s, the checkpoint steps and
the loss curve, read from Levanter's JSON metrics.

A run starts from random weights, from a Hugging Face model folder, or from a checkpoint of
another training step (`from_hf`, `from_checkpoint`); its mixture weights may change in
stages; a `TokenBudget` stops it after N tokens or limits it to the first N tokens of a
component. Before any compute, a step checks that every component it trains on can fill a
batch and that all were tokenized alike. `Resources(gpu=N)` trains on CUDA."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from marin_assets.core.identity import canonical
from marin_assets.core.record import load_result
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizeStep, tokenizer_fingerprint
from marin_assets.pipeline.training.estimates import training_estimate
from marin_assets.pipeline.training.hf_folder import read_hf_config
from marin_assets.pipeline.training.runner import RunPlaces, platform_for, run_training
from marin_assets.pipeline.training.sources import (
    InitFrom,
    InitWeights,
    TrainSourceError,
    source_mismatches,
)
from marin_assets.pipeline.training.specs import (
    DeviceLayout,
    ModelSpec,
    OptimizerSpec,
    SpecError,
    TokenBudget,
    TrainerSpec,
    as_stages,
    check_stages,
    mixture_block_size,
)
from marin_assets.pipeline.training.tracking import Tracking
from marin_assets.pipeline.training.train_data import (
    Weights,
    check_data_fills_batches,
    check_tokenizers,
    refuse_preference_caches,
)
from marin_assets.pipeline.training.training_run import LOSS_FELL, TrainResult, TrainStep


def training_data_config(tokenizer_path: str, caches: dict[str, str], weights: Weights, model: ModelSpec,
                         trainer: TrainerSpec, budget: TokenBudget | None = None, vocab_size: int | None = None):
    """The Levanter data config `train_lm` trains on: the mixture (constant or staged `train_weights`, mixed in
    blocks every stage start falls on), the component token budgets (`max_train_batches`), and a tokenizer
    that Levanter sees with the model's `vocab_size`. `trainer.num_train_steps` is the run's own."""
    from marin_assets.pipeline.training.levanter_data import data_config

    stages = as_stages(weights)
    budget = budget or TokenBudget()
    check_stages(stages, list(caches), trainer.num_train_steps)
    unknown = sorted(set(budget.component_tokens) - set(caches))
    if unknown:
        raise SpecError(f"token budgets name unknown components {unknown} (known: {sorted(caches)})")
    return data_config(tokenizer_path, caches, stages, vocab_size=vocab_size,
                       max_train_batches=budget.max_train_batches(trainer, model) or None,
                       block_size=mixture_block_size(stages, trainer.train_batch_size))


@dataclass(frozen=True)
class LmTraining:
    """Pretraining as a method on the runner: Levanter's `train_lm` on a mixture of caches (text, or chat
    caches whose loss weights are the assistant masks: SFT), from random weights or other weights."""

    tokenizer_path: str
    caches: dict[str, str]
    """Component → cache folder."""
    weights: Weights
    model: ModelSpec
    optimizer: OptimizerSpec
    trainer: TrainerSpec
    """With `num_train_steps` resolved from the budget."""
    vocab_size: int
    budget: TokenBudget = TokenBudget()
    init: InitWeights | None = None
    tracking: Tracking | None = None
    name: str = "train_lm"

    def entry_point(self) -> Callable[[Any], Any]:
        from levanter.main import train_lm as levanter_train

        return levanter_train.main

    def config(self, places: RunPlaces) -> Any:
        from levanter.main import train_lm as levanter_train

        from marin_assets.pipeline.training.levanter_model import model_config, optimizer_config
        from marin_assets.pipeline.training.levanter_trainer import trainer_config

        # Other weights: a Hugging Face folder, or only the model of a Levanter checkpoint (a fresh optimizer at
        # step 0). A resumed run continues from its own checkpoint instead.
        start = self.init if self.init is not None and not places.resuming else None
        return levanter_train.TrainLmConfig(
            data=training_data_config(self.tokenizer_path, self.caches, self.weights, self.model, self.trainer,
                                      self.budget, self.vocab_size),
            model=model_config(self.model, places.reference, self.tokenizer_path),
            trainer=trainer_config(self.trainer, places.run_id, places.local_dir, places.metrics_logger,
                                   places.checkpoints, require_accelerator=places.platform not in (None, "cpu"),
                                   tracking=self.tracking, layout=places.layout),
            optimizer=optimizer_config(self.optimizer),
            initialize_from_hf=start.path if start is not None and start.model is None else False,
            initialize_model_from_checkpoint_path=None if start is None or start.model is None else start.path,
            hf_save_path=places.hf_save_path,
            hf_save_steps=10**9,  # only the forced export at the end
        )

    def finish(self, result: TrainResult, metrics: dict[int, dict[str, Any]]) -> TrainResult:
        return result  # the runner's record is the whole of it


def train_lm(output_path: str, tokenizer_path: str, caches: dict[str, str], weights: Weights,
             model: ModelSpec, optimizer: OptimizerSpec, trainer: TrainerSpec, budget: TokenBudget | None = None,
             init: InitWeights | None = None, platform: str | None = None, *,
             tracking: Tracking | None = None, method_type: type[LmTraining] | None = None,
             layout: DeviceLayout | None = None) -> TrainResult:
    """Train a language model with Levanter on a mixture of Levanter caches (resumes if interrupted).

    `weights`: constant or staged; `budget`: stop after N tokens and/or read only the first N tokens of
    a component; `init`: the weights to start from (random when None); `platform`: the JAX platform to
    train on (`cuda`, `tpu`; None: whatever JAX picks under `JAX_PLATFORMS`); `tracking`: W&B and/or
    TensorBoard beside the JSON metrics (files under the output's `wandb/` and `tensorboard/`); `method_type`:
    the method on the runner (default `LmTraining`; SFT passes `sft.SftTraining`); `layout`: how the devices are
    split (None: Levanter's default).
    """
    from marin_assets.pipeline.tokens.tokenizer import largest_token_id, load_hf_tokenizer

    budget = budget or TokenBudget()
    trainer = replace(trainer, num_train_steps=budget.num_train_steps(trainer, model))
    largest = largest_token_id(load_hf_tokenizer(tokenizer_path))
    vocab = init.vocab_size if init is not None else -(-(largest + 1) // model.vocab_multiple) * model.vocab_multiple
    if vocab <= largest:
        raise TrainSourceError(f"{init.path if init else 'the model'} has a vocabulary of {vocab}, but the"
                               f" tokenizer {tokenizer_path} has ids up to {largest}")
    method = (method_type or LmTraining)(tokenizer_path, caches, weights, model, optimizer, trainer, vocab, budget,
                                         init, tracking)
    return run_training(output_path, method, platform=platform, tracking=tracking,
                        initialized_from=init.path if init is not None else None, layout=layout)


def train_step(name: str, train: dict[str, Step], model: ModelSpec = ModelSpec(),
               optimizer: OptimizerSpec = OptimizerSpec(), trainer: TrainerSpec = TrainerSpec(),
               weights: Weights | None = None, validation: dict[str, Step] | None = None,
               cpu: float = 1, tpu_type: str | None = None, *, init_from: InitFrom | None = None,
               budget: TokenBudget | None = None, gpu: float = 0, gpu_type: str | None = None,
               tracking: Tracking | None = None, method_type: type[LmTraining] | None = None,
               hosts: int = 1, layout: DeviceLayout | None = None) -> TrainStep:
    """A training step on a mixture: `train` components (default weight 1), `validation` ones weight 0.

    `weights` are constant or staged — (start step, weights) pairs, the first at step 0; a component a
    stage leaves out has weight 0 then. `init_from` (`from_hf`, `from_checkpoint`) starts from other
    weights; `budget` limits tokens; `gpu=N` trains on N CUDA GPUs; `hosts=N` on N hosts (Ray nodes), each
    with `cpu` and `gpu`, as one JAX program (a TPU slice's hosts come from `tpu_type`); `layout` splits the
    devices (`DeviceLayout`; None: Levanter's default, FSDP over every device). Mixing caches of
    different tokenizers is an error here when the caches are `TokenizeStep`s (which know their tokenizer
    step), and when the run starts otherwise (their fingerprints), as is data that cannot fill one batch.
    `tracking` (W&B, TensorBoard) is how the run is watched, not part of its identity; `method_type` is the
    method on the runner (`sft_step` passes its own), not part of identity either: it configures the same
    computation.

    Identity: `train` and `validation` with their `weights`, `model`, `optimizer`, `trainer`, `budget` (when given),
    `init_from` (and the caches); not `cpu`, `tpu_type`, `gpu`, `gpu_type`, `hosts`, `layout`, `tracking` nor
    `method_type`.
    """
    components = {**train, **(validation or {})}
    stages = as_stages(weights if weights is not None else {k: 1.0 for k in train})
    for _, stage in stages:
        for k in validation or {}:
            stage.setdefault(k, 0.0)
    budget = budget or TokenBudget()
    try:
        trainer = replace(trainer, num_train_steps=budget.num_train_steps(trainer, model))
        check_stages(stages, list(components), trainer.num_train_steps)
        mixture_block_size(stages, trainer.train_batch_size)
        unknown = sorted(set(budget.component_tokens) - set(components))
        if unknown:
            raise SpecError(f"token budgets name unknown components {unknown} (known: {sorted(components)})")
        untrained = sorted(k for k in budget.component_tokens if not any(w.get(k, 0) > 0 for _, w in stages))
        if untrained:
            raise SpecError(f"token budgets name components {untrained} that no stage trains on")
        budget.max_train_batches(trainer, model)
        if init_from is not None:
            folder_config = read_hf_config(init_from.folder) if init_from.folder is not None else None
            mismatch = source_mismatches(model, init_from, folder_config)
            if mismatch:
                raise SpecError(mismatch)
    except (SpecError, TrainSourceError) as e:
        raise StepDefinitionError(f"step {name!r}: {e}") from None
    refuse_preference_caches(f"step {name!r}", components, StepDefinitionError)
    tokenizers = {k: s.tokenizer.name_with_hash for k, s in components.items() if isinstance(s, TokenizeStep)}
    if len(set(tokenizers.values())) > 1:
        described = dict(sorted(tokenizers.items()))
        raise StepDefinitionError(f"step {name!r}: the mixture mixes tokenizers: {described}")
    names = sorted(components)
    platform = platform_for(Resources(cpu=cpu, gpu=gpu, gpu_type=gpu_type, tpu_type=tpu_type))

    def run(out: str) -> TrainResult:
        results = {k: load_result(components[k], TokenizedCache) for k in names}
        refuse_preference_caches(f"step {name!r}", results)
        check_tokenizers(name, results)
        check_data_fills_batches(name, results, stages, trainer, model, budget)
        first = results[names[0]]
        init = None
        if init_from is not None:
            init = init_from.resolve()
            mismatch = source_mismatches(model, init_from, read_hf_config(init.path) if init.model is None else None)
            if mismatch:
                raise TrainSourceError(f"step {name!r}: {mismatch}")
            if isinstance(init_from.source, TrainStep):
                source = load_result(init_from.source, TrainResult)
                theirs = tokenizer_fingerprint(source.model_and_tokenizer()[1])
                if theirs != first.tokenizer_fingerprint:
                    raise TrainSourceError(
                        f"step {name!r}: {init_from.describe()} was trained on tokenizer {source.tokenizer}"
                        f" (fingerprint {theirs}), but this run's data was tokenized with {first.tokenizer}"
                        f" (fingerprint {first.tokenizer_fingerprint})")
        return train_lm(out, first.tokenizer, {k: r.path for k, r in results.items()}, stages, model, optimizer,
                        trainer, budget, init, platform, tracking=tracking, method_type=method_type, layout=layout)

    hash_attrs: dict[str, Any] = {
        "weights": canonical(stages[0][1]) if len(stages) == 1 else [[s, canonical(w)] for s, w in stages],
        "model": model, "optimizer": optimizer, "trainer": trainer}
    if budget != TokenBudget():
        hash_attrs["budget"] = budget
    if init_from is not None:
        hash_attrs["init_from"] = init_from.identity()
    return TrainStep(
        name=name,
        fn=run,
        deps=[components[k] for k in names] + ([init_from.source] if init_from and init_from.source else []),
        hash_attrs=hash_attrs,
        resources=Resources(cpu=cpu, gpu=gpu, gpu_type=gpu_type, tpu_type=tpu_type, hosts=hosts),
        kind="train",
        description=made_by(train_lm),
        kinds=["levanter", "jax"],
        checks=[LOSS_FELL],
        estimate=training_estimate(model, trainer, [components[k] for k in names], init_from),
        model=model,
        data=tuple(components[k] for k in names),
        init_from=init_from,
    )
