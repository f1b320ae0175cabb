"""The demo's definitions at test size, for `bench/run.py --quick`: the shape of `definitions.py` (hello world,
the LLM pipeline with its loss evaluation, the lm-evaluation-harness evaluation, both per checkpoint with the
checkpoint sensor) on a tiny generated corpus and model, so the demo measure runs in about a minute.

`SELECTION` is what `make demo` selects, for these names.
"""

from marin_assets.dagster import experiment_definitions
from marin_assets.experiments import downstream_eval, hello_world, tiny_stories
from marin_assets.pipeline.experiment import Experiment
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from resources import RayResource, StorageResource

PREFIX = "bench-quick"
MODEL = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=128)
TRAINER = TrainerSpec(num_train_steps=8, train_batch_size=4, checkpoint_every=4, steps_per_eval=4, max_eval_batches=2)

pipeline = tiny_stories.build(prefix=PREFIX, train_documents=800, validation_documents=60, vocab_size=400,
                              model=MODEL, trainer=TRAINER, optimizer=OptimizerSpec(learning_rate=1e-2))
harness, harness_checkpoints = downstream_eval.build(pipeline, PREFIX, limit=8)
EXPERIMENTS = [
    hello_world.experiment,
    Experiment(PREFIX, [pipeline["export"], pipeline["evaluate"]], [tiny_stories.checkpoint_evals(pipeline, PREFIX)]),
    Experiment(f"{PREFIX}-harness", [harness], [harness_checkpoints]),
]
SELECTION = f"*hello/report,*exports/{PREFIX}-llama,*evals/{PREFIX}-llama,*evals/{PREFIX}-llama-harness"

defs = experiment_definitions(EXPERIMENTS, resources={"storage": StorageResource(), "ray": RayResource()},
                              describe_drift=True)
