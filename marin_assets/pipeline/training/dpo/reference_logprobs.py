"""The reference model's log-probs on preference data, as a step of its own keyed by (reference weights, preference
cache): every β and learning rate of a DPO sweep reads one computation, where Levanter caches them within one run
(and only for its validation sets).

For every pair of every split of a preference cache (`preference_tokenize_step`), the summed log-prob of the
assistant tokens of the chosen and of the rejected conversation under the reference weights — what DPO's loss
compares the policy's with (`levanter.dpo.logp_sum` of each side, the model in the run's compute precision). Each
split is written as Levanter's reference eval cache (`{output}/{split}`, rows `logp_ref_chosen` /
`logp_ref_rejected`, in the preference cache's order), which `dpo_step` hands to Levanter's `CachedReferenceDataset`
so the DPO run never loads the reference model. The record adds, per split, the reference's own preference
accuracy (how often it already finds the chosen answer likelier): the number a DPO run's policy improves on.

Identity: the reference weights (`InitFrom`), the model they are read as (its `seq_len` is the sequence the pairs are
scored in), the compute precision, and the preference cache (a dependency). Batch size and device are not identity.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marin_assets.core.hosts import writes_own_files
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizeStep
from marin_assets.pipeline.training.runner import platform_for
from marin_assets.pipeline.training.sources import (
    InitFrom,
    InitWeights,
    check_source_tokenizer,
    model_of,
    resolve_weights,
)
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec
from marin_assets.pipeline.training.train_data import TrainDataError

FORMAT = "levanter-dpo-reference-logprobs-v1"
"""Enters identity: the layout written (Levanter's reference eval cache, one per split) and how values are made."""
BATCH_SIZE = 16


@dataclass(frozen=True)
class SplitLogprobs:
    """The reference log-probs of one split: where, how many, and how the reference itself ranks the pairs."""

    pairs: int
    path: str
    """The split's cache (Levanter's reference eval cache layout)."""
    chosen_mean: float
    """Mean summed log-prob of the chosen answers' assistant tokens."""
    rejected_mean: float
    """Mean summed log-prob of the rejected answers' assistant tokens."""
    margin_mean: float
    """Mean of chosen − rejected: the reference's log-prob margin."""
    logprob_accuracy: float
    """Fraction of pairs whose chosen answer the reference finds likelier than the rejected one."""


@record_type("reference_logprobs",
             old_names=("marin_assets.pipeline.training.reference_logprobs:ReferenceLogprobs",))
@dataclass(frozen=True)
class ReferenceLogprobs:
    """Per-pair reference log-probs of a preference cache, one cache per split, and what they say."""

    path: str
    weights: str
    """The reference weights: a Hugging Face folder or a Levanter checkpoint."""
    preference_cache: str
    """The preference cache scored."""
    model: ModelSpec
    """The model the weights were read as; its `seq_len` is the sequence every side was scored in."""
    mixed_precision: str
    """The precision policy the log-probs were computed in (a DPO run's must be the same)."""
    splits: dict[str, SplitLogprobs] = field(default_factory=dict)
    seconds: float = 0.0


def cache_identity(weights: str, preference_cache: str, split: str, pairs: int, seq_len: int,
                   mixed_precision: str) -> dict[str, Any]:
    """What a split's reference cache's ledger says (besides Levanter's kind), and a DPO run checks it says."""
    return {"weights": weights, "preference_cache": preference_cache, "split": split, "pairs": pairs,
            "seq_len": seq_len, "mixed_precision": mixed_precision}


def identity_of(result: ReferenceLogprobs, split: str) -> dict[str, Any]:
    """`cache_identity` of one split of a finished reference step."""
    return cache_identity(result.weights, result.preference_cache, split, result.splits[split].pairs,
                          result.model.seq_len, result.mixed_precision)


def check_pairs_fit(what: str, cache: TokenizedCache, seq_len: int) -> None:
    """Every side of every pair fits in `seq_len` tokens (`TrainDataError` naming the split, its longest side and
    the cache otherwise): Levanter's preference format refuses to cut a side, deep in its data loader."""
    from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE
    from marin_assets.pipeline.tokens.encoders import hf_tokenizer
    from marin_assets.pipeline.tokens.preference_cache import longest_side, preference_exemplar

    for split, stats in cache.splits.items():
        longest = stats.max_tokens
        if longest is None:  # a record made before the longest side was recorded
            exemplar = preference_exemplar(hf_tokenizer(cache.tokenizer), cache.chat_template or DEFAULT_CHAT_TEMPLATE)
            longest = longest_side(join_path(cache.path, split), exemplar)
        if longest > seq_len:
            raise TrainDataError(f"{what}: the longest side of a pair in split {split!r} of {cache.path} has"
                                 f" {longest:,} tokens, more than the model's seq_len {seq_len:,}; give the model a"
                                 f" seq_len of at least {longest:,} (a Llama's positions are not weights), or drop the"
                                 " longer pairs from the preference data")


def check_preference_cache(what: str, cache: TokenizedCache) -> None:
    """The cache is a preference cache with a `train` split (`TrainDataError` naming it otherwise)."""
    from marin_assets.pipeline.tokens.chat import is_preference_cache

    if not (cache.preference or is_preference_cache(cache.path)):
        raise TrainDataError(f"{what}: {cache.path} is not a preference cache (chosen/rejected pairs made by"
                             " preference_tokenize_step), so it has no pairs to compare")


def reference_logprobs(output_path: str, weights: InitWeights, model: ModelSpec, cache: TokenizedCache,
                       splits: Sequence[str] | None = None, mixed_precision: str = "f32",
                       batch_size: int = BATCH_SIZE, platform: str | None = None) -> ReferenceLogprobs:
    """Score every pair of `splits` (None: all) of the preference cache `cache` with the reference `weights`, read as
    `model` in `mixed_precision`: per pair, the summed log-prob of each side's assistant tokens, written per split
    as Levanter's reference eval cache under `output_path`. `platform`: the JAX platform (`cuda`; None: JAX's)."""
    from marin_assets.pipeline.tokens.array_store import refuse_unsupported_array_store, s3_arrays
    from marin_assets.pipeline.training.levanter_trainer import join_hosts, use_platform

    refuse_unsupported_array_store(output_path, "reference_logprobs")
    place = join_hosts(f"reference log-probs at {output_path}")  # before JAX starts a backend
    use_platform(platform, f"reference log-probs at {output_path}")  # before Levanter starts JAX
    chosen_splits = list(splits) if splits is not None else list(cache.splits)
    unknown = sorted(set(chosen_splits) - set(cache.splits))
    if unknown:
        raise ValueError(f"the preference cache {cache.path} has no split(s) {unknown} (it has {sorted(cache.splits)})")
    started = time.monotonic()
    with s3_arrays([output_path, cache.path, weights.path]):
        scored = _score_splits(output_path, weights, model, cache, chosen_splits, mixed_precision, batch_size,
                               platform, write=writes_own_files(place))
    made: dict[str, SplitLogprobs] = {}
    for split, (chosen, rejected) in scored.items():
        path = join_path(output_path, split)
        made[split] = SplitLogprobs(
            pairs=len(chosen), path=path, chosen_mean=float(np.mean(chosen)), rejected_mean=float(np.mean(rejected)),
            margin_mean=float(np.mean(chosen.astype(np.float64) - rejected)),
            logprob_accuracy=float(np.mean(chosen > rejected)))
    return ReferenceLogprobs(output_path, weights.path, cache.path, model, mixed_precision, made,
                             round(time.monotonic() - started, 2))


def _score_splits(output_path: str, weights: InitWeights, model: ModelSpec, cache: TokenizedCache,
                  splits: Sequence[str], mixed_precision: str, batch_size: int,
                  platform: str | None, write: bool = True) -> dict[str, tuple[Any, Any]]:
    """Load the reference once and score each split, writing its reference cache (`{output_path}/{split}`, rewritten
    whole: a re-run after a crash scores again); split → (chosen, rejected). On several hosts every host scores its
    share of each batch and gathers every pair's values; only the one told to `write` writes."""
    import jax.random as jrandom
    import levanter
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning
    from levanter.main.model_init import load_model_from_source, prepare_model_init_context

    from marin_assets.pipeline.training.dpo.levanter_dpo import (
        eval_loader,
        pair_logprob_fn,
        pair_logprobs,
        preference_dataset,
        write_reference_cache,
    )
    from marin_assets.pipeline.training.levanter_data import preference_data_config
    from marin_assets.pipeline.training.levanter_model import model_config, write_reference_config
    from marin_assets.pipeline.training.levanter_trainer import JsonlMetrics, restored_root_logging, trainer_config

    scored: dict[str, tuple[Any, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="marin-reference-") as scratch, restored_root_logging(), \
            JsonlMetrics("marin.metrics.reference-logprobs", os.path.join(scratch, "metrics.jsonl")):
        spec = TrainerSpec(num_train_steps=1, train_batch_size=batch_size, mixed_precision=mixed_precision)
        trainer = trainer_config(spec, "reference-logprobs", scratch, "marin.metrics.reference-logprobs",
                                 require_accelerator=platform not in (None, "cpu"))
        data = preference_data_config(cache.tokenizer, cache.path, vocab_size=weights.vocab_size)
        lm = model_config(model, write_reference_config(model, weights.vocab_size, os.path.join(scratch, "ref")),
                          cache.tokenizer)
        is_hf = weights.model is None
        levanter.trainer.initialize(trainer)
        with trainer.use_device_mesh():
            context = prepare_model_init_context(lm, tokenizer=data.the_tokenizer,
                                                 initialize_from_hf=weights.path if is_hf else False,
                                                 use_hf_model_config=False)
            Vocab = round_axis_for_partitioning(Axis("vocab", weights.vocab_size), trainer.parameter_axis_mapping)
            source = {"hf_ref": weights.path} if is_hf else {"checkpoint_path": weights.path}
            reference = load_model_from_source(context=context, Vocab=Vocab, model_key=jrandom.PRNGKey(0),
                                               parameter_axis_mapping=trainer.parameter_axis_mapping,
                                               compute_dtype=trainer.mp.compute_dtype,
                                               cast_to_param=trainer.mp.cast_to_param, **source)
            logprobs = pair_logprob_fn(trainer.compute_axis_mapping, trainer.mp)
            for split in splits:
                pairs = preference_dataset(data, split, lm.max_Pos)
                count = cache.splits[split].documents
                chosen, rejected = pair_logprobs(logprobs, reference, eval_loader(pairs, batch_size, trainer), count)
                if write:
                    write_reference_cache(join_path(output_path, split), chosen, rejected,
                                          cache_identity(weights.path, cache.path, split, count, model.seq_len,
                                                         mixed_precision))
                scored[split] = (chosen, rejected)
    return scored


@dataclass(frozen=True, eq=False)
class ReferenceLogprobsStep(Step):
    """A reference log-prob step that says, at definition time, what it scored: DPO steps check they read the
    reference log-probs of their own preference cache, with the model and precision they train in."""

    prefs: Step = field(kw_only=True)
    """The preference cache scored."""
    reference: InitFrom = field(kw_only=True)
    """The reference weights."""
    model: ModelSpec = field(kw_only=True)
    """The model they are read as (its `seq_len`: the sequence each side is scored in)."""
    mixed_precision: str = field(default="f32", kw_only=True)
    """The precision policy of the computation."""


def default_name(reference: InitFrom, prefs: Step) -> str:
    """`reference-logprobs/{weights}--{preference cache}`: one name per (reference, data), whoever defines the step,
    so DPO steps that define it alike share it."""
    if reference.source is not None:
        weights = reference.source.name + (f"-step-{reference.checkpoint_step}"
                                           if reference.checkpoint_step is not None else "")
    else:
        weights = f"hf-{reference.fingerprint}"
    return f"reference-logprobs/{weights.replace('/', '-')}--{prefs.name.replace('/', '-')}"


def reference_logprobs_step(name: str | None, reference: InitFrom, prefs: Step, model: ModelSpec | None = None,
                            mixed_precision: str = "f32", *, batch_size: int = BATCH_SIZE, cpu: float = 1,
                            gpu: float = 0, gpu_type: str | None = None, hosts: int = 1) -> ReferenceLogprobsStep:
    """The per-pair log-probs of every split of the preference cache `prefs` (a `preference_tokenize_step`) under
    the `reference` weights (`from_hf(export step or folder)`, `from_checkpoint(training step)`), read as `model`
    (None: the source's, as `sft_step` takes it) in `mixed_precision` (a DPO run's `TrainerSpec.mixed_precision`).
    `name`: None names it by what it scores (`default_name`). `dpo_step` defines one itself unless given one.
    `hosts=N` scores on N hosts (Ray nodes, each with `cpu` and `gpu`) as one JAX program, `batch_size` split among
    them (a multiple of the devices of every host).

    Identity: `reference`, `model`, `mixed_precision` (and `prefs`); not `batch_size`, `cpu`, `gpu`, `gpu_type` nor
    `hosts`.
    """
    if not isinstance(reference, InitFrom):
        raise StepDefinitionError(f"reference log-prob step {name or ''!r}: reference must say where the weights"
                                  " are: from_hf(export step or folder) or from_checkpoint(training step)")
    name = name or default_name(reference, prefs)
    if isinstance(prefs, TokenizeStep) and prefs.preference is False:
        raise StepDefinitionError(f"reference log-prob step {name!r}: {prefs.name} is not a preference cache"
                                  " (preference_tokenize_step)")
    model = model_of(f"reference log-prob step {name!r}", model, reference, check_config=True)
    resources = Resources(cpu=cpu, gpu=gpu, gpu_type=gpu_type, hosts=hosts)
    what = f"step {name!r}"

    def run(out: str) -> ReferenceLogprobs:
        cache = load_result(prefs, TokenizedCache)
        check_preference_cache(what, cache)
        check_pairs_fit(what, cache, model.seq_len)
        check_source_tokenizer(what, reference, cache)
        weights = resolve_weights(what, reference, model)
        return reference_logprobs(out, weights, model, cache, None, mixed_precision, batch_size,
                                  platform_for(resources))

    return ReferenceLogprobsStep(
        name=name,
        fn=run,
        deps=[prefs, *([reference.source] if reference.source is not None else [])],
        hash_attrs={"reference": reference.identity(), "model": model, "mixed_precision": mixed_precision,
                    "format": FORMAT},
        resources=resources,
        kind="reference",
        description=made_by(reference_logprobs),
        kinds=["levanter", "jax"],
        prefs=prefs,
        reference=reference,
        model=model,
        mixed_precision=mixed_precision,
    )


__all__ = ["FORMAT", "ReferenceLogprobs", "ReferenceLogprobsStep", "SplitLogprobs", "cache_identity",
           "check_pairs_fit", "check_preference_cache", "default_name", "identity_of", "reference_logprobs",
           "reference_logprobs_step"]
