"""The project's Dagster definitions: what `dg` loads (`[tool.dg.project]` in pyproject.toml), and what
the root `definitions.py` re-exports for `workspace.yaml`, `dagster dev` and `dagster asset materialize`.

It lives inside the package because `dg` finds a project's definitions by module name
(`<root_module>.definitions`); it sits above the Dagster layer and the experiments, which it joins.
Each experiment module exports its `experiment`; `experiment_definitions` merges them (assets,
per-checkpoint evaluations and their sensor, automation, the source sensor, the refresh schedule).
Sensors and schedules start switched off; turn them on in the UI (Automation) or with
`dagster sensor start <name>` / `dagster schedule start <name>` (see the README).
"""

import os

from marin_assets.dagster import experiment_definitions
from marin_assets.dagster.components import yaml_experiments
from marin_assets.experiments import (
    downstream_eval,
    dpo_chat,
    hello_world,
    overlap_demo,
    python_docs,
    rl_arithmetic,
    scaling_ladder,
    sft_chat,
)
from resources import RayResource, StorageResource

EXPERIMENTS = [hello_world.experiment, python_docs.experiment, downstream_eval.experiment, sft_chat.experiment,
               dpo_chat.experiment, rl_arithmetic.experiment, overlap_demo.experiment, scaling_ladder.experiment,
               *yaml_experiments()]
steps = [s for e in EXPERIMENTS for s in e.steps]
per_checkpoint = [f for e in EXPERIMENTS for f in e.per_checkpoint]

defs = experiment_definitions(
    EXPERIMENTS,
    resources={"storage": StorageResource(), "ray": RayResource()},
    refresh_cron=os.environ.get("MARIN_REFRESH_CRON", "0 3 * * *"),
    describe_drift=True,  # unsynced assets say which hash_attrs changed (read when the definitions load)
)
