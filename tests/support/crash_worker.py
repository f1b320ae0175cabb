"""Materialize one step of tests/crash_trials.py in this process, to be killed.

argv: root source_url kind prefix marker local|ray"""

import sys
from pathlib import Path

from marin_assets import materialize_step
from tests.support.crash_trials import SETTINGS, steps, with_marker

root, url, kind, prefix, marker, where = sys.argv[1:7]
kwargs = {}
if where == "ray":
    import logging

    from marin_assets.execution.ray_runner import ray_runner
    from resources import RayResource

    kwargs["run_fn"] = ray_runner(RayResource(), logging.getLogger("crash_worker"))
materialize_step(with_marker(steps(Path(root), url)[kind], marker), prefix=prefix, settings=SETTINGS, **kwargs)
