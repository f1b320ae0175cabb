"""Moved to `training_run` (0.2.0): `run.py` beside `runner.py` read as the runner's twin."""

from marin_assets.core.renames import moved_module

moved_module(__name__, "marin_assets.pipeline.training.training_run")
