"""Dagster components of this project (`[tool.dg.project] registry_modules`): experiments declared in YAML.

`dg scaffold defs marin_assets.dagster.components.LanguageModelExperiment <folder>` writes a `defs.yaml` under the
project's defs folder (`marin_assets/defs/`); `dg check defs` validates it; `yaml_experiments` gives the project's
definitions their `Experiment`s, served beside the Python ones.
"""

from marin_assets.dagster.components.language_model import LanguageModelExperiment, yaml_experiments

__all__ = ["LanguageModelExperiment", "yaml_experiments"]
