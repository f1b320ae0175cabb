"""Moved to `tokens.token_estimates` (0.2.0): beside `training/estimates.py` the name did not say these are the
tokenize steps' estimates."""

from marin_assets.core.renames import moved_module

moved_module(__name__, "marin_assets.pipeline.tokens.token_estimates")
