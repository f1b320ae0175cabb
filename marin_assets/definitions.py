"""The project's Dagster definitions: what `dg` loads (`[tool.dg.project]` in pyproject.toml), and what
the root `definitions.py` re-exports for `workspace.yaml`, `dagster dev` and `dagster asset materialize`.

It lives inside the package because `dg` finds a project's definitions by module name
(`<root_module>.definitions`); it sits above the Dagster layer and the experiments, which it joins.
Sensors and schedules start switched off; turn them on in the UI (Automation) or with
`dagster sensor start <name>` / `dagster schedule start <name>` (see the README).
"""

import os

import dagster as dg

from marin_assets.dagster import (
    automate,
    automation_sensor,
    build_definitions,
    checkpoint_evals_asset,
    checkpoint_sensor,
    source_sensor,
    unsynced_schedule,
    watched_sources,
)
from marin_assets.experiments import downstream_eval, hello_world, python_docs, sft_chat
from resources import RayResource, StorageResource

steps = hello_world.steps + python_docs.steps + downstream_eval.steps + sft_chat.steps
per_checkpoint = python_docs.per_checkpoint + downstream_eval.per_checkpoint  # one sensor, one run per checkpoint

defs = build_definitions(
    steps,
    resources={"storage": StorageResource(), "ray": RayResource()},
    describe_drift=True,  # unsynced assets say which hash_attrs changed (read when the definitions load)
    automation=automate(hello_world.steps),  # hello world opts in to materializing itself
    extra_assets=[checkpoint_evals_asset(e) for e in per_checkpoint],
    sensors=[
        checkpoint_sensor(per_checkpoint),
        automation_sensor(hello_world.steps),
        *([source_sensor(steps)] if watched_sources(steps) else []),
    ],
    schedules=[
        unsynced_schedule(dg.AssetSelection.groups("raw", "tokenizers", "tokenized", "checkpoints", "exports", "evals"),
                          os.environ.get("MARIN_REFRESH_CRON", "0 3 * * *")),
    ],
)
