"""Moved to `components.language_model` (0.2.0): beside `pipeline/experiment.py` (the `Experiment` every module
exports) the name did not say this one holds the YAML `LanguageModelExperiment` component."""

from marin_assets.core.renames import moved_module

moved_module(__name__, "marin_assets.dagster.components.language_model")
