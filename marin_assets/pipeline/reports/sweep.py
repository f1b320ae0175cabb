"""Moved to `pipeline.sweeps` (0.2.0): a sweep builder makes training runs, not a report; it lives beside the other
tools experiments are built with, outside the wings (it reads training and evaluation)."""

from marin_assets.core.renames import moved_module

moved_module(__name__, "marin_assets.pipeline.sweeps")
