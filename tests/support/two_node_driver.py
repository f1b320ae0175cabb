"""Materialize a tokenize step on a Ray cluster by address, as the Dagster asset body does (the
`materialize_step` protocol with `ray_runner`), so a test can kill a node under it.

argv: address prefix raw tokenizer workers cpu [heartbeat,stale] (the step lease's seconds; default
LeaseSettings()). Prints one JSON line: the outcome or the error. With `TWO_NODE_GATE` set (a folder), every
Ray worker of the job installs `two_node_gate` (the head's process waits for a worker-node task to begin a file).
"""

import json
import logging
import os
import sys
import time

from marin_assets import Step, materialize_step
from marin_assets.core.lease import LeaseSettings
from marin_assets.execution.ray_runner import ray_runner
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from resources import RayResource
from tests.support.two_node_gate import GATE_ENV

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
address, prefix, raw, tok, workers, cpu = sys.argv[1:7]
settings = LeaseSettings()
if len(sys.argv) > 7:
    heartbeat, stale = (float(x) for x in sys.argv[7].split(","))
    settings = LeaseSettings(heartbeat_interval=heartbeat, stale_timeout=stale, poll_interval=0.5)
dataset = Step(name="raw/two-node", fn=lambda out: None, override_output_path=raw)
tokenizer = Step(name="tokenizers/two-node", fn=lambda out: None, override_output_path=tok)
step = tokenize_step("tokenized/two-node", dataset, tokenizer, workers=int(workers), cpu=float(cpu))
gate = os.environ.get(GATE_ENV)
ray = RayResource(address=address, env_vars={GATE_ENV: gate} if gate else {},
                  runtime_env={"worker_process_setup_hook": "tests.support.two_node_gate.install"} if gate else {})
started = time.monotonic()
try:
    for dep in (dataset, tokenizer):
        materialize_step(dep, prefix=prefix)
    outcome = materialize_step(step, prefix=prefix, settings=settings,
                               run_fn=ray_runner(ray, logging.getLogger("driver")))
    result = outcome.record.result if outcome.record else None
    print(json.dumps({"ok": True, "seconds": time.monotonic() - started, "result": result}), flush=True)
except BaseException as e:  # reported to the test, which asserts on it
    print(json.dumps({"ok": False, "seconds": time.monotonic() - started, "error": f"{type(e).__name__}: {e}"}),
          flush=True)
    sys.exit(1)
finally:
    ray.shutdown()
