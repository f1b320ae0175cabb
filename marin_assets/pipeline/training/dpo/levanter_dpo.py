"""DPO through Levanter's public pieces, with the reference model's log-probs read from a cache — never the model.

Levanter's `train_dpo.main` keeps the reference model in the trainer state (a `DpoModel` of policy and reference,
checkpointed together) and scores every training batch with it; only its validation sets can take cached
reference log-probs (`reference_eval_cache`). Ours is computed once, by a step of its own, for every split
(`reference_logprobs.py`), so `dpo_main` is `train_dpo`'s loop on the same public parts — `PreferenceLmDataConfig`,
`dataset_for_preference_format`, `CachedReferenceDataset` (`CachedDpoExample`s), `dpo_loss`, `Trainer`,
`load_model_from_source` — whose state is the policy alone: half the memory, no reference forward pass, and
checkpoints that are plain language-model checkpoints (export, evaluation and `from_checkpoint` read them as any).

The reference log-probs are stored in the layout of Levanter's reference eval cache (a `TreeCache` of
`logp_ref_chosen` / `logp_ref_rejected` scalars with `REFERENCE_LOGPROBS_CACHE_KIND` in its ledger), written with
`SerialCacheWriter` and read with `levanter.dpo.load_reference_eval_cache`. Per-pair log-probs are
`levanter.dpo.logp_sum` of each side — the sum of the log-probs of its assistant tokens, as `dpo_loss` computes
them. Held-out pairs are scored whole (no padded pair enters a mean: Levanter's eval loop would count the padding
of a last partial batch), and logged under Levanter's metric names (`eval/dpo_accuracy`, …).

Imported only inside step functions (on the Ray workers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marin_assets.pipeline.training.levanter_data import PREFERENCE_COMPONENT

logger = logging.getLogger(__name__)

REFERENCE_FIELDS = ("logp_ref_chosen", "logp_ref_rejected")
"""The fields of a reference log-prob cache's rows (Levanter's reference eval cache)."""


def reference_cache_metadata(metadata: Mapping[str, Any]):
    """The ledger metadata of a reference log-prob cache: Levanter's kind, then what identifies the values."""
    from levanter.dpo import REFERENCE_LOGPROBS_CACHE_KIND
    from levanter.store.cache import CacheMetadata

    return CacheMetadata(preprocessor_metadata={"kind": REFERENCE_LOGPROBS_CACHE_KIND, **metadata})


def write_reference_cache(cache_dir: str, chosen: np.ndarray, rejected: np.ndarray,
                          metadata: Mapping[str, Any]) -> None:
    """Per-pair reference log-probs as a Levanter reference eval cache at `cache_dir` (rewritten whole)."""
    from levanter.store.cache import SerialCacheWriter

    exemplar = {name: np.zeros((), dtype=np.float32) for name in REFERENCE_FIELDS}
    with SerialCacheWriter(cache_dir, exemplar, metadata=reference_cache_metadata(metadata)) as writer:
        writer.write_batch({"logp_ref_chosen": np.asarray(chosen, dtype=np.float32),
                            "logp_ref_rejected": np.asarray(rejected, dtype=np.float32)})


