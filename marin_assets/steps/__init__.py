"""The front door: every step factory and spec an experiment is written with, from one import.

    from marin_assets.steps import python_docs_step, bpe_tokenizer_step, tokenize_step, train_step, ModelSpec

Grouped as Marin's builders are — `data` (downloads, datasets, curation, tokenizing), `train` (methods,
starting weights, exports, specs), `evaluation` (the evaluation kinds), `sweep` (grids, ladders, reports
across runs) — with `recipes` (the common chains wired once: `language_model_pipeline`), and re-exported
here. Where a name is defined is not part of the API; this package is.
Importing it loads neither Dagster nor Levanter (the protocol names — `Step`, `materialize_step`,
`Experiment` — are in `marin_assets`).

A factory's docstring opens with what it makes; its `Identity:` paragraph names what enters the step's
identity — in parentheses the steps it depends on, whose identities enter with theirs; after "not", what
changes only how or where it runs (tests/test_front_door.py holds every factory to this).
"""

from marin_assets.steps import data, evaluation, recipes, sweep, train
from marin_assets.steps.data import *  # noqa: F403
from marin_assets.steps.evaluation import *  # noqa: F403
from marin_assets.steps.recipes import *  # noqa: F403
from marin_assets.steps.sweep import *  # noqa: F403
from marin_assets.steps.train import *  # noqa: F403

GROUPS = {"data": data, "train": train, "evaluation": evaluation, "sweep": sweep, "recipes": recipes}
"""Each group's module, by name (`GROUPS["train"].__all__`: the training names)."""

__all__: list[str] = []
__all__ += data.__all__
__all__ += train.__all__
__all__ += evaluation.__all__
__all__ += sweep.__all__
__all__ += recipes.__all__
