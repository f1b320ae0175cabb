"""A pause for the multi-host tests, installed in every Ray worker of the driver's job (Ray's
`worker_process_setup_hook`) when `MULTIHOST_PAUSE` is `step:folder`.

The host on the worker node (whichever host id its placement gave it) stops after the checkpoint of `step` is
written (and waits there), having written its host id to `folder/paused`; the other goes on to the next step
and waits for it in its collective. The test then kills the worker node at a known point, whatever the
machine's speed: a condition, not a race.
"""

import os
import threading

from marin_assets.core.hosts import PROCESS_ID_ENV
from tests.support.two_node_gate import on_worker_node

PAUSE_ENV = "MULTIHOST_PAUSE"
MARKER = "paused"
WAIT_S = 600.0
"""The paused host waits at most this long (its node is killed long before: the test's bound is shorter)."""


def install() -> None:
    if not os.environ.get(PAUSE_ENV):
        return
    from levanter.checkpoint import Checkpointer

    original = Checkpointer.on_step
    if hasattr(original, "__wrapped__"):
        return

    def on_step(self, *, tree, step, force=False):
        original(self, tree=tree, step=step, force=force)
        at, folder = os.environ[PAUSE_ENV].split(":", 1)
        if int(step) >= int(at) and on_worker_node():
            self.wait_until_finished()
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, MARKER + ".tmp"), "w") as f:
                f.write(os.environ[PROCESS_ID_ENV])
            os.replace(os.path.join(folder, MARKER + ".tmp"), os.path.join(folder, MARKER))
            threading.Event().wait(WAIT_S)  # nothing sets it: the host waits here until its node is killed

    on_step.__wrapped__ = original  # type: ignore[attr-defined]
    Checkpointer.on_step = on_step

