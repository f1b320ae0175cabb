"""DPO: preference tuning of a model on chosen/rejected pairs, on the training-method seam.

As Marin's DPO (Levanter's `train_dpo`): the policy starts from existing weights (`from_hf(export or folder)`,
`from_checkpoint(training step)`) and learns, on a preference cache (`preference_tokenize_step`), to raise the
log-prob margin of each chosen answer over its rejected one beyond the reference model's, with the loss
−log σ(β × (policy margin − reference margin)). The reference's log-probs are a step of their own
(`reference_logprobs_step`, keyed by reference weights and data only), which `dpo_step` defines unless given one:
every β and learning rate of a sweep shares one computation, and the run never loads the reference model
(`levanter_dpo.dpo_main` trains the policy alone). The reference is the starting weights unless told otherwise.

The result is a training step as any other — the record a `TrainResult` whose `dpo` field holds the preference
accuracy, rewards and margins of the training batches and of every held-out pair (the cache's `validation` split)
as curves, and the checkpoints plain language-model checkpoints — so export, loss evaluation and per-checkpoint
evaluations work on it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.record import load_result
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizeStep
from marin_assets.pipeline.tokens.tokenizer import largest_token_id, load_hf_tokenizer
from marin_assets.pipeline.training.dpo.metrics import DpoMetrics, dpo_metrics
from marin_assets.pipeline.training.dpo.reference_logprobs import (
    ReferenceLogprobs,
    ReferenceLogprobsStep,
    check_pairs_fit,
    check_preference_cache,
    identity_of,
    reference_logprobs_step,
)
from marin_assets.pipeline.training.estimates import training_estimate
from marin_assets.pipeline.training.runner import RunPlaces, platform_for, run_training
from marin_assets.pipeline.training.sources import (
    InitFrom,
    InitWeights,
    TrainSourceError,
    check_source_tokenizer,
    model_of,
    resolve_weights,
    source_model,
)
from marin_assets.pipeline.training.specs import DeviceLayout, ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.tracking import Tracking
from marin_assets.pipeline.training.train_data import TrainDataError
from marin_assets.pipeline.training.training_run import LOSS_FELL, TrainResult, TrainStep

DEFAULT_BETA = 0.1
"""DPO's usual β (Levanter's and Marin's default)."""
DPO_OPTIMIZER = OptimizerSpec(learning_rate=5e-4, weight_decay=0.0, warmup=0.1, lr_schedule="linear",
                              min_lr_ratio=0.0)
"""Preference tuning's AdamW: no weight decay, a warmup, linear decay to zero; the rate suits this project's small
models (Marin tunes 8B models at 5e-7)."""
SPLITS = ("train", "validation")
"""The preference cache's splits a DPO run reads: it trains on `train` and holds out `validation` (when present)."""


@dataclass(frozen=True)
class DpoTraining:
    """DPO as a method on the runner (`levanter_dpo.dpo_main`): the policy, from pretrained weights, on a preference
    cache with the reference's log-probs read from their step's caches."""

    tokenizer_path: str
    preference_cache: str
    """The preference cache (`{cache}/train`, and `{cache}/validation` held out)."""
    reference: ReferenceLogprobs
    """The reference log-prob step's record: a cache per split."""
    model: ModelSpec
    optimizer: OptimizerSpec
    trainer: TrainerSpec
    vocab_size: int
    beta: float
    init: InitWeights | None
    """The starting weights (a resumed run continues from its own checkpoint instead)."""
    tracking: Tracking | None = None
    name: str = "dpo"

    @property
    def splits(self) -> list[str]:
        """The splits the run reads: `train`, and `validation` when the cache has one."""
        return [s for s in SPLITS if s in self.reference.splits]

    @property
    def caches(self) -> dict[str, str]:
        return {"prefs": self.preference_cache, **{f"reference-{s}": r.path for s, r in self.reference.splits.items()}}

    def entry_point(self) -> Callable[[Any], Any]:
        from marin_assets.pipeline.training.dpo.levanter_dpo import dpo_main

        return dpo_main

    def config(self, places: RunPlaces) -> Any:
        from marin_assets.pipeline.training.dpo.levanter_dpo import DpoRunConfig
        from marin_assets.pipeline.training.levanter_data import preference_data_config
        from marin_assets.pipeline.training.levanter_model import model_config, optimizer_config
        from marin_assets.pipeline.training.levanter_trainer import trainer_config

        if self.init is None and not places.resuming:
            raise TrainSourceError(f"DPO at {places.output_path} has no weights to start from")
        start = self.init if not places.resuming else None
        return DpoRunConfig(
            data=preference_data_config(self.tokenizer_path, self.preference_cache, self.vocab_size),
            trainer=trainer_config(self.trainer, places.run_id, places.local_dir, places.metrics_logger,
                                   places.checkpoints, require_accelerator=places.platform not in (None, "cpu"),
                                   tracking=self.tracking, layout=places.layout),
            model=model_config(self.model, places.reference, self.tokenizer_path),
            optimizer=optimizer_config(self.optimizer),
            beta=self.beta,
            reference_logprobs={s: self.reference.splits[s].path for s in self.splits},
            reference_metadata={s: identity_of(self.reference, s) for s in self.splits},
            initialize_from_hf=start.path if start is not None and start.model is None else False,
            initialize_from_checkpoint_path=None if start is None or start.model is None else start.path,
            hf_save_path=places.hf_save_path,
        )

    def finish(self, result: TrainResult, metrics: dict[int, dict[str, Any]]) -> TrainResult:
        held = self.reference.splits.get("validation")
        return replace(result, method_metrics=dpo_metrics(
            metrics, self.beta, {s: r.logprob_accuracy for s, r in self.reference.splits.items()},
            validation_pairs=held.pairs if held is not None else 0))


