"""The Dagster definitions of this project, for `workspace.yaml`, `dagster dev` and
`dagster asset materialize -f definitions.py`: a re-export of `marin_assets.definitions`, the module
`dg` loads (`[tool.dg.project]` in pyproject.toml), so both CLIs serve one set of definitions.

Sensors and schedules start switched off; turn them on in the UI (Automation) or with
`dagster sensor start <name>` / `dagster schedule start <name>` (see the README).
"""

from marin_assets.definitions import defs, per_checkpoint, steps

__all__ = ["defs", "per_checkpoint", "steps"]
