"""Moved to `tokens.preference_cache` (0.2.0): beside `data/preference.py` (the preference pairs) the name did not
say this one holds their Levanter cache."""

from marin_assets.core.renames import moved_module

moved_module(__name__, "marin_assets.pipeline.tokens.preference_cache")
