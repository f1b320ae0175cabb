"""Moved to `curation.ngram_overlap` (0.2.0): beside `reports/overlap.py` (the train–test overlap report) the name
did not say this one holds the n-gram measurement the report makes."""

from marin_assets.core.renames import moved_module

moved_module(__name__, "marin_assets.pipeline.curation.ngram_overlap")