def dpo_train(output_path: str, tokenizer_path: str, preference_cache: str, reference: ReferenceLogprobs,
              model: ModelSpec, optimizer: OptimizerSpec, trainer: TrainerSpec, beta: float, init: InitWeights,
              platform: str | None = None, *, tracking: Tracking | None = None,
              layout: DeviceLayout | None = None) -> TrainResult:
    """Tune the weights `init` with DPO on a preference cache, with the reference log-probs of `reference` (its
    record), β `beta` (resumes if interrupted). `platform`: the JAX platform (`cuda`; None: JAX's choice); `layout`:
    how the devices are split (None: Levanter's default)."""
    largest = largest_token_id(load_hf_tokenizer(tokenizer_path))
    if init.vocab_size <= largest:
        raise TrainSourceError(f"{init.path} has a vocabulary of {init.vocab_size}, but the tokenizer {tokenizer_path}"
                               f" has ids up to {largest}")
    if reference.mixed_precision != trainer.mixed_precision:
        raise TrainDataError(f"the reference log-probs at {reference.path} were computed in"
                             f" {reference.mixed_precision!r} precision, but the run trains in"
                             f" {trainer.mixed_precision!r}")
    method = DpoTraining(tokenizer_path, preference_cache, reference, model, optimizer, trainer, init.vocab_size, beta,
                         init, tracking)
    return run_training(output_path, method, platform=platform, tracking=tracking, initialized_from=init.path,
                        layout=layout)


def preference_learned(output_path: str, result: dict) -> CheckOutcome:
    """On the held-out pairs, the implicit reward prefers the chosen answer more often than not at the end."""
    dpo = result.get("method_metrics") or result.get("dpo") or {}  # "dpo": before 0.2.0
    accuracy = dpo.get("final_validation_accuracy")
    if accuracy is None:
        return CheckOutcome(False, "no held-out pairs were scored (the preference cache has no validation split)")
    before = (dpo.get("reference_logprob_accuracy") or {}).get("validation")
    after = dpo.get("final_validation_logprob_accuracy")
    said = f"held-out preference accuracy {accuracy:.3f}" + (
        f"; log-prob accuracy {before:.3f} (reference) → {after:.3f}" if before is not None and after is not None
        else "")
    return CheckOutcome(accuracy > 0.5, said, {"validation_accuracy": accuracy})


PREFERENCE_LEARNED = Check("held_out_preference_learned", preference_learned,
                           "On the held-out pairs, the implicit reward prefers the chosen answer more often than not.")


