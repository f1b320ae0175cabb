"""A training run that a test preempts: `python -c "from tests.support.preempt_worker import main; main()" PREFIX`
materializes `pipeline(PREFIX)["train"]` in this process (its main thread, as Dagster's step processes run it) and
exits 0 on SUCCESS, 1 with the error's last line on stderr."""

from __future__ import annotations

import sys

from marin_assets.core.lease import LeaseSettings
from marin_assets.experiments import tiny_stories
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec

SETTINGS = LeaseSettings(heartbeat_interval=0.2, stale_timeout=2.0, poll_interval=0.05)
STEPS = 300


def pipeline():
    return tiny_stories.build(prefix="preempt", train_documents=2000, validation_documents=40, vocab_size=400,
                              model=ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2,
                                              num_kv_heads=2, seq_len=64),
                              trainer=TrainerSpec(num_train_steps=STEPS, train_batch_size=4, checkpoint_every=100,
                                                  steps_per_eval=1000, max_eval_batches=1))


def main() -> None:
    from marin_assets import materialize_step

    try:
        materialize_step(pipeline()["train"], prefix=sys.argv[1], settings=SETTINGS)
    except Exception as e:  # noqa: BLE001 - the test reads the reason
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
