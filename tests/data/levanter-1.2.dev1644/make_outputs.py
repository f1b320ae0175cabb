"""How the outputs beside this file were made: run with marin-assets 0.1's own environment (levanter 1.2.dev1644,
JAX 0.7.2, Python 3.11), from a checkout of that release: `.venv/bin/python make_outputs.py`, JAX_PLATFORMS=cpu.
They were then copied here without the run's log folder and the ledgers' `.bak` copies; tests/test_old_outputs.py
replaces the prefix they name (/tmp/oldstack) with wherever it copies them."""
import sys

sys.path.insert(0, ".")
from marin_assets import materialize_step
from marin_assets.core.step import walk
from marin_assets.experiments import tiny_stories
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from tests.support.helpers import FAST
TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
SHORT = TrainerSpec(num_train_steps=6, train_batch_size=4, checkpoint_every=5, steps_per_eval=6, max_eval_batches=2)
p = tiny_stories.build(prefix="old", train_documents=300, validation_documents=40, vocab_size=400, model=TINY, trainer=SHORT, optimizer=OptimizerSpec(learning_rate=1e-2))
for s in walk([p["train"]]):
    o = materialize_step(s, prefix="/tmp/oldstack", settings=FAST)
    print(s.name, o.output_path)