def read_reference_cache(cache_dir: str, metadata: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected) per-pair reference log-probs of a finished reference cache whose ledger says `metadata`
    (Levanter's `load_reference_eval_cache`; a `FileNotFoundError` if it is unfinished or says otherwise)."""
    from levanter.dpo import load_reference_eval_cache

    return load_reference_eval_cache(cache_dir, metadata=reference_cache_metadata(metadata))


def preference_dataset(data: Any, split: str, Pos: Any) -> Any:
    """The pairs of one split of a DPO data config's preference cache, as `train_dpo` builds them (`DpoExample`s:
    each side's ids with loss weights on its assistant tokens), in the cache's order; None if it has no such split."""
    from levanter.data.text.preference import dataset_for_preference_format

    cache = data.build_caches(split).get(PREFERENCE_COMPONENT)
    if cache is None:
        return None
    return dataset_for_preference_format(data.components[PREFERENCE_COMPONENT].format, Pos, cache)


def pair_logprob_fn(compute_axis_mapping: Any, mp: Any) -> Callable[[Any, Any], tuple[Any, Any]]:
    """A compiled (model, batch of `DpoExample`s) → (chosen, rejected) summed log-probs of the assistant tokens of
    each pair's sides: `levanter.dpo.logp_sum`, the model cast to the compute dtype and in inference mode."""
    import jax
    from haliax.partitioning import named_jit
    from levanter.dpo import logp_sum
    from levanter.utils.tree_utils import inference_mode

    @named_jit(axis_resources=compute_axis_mapping)
    def logprobs(model: Any, batch: Any) -> tuple[Any, Any]:
        model = inference_mode(mp.cast_to_compute(model), True)
        return (jax.lax.stop_gradient(logp_sum(model, batch.chosen, key=None)),
                jax.lax.stop_gradient(logp_sum(model, batch.rejected, key=None)))

    return logprobs


def pair_logprobs(logprobs: Callable[[Any, Any], tuple[Any, Any]], model: Any, loader: Any,
                  pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected) per-pair log-probs of `model` over every batch of `loader` (a data loader over `pairs`
    pairs; the padding of its last batch is dropped)."""
    from jax.experimental import multihost_utils

    chosen: list[np.ndarray] = []
    rejected: list[np.ndarray] = []
    for batch in loader:
        c, r = logprobs(model, batch)
        chosen.append(np.asarray(multihost_utils.process_allgather(c.array, tiled=True), dtype=np.float32).ravel())
        rejected.append(np.asarray(multihost_utils.process_allgather(r.array, tiled=True), dtype=np.float32).ravel())
    got_chosen = np.concatenate(chosen)[:pairs] if chosen else np.zeros(0, np.float32)
    got_rejected = np.concatenate(rejected)[:pairs] if rejected else np.zeros(0, np.float32)
    if len(got_chosen) != pairs:
        raise RuntimeError(f"scored {len(got_chosen)} pairs of {pairs}")
    return got_chosen, got_rejected


def eval_loader(dataset: Any, batch_size: int, trainer_config: Any) -> Any:
    """Levanter's data loader over a finite dataset in batches of `batch_size` (the last padded), on the trainer
    config's device mesh."""
    from levanter.data.loader import DataLoader

    return DataLoader(dataset, batch_size=batch_size, mesh=trainer_config.device_mesh,
                      axis_resources=trainer_config.compute_axis_mapping,
                      batch_axis_name=trainer_config.batch_axis_name, max_buffered_batches=0)


def held_out_metrics(policy_chosen: np.ndarray, policy_rejected: np.ndarray, ref_chosen: np.ndarray,
                     ref_rejected: np.ndarray, beta: float) -> dict[str, float]:
    """DPO's metrics over every held-out pair, under the names `dpo_loss` gives its own (plus the policy's
    log-prob preference accuracy): the loss, the implicit reward's accuracy, the mean rewards and margins."""
    delta_pi = policy_chosen.astype(np.float64) - policy_rejected
    delta_ref = ref_chosen.astype(np.float64) - ref_rejected
    logits = beta * (delta_pi - delta_ref)
    return {"dpo_loss": float(np.mean(np.logaddexp(0.0, -logits))),  # softplus(-logits), stable
            "dpo_accuracy": float(np.mean(logits > 0)),
            "dpo_margin_policy": float(np.mean(delta_pi)), "dpo_margin_ref": float(np.mean(delta_ref)),
            "dpo_chosen_reward": float(np.mean(beta * (policy_chosen.astype(np.float64) - ref_chosen))),
            "dpo_rejected_reward": float(np.mean(beta * (policy_rejected.astype(np.float64) - ref_rejected))),
            "dpo_logprob_accuracy": float(np.mean(delta_pi > 0))}


@dataclass
class DpoRunConfig:
    """One DPO run, as `dpo_main` takes it: Levanter's configs, β, and the reference log-prob caches."""

    data: Any
    """Levanter's `PreferenceLmDataConfig` over one preference cache (`levanter_data.preference_data_config`)."""
    trainer: Any
    """Levanter's `TrainerConfig` (`levanter_trainer.trainer_config`)."""
    model: Any
    """Levanter's model config (`levanter_model.model_config`): its `max_seq_len` is the pairs' sequence."""
    optimizer: Any
    """Levanter's optimizer config."""
    beta: float
    reference_logprobs: dict[str, str] = field(default_factory=dict)
    """Split → its reference log-prob cache (`train` required; `validation`, when the data has one)."""
    reference_metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Split → what its reference cache's ledger must say (`reference_logprobs.cache_identity`)."""
    initialize_from_hf: str | bool = False
    """A Hugging Face folder to start the policy from (False: none)."""
    initialize_from_checkpoint_path: str | None = None
    """A Levanter checkpoint to start the policy from (its model only)."""
    hf_save_path: str | None = None
    hf_save_steps: int = 10**9
    """Only the forced Hugging Face export at the end, by default."""


def dpo_main(config: DpoRunConfig) -> None:
    """Train the policy with DPO on the preference data, the reference's log-probs read from their caches; hold out
    the `validation` split's pairs, scored whole every `steps_per_eval` steps and at the end."""
    import jax.random as jrandom
    import levanter
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning
    from levanter import callbacks
    from levanter.adaptor import AdaptorExportConfig, NoAdaptorConfig
    from levanter.compat.hf_checkpoints import build_generation_config
    from levanter.data.mixture import MixtureDataset, StopStrategy
    from levanter.dpo import CachedReferenceDataset, dpo_loss
    from levanter.main.model_init import load_model_from_source, prepare_model_init_context
    from levanter.trainer import Trainer
    from levanter.utils.jax_utils import parameter_count

    if config.initialize_from_hf and config.initialize_from_checkpoint_path is not None:
        raise ValueError("start the policy from a Hugging Face folder or a checkpoint, not both")
    tokenizer = config.data.the_tokenizer
    context = prepare_model_init_context(config.model, tokenizer=tokenizer,
                                         initialize_from_hf=config.initialize_from_hf, use_hf_model_config=False)
    levanter.trainer.initialize(config)
    optimizer = config.optimizer.build(config.trainer.num_train_steps)

    def loss_function(model: Any, example: Any, *, key: Any = None) -> Any:
        keys = jrandom.split(key) if key is not None else (None, None)
        return dpo_loss(model, None, example, beta=config.beta, key_chosen=keys[0], key_rejected=keys[1])

    with Trainer(config.trainer, optimizer, loss_function) as trainer:
        data_key, mix_key, model_key, training_key = jrandom.split(jrandom.PRNGKey(config.trainer.seed), 4)
        Pos = config.model.max_Pos
        Vocab = round_axis_for_partitioning(Axis("vocab", len(tokenizer)), trainer.parameter_axis_mapping)

        def with_reference(split: str) -> tuple[Any, np.ndarray, np.ndarray]:
            """A split's pairs (`DpoExample`s) and their reference log-probs (chosen, rejected)."""
            chosen, rejected = read_reference_cache(config.reference_logprobs[split], config.reference_metadata[split])
            return preference_dataset(config.data, split, Pos), chosen, rejected

        train = CachedReferenceDataset(*with_reference("train"))  # `CachedDpoExample`s: the values attached by index
        shuffled = train.shuffle(data_key, perm_type="feistel")
        train_data = MixtureDataset({PREFERENCE_COMPONENT: shuffled}, {PREFERENCE_COMPONENT: 1.0},
                                    block_size=config.data.mixture_block_size, key=mix_key,
                                    stop_strategy=StopStrategy.RESTART_STRATEGY)  # epochs, as train_dpo

        _, resuming = trainer.checkpoint_load_plan()
        source = {"hf_ref": config.initialize_from_hf} if config.initialize_from_hf else (
            {"checkpoint_path": config.initialize_from_checkpoint_path}
            if config.initialize_from_checkpoint_path is not None else None)
        if source is not None and not resuming:
            policy = load_model_from_source(context=context, Vocab=Vocab, model_key=model_key,
                                            parameter_axis_mapping=trainer.parameter_axis_mapping,
                                            compute_dtype=trainer.mp.compute_dtype,
                                            cast_to_param=trainer.mp.cast_to_param, **source)
            state = trainer.initial_state(training_key, model=policy)
        else:  # a resumed run: its own checkpoint (the policy alone, as every checkpoint here)
            state = trainer.initial_state(training_key, model_init=lambda: config.model.build(Vocab, key=model_key))
        levanter.tracker.log_summary({"parameter_count": parameter_count(state.model)})

        flops_per_token = config.model.flops_per_token(len(tokenizer), Pos.size)
        flops_per_example = 3 * flops_per_token * Pos.size if flops_per_token is not None else None
        # As train_dpo logs it: a pair counts as one sequence of Pos tokens.
        trainer.add_hook(callbacks.log_performance_stats(Pos.size, trainer.config.batch_schedule, flops_per_example),
                         every=1)

        if "validation" in config.reference_logprobs:
            _add_held_out_hook(trainer, *with_reference("validation"), beta=config.beta)

        NoAdaptorConfig().install_export_hooks(
            trainer=trainer, converter=context.converter, tokenizer=tokenizer,
            export=AdaptorExportConfig(hf_save_path=config.hf_save_path, hf_save_steps=config.hf_save_steps,
                                       generation_config=build_generation_config(tokenizer, None)))

        trainer.train(state, trainer.data_loader(train_data).iter_from_step(int(state.step)))

    trainer.tracker.finish()


def _add_held_out_hook(trainer: Any, pairs: Any, ref_chosen: np.ndarray, ref_rejected: np.ndarray, *,
                       beta: float) -> None:
    """Score every held-out pair every `steps_per_eval` steps and at the end (once per step), logging DPO's metrics
    under `eval/` (`eval/loss` is the DPO loss: what the runner's record reads as the eval loss)."""
    import levanter

    logprobs = pair_logprob_fn(trainer.compute_axis_mapping, trainer.mp)
    evaluated: list[int] = []

    def evaluate(info: Any, force: bool = False) -> None:
        del force
        if evaluated and evaluated[-1] == info.step:  # the forced hooks at the end, after a scheduled one
            return
        loader = eval_loader(pairs, trainer.config.eval_batch_size, trainer.config)
        chosen, rejected = pair_logprobs(logprobs, info.eval_model, loader, len(ref_chosen))
        metrics = held_out_metrics(chosen, rejected, ref_chosen, ref_rejected, beta)
        levanter.tracker.log({"eval/loss": metrics["dpo_loss"], **{f"eval/{k}": v for k, v in metrics.items()}},
                             step=info.step)
        logger.info("held-out DPO loss %.4f, accuracy %.3f (%d pairs)", metrics["dpo_loss"], metrics["dpo_accuracy"],
                    len(ref_chosen))
        evaluated.append(info.step)

    trainer.add_hook(evaluate, every=trainer.config.steps_per_eval)


__all__ = ["DpoRunConfig", "REFERENCE_FIELDS", "dpo_main", "eval_loader", "held_out_metrics", "pair_logprob_fn",
           "pair_logprobs", "preference_dataset", "read_reference_cache", "reference_cache_metadata",
           "write_reference_cache"]
