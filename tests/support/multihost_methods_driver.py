"""Materialize the other training methods and an evaluation for the multi-host tests — a tiny DPO (its reference
log-probs, the run), a loss evaluation of its checkpoint, and a short RL run, each on `hosts` hosts — as the
Dagster asset body does: `materialize_step` with `ray_runner` on a Ray cluster by address (`address` = `here`:
everything in this process, one host).

The data and the starting weights come first, in this process: the SFT tests' standard-library docstrings, their
BPE, a tiny Llama pretrained on them and exported, preference pairs asking what a function does (`support/dpo`).

argv: address prefix hosts. Prints one JSON line: what the tests compare (the reference log-probs per pair, the
DPO record's curves and held-out metrics, the evaluation's loss, the RL record's curves and every sample it
wrote), or the error.
"""

import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

from marin_assets import Step, load_result, materialize_step
from marin_assets.core.step import walk
from marin_assets.execution.ray_runner import ray_runner
from marin_assets.pipeline.data.preference import preference_data_step
from marin_assets.pipeline.evals.loss import EvalResult, loss_eval_step
from marin_assets.pipeline.tokens.preference_cache import preference_tokenize_step
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.dpo.levanter_dpo import read_reference_cache
from marin_assets.pipeline.training.dpo.reference_logprobs import ReferenceLogprobs, identity_of
from marin_assets.pipeline.training.dpo.step import dpo_step
from marin_assets.pipeline.training.export import export_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.rl.envs import SequentialDigits
from marin_assets.pipeline.training.rl.levanter_rl import read_samples
from marin_assets.pipeline.training.rl.step import RlSpec, rl_step
from marin_assets.pipeline.training.sources import from_checkpoint, from_hf
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from resources import RayResource
from tests.support.chat import write_docs_dataset
from tests.support.dpo import DPO_OPTIMIZER, write_preference_dataset
from tests.support.driver_outcome import reported

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=128)
PAIRS = {"train": 32, "validation": 8}
TRAINER = TrainerSpec(num_train_steps=6, train_batch_size=8, checkpoint_every=50, steps_per_eval=3,
                      max_eval_batches=None)

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
address, prefix, hosts = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = Step(name="raw/docs", fn=lambda out: write_docs_dataset(Path(out)), hash_attrs={"v": 1})
bpe = bpe_tokenizer_step("tokenizers/docs-bpe", docs, vocab_size=512)
tokenized = tokenize_step("tokenized/docs", docs, bpe)
base = train_step("checkpoints/base", {"docs": tokenized}, TINY, OptimizerSpec(learning_rate=1e-2),
                  TrainerSpec(num_train_steps=8, train_batch_size=8, checkpoint_every=50, steps_per_eval=50,
                              max_eval_batches=1))
base_export = export_step("exports/base", base)
raw_pairs = Step(name="raw/prefs", fn=lambda out: write_preference_dataset(Path(out), PAIRS["train"],
                                                                           PAIRS["validation"]),
                 hash_attrs=PAIRS)
cache = preference_tokenize_step("tokenized/prefs", preference_data_step("prefs/docs", raw_pairs), bpe)
dpo = dpo_step("checkpoints/dpo", cache, from_hf(base_export), model=replace(TINY, seq_len=256),
               optimizer=DPO_OPTIMIZER, trainer=TRAINER, hosts=hosts)
(reference,) = [d for d in dpo.deps if d.kind == "reference"]
evaluation = loss_eval_step("evals/dpo", dpo, {"docs": tokenized}, hosts=hosts)
rl = rl_step("checkpoints/rl", from_checkpoint(base), SequentialDigits(length=1, min_prompt=1, max_prompt=8),
             RlSpec(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=4, updates_per_rollout=2,
                    held_out_problems=8, eval_every=2, samples_logged=8),
             optimizer=OptimizerSpec(learning_rate=2e-3, weight_decay=0.0, warmup=0.0, lr_schedule="constant"),
             trainer=TrainerSpec(num_train_steps=4, checkpoint_every=1000), hosts=hosts)
ray = RayResource(address=address) if address != "here" else None
with reported(ray) as started:
    run_fn = {"run_fn": ray_runner(ray, logging.getLogger("driver"))} if ray else {}
    spanning = {reference.name, dpo.name, evaluation.name, rl.name}  # the steps on the hosts; the rest here, first
    for step in walk([evaluation, rl]):
        materialize_step(step, prefix=prefix, **(run_fn if step.name in spanning else {}))
    scored = load_result(reference.output_path_under(prefix), ReferenceLogprobs)
    logprobs = {split: [arr.tolist() for arr in read_reference_cache(s.path, identity_of(scored, split))]
                for split, s in scored.splits.items()}
    run = load_result(dpo.output_path_under(prefix), TrainResult)
    evaluated = load_result(evaluation.output_path_under(prefix), EvalResult)
    metrics = run.method_metrics
    rl_run = load_result(rl.output_path_under(prefix), TrainResult)
    print(json.dumps({
        "ok": True, "seconds": time.monotonic() - started, "hashes": [s.hash for s in (reference, dpo, evaluation)],
        "reference": logprobs, "loss_curve": run.loss_curve, "eval_curve": run.eval_curve, "hosts": run.hosts,
        "devices": run.cost.device_count if run.cost else None,
        "validation_accuracy": metrics.final_validation_accuracy if metrics else None,
        "eval_loss": evaluated.loss, "eval_checkpoint": evaluated.checkpoint, "rl_hash": rl.hash,
        "rl_hosts": rl_run.hosts, "rl_loss_curve": rl_run.loss_curve, "rl_checkpoints": rl_run.checkpoint_steps,
        "rl_held_out_pass_rate": rl_run.method_metrics.held_out_pass_rate_curve if rl_run.method_metrics else None,
        "rl_samples": read_samples(rl.output_path_under(prefix))}), flush=True)
