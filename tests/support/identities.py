"""Every identity the project's definitions make, as `{asset name: name_with_hash}`: the demo and every
experiment module, their dependencies, and one partition step of each per-checkpoint family — pinned
in `tests/data/pinned_identities.json` so a refactoring that changes an output's path shows at once.

Regenerate (only when an identity is meant to change, and say why in the commit):
`.venv/bin/python -m tests.support.identities > tests/data/pinned_identities.json`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

from marin_assets.core.step import Step

PINNED = "tests/data/pinned_identities.json"


def closure(steps: Iterable[Step]) -> dict[str, str]:
    """Each step and its transitive dependencies: name → name_with_hash."""
    found: dict[str, str] = {}
    todo = list(steps)
    while todo:
        step = todo.pop()
        if step.name not in found:
            found[step.name] = step.name_with_hash
            todo.extend(step.deps)
    return found


def current_identities() -> dict[str, str]:
    """The identities of the definitions and experiments as the code makes them now."""
    from marin_assets import definitions
    from marin_assets.experiments import curated_docs, tiny_stories
    from marin_assets.pipeline.reports.run_costs import run_costs_step
    from tests.support import ui_definitions as ui

    found = closure([*definitions.steps, *curated_docs.steps, *tiny_stories.build().values()])
    for family in definitions.per_checkpoint:
        found.update(closure([family.step(50)]))
        found[f"{family.name} (family)"] = f"{family.name}_{family.hash}"
    ui_steps = [*ui.steps, *ui.sweep, run_costs_step("reports/ui-costs", ui.sweep)]
    found.update({f"ui: {name}": ident for name, ident in closure(ui_steps).items()})
    return dict(sorted(found.items()))


if __name__ == "__main__":
    json.dump(current_identities(), sys.stdout, indent=1)
    sys.stdout.write("\n")
