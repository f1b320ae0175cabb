"""Train in its own process, so a test can kill it or watch it fail. argv: output tokenizer cache [platform]

`platform` (optional): the JAX platform to train on (`cuda`), as a `Resources(gpu=N)` step asks."""

import sys

from marin_assets.pipeline.training.pretrain.step import train_lm
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec

out, tokenizer, cache = sys.argv[1:4]
platform = sys.argv[4] if len(sys.argv) > 4 else None
train_lm(out, tokenizer, {"stories": cache}, {"stories": 1.0},
         ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64),
         OptimizerSpec(learning_rate=1e-2),
         TrainerSpec(num_train_steps=12, train_batch_size=4, checkpoint_every=5, steps_per_eval=6, max_eval_batches=2),
         platform=platform)
