"""Materialize one step of tests/crash_trials.py in this process, to be killed.

argv: root source_url kind prefix marker"""

import sys
from pathlib import Path

from marin_assets import materialize_step
from tests.crash_trials import SETTINGS, steps, with_marker

root, url, kind, prefix, marker = sys.argv[1:6]
materialize_step(with_marker(steps(Path(root), url)[kind], marker), prefix=prefix, settings=SETTINGS)
