"""The restart soak's definitions (tests/test_restart_soak.py): one tiny training per trial, each with its
per-checkpoint evaluations, over the automation pipeline's data, and one checkpoint sensor over them all.

Trials train with different seeds, so each has its own identity and its own checkpoints while sharing the
corpus, tokenizer and cache. Leases beat every second and go stale after 8 s, so that a run retried after its
worker was killed takes the dead holder's lease over in seconds, not the default minute and a half.
`python -m tests.support.soak_pipeline TRIAL` trains trial TRIAL in this process."""

import dataclasses
import sys

import dagster as dg

from marin_assets import build_definitions, materialize_step
from marin_assets.dagster import checkpoint_evals_asset, checkpoint_sensor
from marin_assets.pipeline.evals.loss import loss_checkpoint_evals
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import OptimizerSpec
from resources import StorageResource
from tests.support import automation_pipeline as auto

TRIALS = 3
CHECKPOINTS = auto.CHECKPOINTS
SENSOR = "marin_soak_checkpoints"

tokenized = auto.pipeline["tokenized"]
trains = [train_step(f"checkpoints/soak-{trial}", {"stories": tokenized}, auto.TINY,
                     OptimizerSpec(learning_rate=1e-2), dataclasses.replace(auto.SHORT, seed=trial + 1))
          for trial in range(TRIALS)]
evals = [loss_checkpoint_evals(f"evals/soak-{trial}-checkpoints", train, {"stories": tokenized}, max_eval_batches=2)
         for trial, train in enumerate(trains)]
sensor = checkpoint_sensor(evals, name=SENSOR, minimum_interval_seconds=1,
                           default_status=dg.DefaultSensorStatus.RUNNING)
defs = build_definitions(trains, {"storage": StorageResource(heartbeat_interval=1.0, stale_timeout=8.0,
                                                             poll_interval=0.5)},
                         extra_assets=[checkpoint_evals_asset(e, freshness=None) for e in evals], sensors=[sensor])

if __name__ == "__main__":
    materialize_step(trains[int(sys.argv[1])])
