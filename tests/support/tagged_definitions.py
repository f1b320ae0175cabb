"""The hello-world pair and one more step, with light functions (they run in the Dagster process: no Ray to
start), for the test that gives a run tags from Dagster's own command line (`tests/test_run_tags_cli.py`).
Storage: MARIN_PREFIX."""

import dataclasses

from marin_assets import build_definitions
from marin_assets.core.light import light
from marin_assets.pipeline.hello import numbers_step, stats_step
from resources import StorageResource

_numbers = numbers_step("tagged/numbers", n=10, seed=7)
numbers = dataclasses.replace(_numbers, fn=light(_numbers.fn))
_stats = stats_step("tagged/stats", numbers)
stats = dataclasses.replace(_stats, fn=light(_stats.fn))
_other = numbers_step("tagged/other", n=20, seed=7)
other = dataclasses.replace(_other, fn=light(_other.fn))

defs = build_definitions([stats, other], resources={"storage": StorageResource()})  # $MARIN_PREFIX
