"""Materialize a tiny training (and, asked, a one-process evaluation of its checkpoint) for the multi-host tests,
as the Dagster asset body does: `materialize_step` with `ray_runner` on a Ray cluster by address, or in this
process (`address` = `here`).

argv: address prefix raw tokenizer hosts [eval] [layout=REPLICA,MODEL] (a `DeviceLayout`). With
`MULTIHOST_PAUSE` set (`step:folder`), every Ray worker of the job installs `multihost_pause` (the host on the
worker node stops after saving the checkpoint of that step, for the test to kill its node). Prints one JSON
line: the outcome (the training record's fields the tests read) or the error.
"""

import json
import logging
import os
import sys
import time

from marin_assets import Step, load_result, materialize_step
from marin_assets.execution.ray_runner import ray_runner
from marin_assets.pipeline.evals.loss import loss_eval_step
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import DeviceLayout, ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from resources import RayResource
from tests.support.driver_outcome import reported
from tests.support.multihost_pause import PAUSE_ENV

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
TRAINER = TrainerSpec(num_train_steps=12, train_batch_size=4, checkpoint_every=4, steps_per_eval=6,
                      max_eval_batches=1)

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
address, prefix, raw, tok, hosts = sys.argv[1:6]
evaluate = "eval" in sys.argv[6:]
layouts = [a.removeprefix("layout=") for a in sys.argv[6:] if a.startswith("layout=")]
layout = DeviceLayout(*(int(x) for x in layouts[0].split(","))) if layouts else None
dataset = Step(name="raw/multihost", fn=lambda out: None, override_output_path=raw)
tokenizer = Step(name="tokenizers/multihost", fn=lambda out: None, override_output_path=tok)
tokenized = tokenize_step("tokenized/multihost", dataset, tokenizer)
train = train_step("checkpoints/multihost", {"data": tokenized}, TINY, OptimizerSpec(learning_rate=1e-2), TRAINER,
                   hosts=int(hosts), layout=layout)
pause = os.environ.get(PAUSE_ENV)
ray = None
if address != "here":
    ray = RayResource(address=address, env_vars={PAUSE_ENV: pause} if pause else {},
                      runtime_env={"worker_process_setup_hook": "tests.support.multihost_pause.install"}
                      if pause else {})
with reported(ray) as started:
    for dep in (dataset, tokenizer, tokenized):
        materialize_step(dep, prefix=prefix)
    materialize_step(train, prefix=prefix, **({"run_fn": ray_runner(ray, logging.getLogger("driver"))} if ray else {}))
    record = load_result(train.output_path_under(prefix), TrainResult)
    out = {"ok": True, "seconds": time.monotonic() - started, "loss_curve": record.loss_curve,
           "devices": record.cost.device_count if record.cost else None, "hosts": record.hosts,
           "device_mesh": record.device_mesh, "hash": train.hash,
           "checkpoint_steps": record.checkpoint_steps, "checkpoint_dir": record.checkpoint_dir}
    if evaluate:
        check = loss_eval_step("evals/multihost", train, {"data": tokenized})
        materialize_step(check, prefix=prefix)  # in this one process: the checkpoint the hosts wrote together
        out["eval"] = json.loads(open(os.path.join(check.output_path_under(prefix), ".artifact.json")).read())
    print(json.dumps(out), flush=True)
