"""The project's defs folder (`[tool.dg.project] defs_module`): one folder per experiment declared in YAML, each with
a `defs.yaml` of a `marin_assets.dagster.components.LanguageModelExperiment`. Make one with
`dg scaffold defs marin_assets.dagster.components.LanguageModelExperiment <folder>`; `dg check defs` validates them."""
