"""Materialize one step of tests/automation_pipeline.py in this process. argv: step name."""

import sys

from marin_assets import materialize_step
from tests.support.automation_pipeline import pipeline

[step] = [s for s in pipeline.values() if s.name == sys.argv[1]]
materialize_step(step)
