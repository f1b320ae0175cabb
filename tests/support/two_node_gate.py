"""A gate for the two-node test, installed in every Ray worker of the driver's job (Ray's
`worker_process_setup_hook`) when `TWO_NODE_GATE` names a folder.

The step's own process (on the head) begins its first file only once a fan-out task on the worker node
has begun one. Without it, whether any file reaches the worker node depends on how fast Ray starts
workers there: on a loaded CI machine the head's process tokenized all 8 files in 16 s before any task
had started, and "the files spread over both nodes" was not tested. With it the spread is a condition
the test waits for, not a race. Nothing else changes: the same fan-out, claims and takeovers.
"""

import functools
import os
import time

GATE_ENV = "TWO_NODE_GATE"
MARKER = "a-worker-node-task-began"
WAIT_S = 180.0
"""The head gives up waiting after this long and goes on (the test then fails, saying no task did a file)."""


def install() -> None:
    folder = os.environ.get(GATE_ENV)
    if not folder:
        return
    from marin_assets.pipeline.tokens import cache_writer

    original = cache_writer._tokenize_part
    if hasattr(original, "__wrapped__"):
        return
    marker = os.path.join(folder, MARKER)

    @functools.wraps(original)
    def gated(options, file_and_part):
        if on_worker_node():
            os.makedirs(folder, exist_ok=True)
            open(marker, "a").close()
        else:
            deadline = time.monotonic() + WAIT_S
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.1)
        return original(options, file_and_part)

    cache_writer._tokenize_part = gated  # the fan-out pickles it by name: every worker resolves its own gated copy


@functools.cache
def on_worker_node() -> bool:
    """Whether this Ray worker runs on the test cluster's worker node (the one offering `worker-node`)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    return any(node["NodeID"] == here and "worker-node" in node["Resources"] for node in ray.nodes())