def dpo_step(name: str, prefs: Step, init_from: InitFrom, beta: float = DEFAULT_BETA,
             reference: InitFrom | ReferenceLogprobsStep | None = None, model: ModelSpec | None = None,
             optimizer: OptimizerSpec = DPO_OPTIMIZER, trainer: TrainerSpec = TrainerSpec(), *, cpu: float = 1,
             gpu: float = 0, gpu_type: str | None = None, tracking: Tracking | None = None, hosts: int = 1,
             layout: DeviceLayout | None = None) -> TrainStep:
    """A training step that tunes the weights `init_from` names (`from_hf(export step or folder)`,
    `from_checkpoint(train)`) with DPO on the preference cache `prefs` (a `preference_tokenize_step`: trains on
    `train`, holds out `validation`).

    `reference`: None — the starting weights; an `InitFrom` — other weights; a `reference_logprobs_step` — its
    log-probs, as computed (of `prefs`, in the run's model and precision). Given weights, the reference step is
    defined here, named by what it scores, so DPO steps that differ only in β, optimizer or steps share it. `model`:
    None takes the source's (a training step's, or the one an export step exports); every side of every pair must
    fit its `seq_len`. `tracking` (W&B, TensorBoard) is not identity. `hosts=N` trains on N hosts (Ray nodes, each
    with `cpu` and `gpu`) as one JAX program, and scores the reference defined here on them too; `layout` splits the
    devices (`DeviceLayout`).

    Identity: `beta`, `model`, `optimizer`, `trainer`, `init_from` (and `prefs` and the `reference` step, its
    dependencies); not `cpu`, `gpu`, `gpu_type`, `hosts`, `layout` nor `tracking`.
    """
    if not isinstance(init_from, InitFrom):
        raise StepDefinitionError(f"DPO step {name!r}: init_from must say where the weights to tune are:"
                                  " from_hf(export step or folder) or from_checkpoint(training step)")
    if isinstance(prefs, TokenizeStep) and prefs.preference is False:
        raise StepDefinitionError(f"DPO step {name!r}: {prefs.name} is not a preference cache (chosen/rejected pairs"
                                  " made by preference_tokenize_step); DPO compares the two answers of each pair")
    if not beta > 0:
        raise StepDefinitionError(f"DPO step {name!r}: beta must be positive, got {beta}")
    model = model_of(f"DPO step {name!r}", model, init_from, check_config=True)
    resources = Resources(cpu=cpu, gpu=gpu, gpu_type=gpu_type, hosts=hosts)
    if isinstance(reference, ReferenceLogprobsStep):
        ref_step = reference
        differs = [f"{what}: the reference step's {theirs!r}, this run's {mine!r}" for what, theirs, mine in (
            ("preference cache", ref_step.prefs.name_with_hash, prefs.name_with_hash),
            ("mixed precision", ref_step.mixed_precision, trainer.mixed_precision),
            ("sequence length", ref_step.model.seq_len, model.seq_len)) if theirs != mine]
        if differs:
            raise StepDefinitionError(f"DPO step {name!r}: the reference log-probs {ref_step.name} were not computed"
                                      f" for this run — {'; '.join(differs)}")
    else:
        source = reference if reference is not None else init_from
        if not isinstance(source, InitFrom):
            raise StepDefinitionError(f"DPO step {name!r}: reference must be None (the starting weights), weights"
                                      " (from_hf, from_checkpoint) or a reference_logprobs_step")
        ref_model = model if source is init_from else (source_model(source) or model)
        ref_step = reference_logprobs_step(None, source, prefs, ref_model, trainer.mixed_precision,
                                           batch_size=trainer.train_batch_size, cpu=cpu, gpu=gpu, gpu_type=gpu_type,
                                           hosts=hosts)
    what = f"step {name!r}"

    def run(out: str) -> TrainResult:
        cache = load_result(prefs, TokenizedCache)
        check_preference_cache(what, cache)
        if "train" not in cache.splits:
            raise TrainDataError(f"{what}: the preference cache {cache.path} has no train split (its splits:"
                                 f" {sorted(cache.splits)})")
        if cache.splits["train"].documents < trainer.train_batch_size:
            raise TrainDataError(f"{what}: the preference cache {cache.path} has {cache.splits['train'].documents}"
                                 f" train pairs, fewer than one batch ({trainer.train_batch_size}); give it more"
                                 " pairs, or lower train_batch_size")
        check_pairs_fit(what, cache, model.seq_len)
        check_source_tokenizer(what, init_from, cache)
        init = resolve_weights(what, init_from, model)
        scored = load_result(ref_step, ReferenceLogprobs)
        missing = sorted(s for s in SPLITS if s in cache.splits and s not in scored.splits)
        if missing:
            raise TrainDataError(f"{what}: the reference log-probs {ref_step.name} have no split(s) {missing}")
        return dpo_train(out, cache.tokenizer, cache.path, scored, model, optimizer, trainer, beta, init,
                         platform_for(resources), tracking=tracking, layout=layout)

    return TrainStep(
        name=name,
        fn=run,
        deps=[prefs, ref_step, *([init_from.source] if init_from.source is not None else [])],
        hash_attrs={"beta": beta, "model": model, "optimizer": optimizer, "trainer": trainer,
                    "init_from": init_from.identity(), "method": "dpo"},
        resources=resources,
        kind="train",
        description=made_by(dpo_train),
        kinds=["levanter", "jax", "dpo"],
        checks=[LOSS_FELL, PREFERENCE_LEARNED],
        estimate=training_estimate(model, trainer, (prefs,), init_from, group="dpo", sequences_per_example=2),
        model=model,
        data=(prefs,),
        init_from=init_from,
    )


__all__ = ["DEFAULT_BETA", "DPO_OPTIMIZER", "DpoMetrics", "DpoTraining", "PREFERENCE_LEARNED", "dpo_step",
           "dpo_train"]
