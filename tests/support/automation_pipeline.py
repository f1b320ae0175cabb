"""A tiny training pipeline with per-checkpoint evaluation, for the automation tests and for the
Dagster daemon they start (`defs`, loaded through a workspace file). Storage: MARIN_PREFIX."""

import dagster as dg

from marin_assets import build_definitions
from marin_assets.dagster import checkpoint_evals_asset, checkpoint_sensor
from marin_assets.experiments import tiny_stories
from marin_assets.pipeline.evals.loss import loss_checkpoint_evals
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
SHORT = TrainerSpec(num_train_steps=12, train_batch_size=4, checkpoint_every=5, steps_per_eval=6, max_eval_batches=2)
CHECKPOINTS = [5, 10, 11]
"""What SHORT saves: every 5 steps, and always the last."""

pipeline = tiny_stories.build(prefix="auto", train_documents=800, validation_documents=60, vocab_size=400,
                              model=TINY, trainer=SHORT, optimizer=OptimizerSpec(learning_rate=1e-2))
train = pipeline["train"]
evals = loss_checkpoint_evals("evals/auto-llama-checkpoints", train, {"stories": pipeline["tokenized"]},
                              max_eval_batches=2)
sensor = checkpoint_sensor([evals], minimum_interval_seconds=1, default_status=dg.DefaultSensorStatus.RUNNING)
defs = build_definitions([train], extra_assets=[checkpoint_evals_asset(evals)], sensors=[sensor])
