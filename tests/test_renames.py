"""Old names kept for one release (`marin_assets/core/renames.py`): each still imports or works, is the new one,
and warns with a `DeprecationWarning` naming the new name. One table per sort of rename; the CHANGELOG lists the
same pairs (removed in 0.3.0)."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from marin_assets.core.renames import REMOVED_IN
from marin_assets.core.step import StepDefinitionError

MOVED_MODULES: list[tuple[str, str]] = [
    # (old module path, new module path)
    ("marin_assets.pipeline.reports.sweep", "marin_assets.pipeline.sweeps"),
    ("marin_assets.pipeline.tokens.preference", "marin_assets.pipeline.tokens.preference_cache"),
    ("marin_assets.pipeline.curation.overlap", "marin_assets.pipeline.curation.ngram_overlap"),
    ("marin_assets.pipeline.tokens.estimates", "marin_assets.pipeline.tokens.token_estimates"),
    ("marin_assets.dagster.components.experiment", "marin_assets.dagster.components.language_model"),
]
"""Modules that moved: the old path is the new module."""

RENAMED_FUNCTIONS: list[tuple[str, str, str]] = [
    # (module, old name, new name)
    ("marin_assets.pipeline.evals.loss", "evaluate_step", "loss_eval_step"),
    ("marin_assets.steps", "evaluate_step", "loss_eval_step"),
]
"""Functions under a new name: the old one calls the new one, warning at each call."""


def fresh_import(module: str) -> tuple[object, list[warnings.WarningMessage]]:
    """`module` imported anew (a moved module warns once per process: on its first import), and the warnings."""
    sys.modules.pop(module, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = importlib.import_module(module)
    return imported, caught


@pytest.mark.parametrize(("old", "new"), MOVED_MODULES, ids=[old for old, _ in MOVED_MODULES])
def test_a_moved_module_imports_from_its_old_path_as_the_new_module_and_warns(old, new):
    module, caught = fresh_import(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]  # patches and isinstance agree whichever path a caller used
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(new in m and REMOVED_IN in m for m in messages), messages


@pytest.mark.parametrize(("module", "old", "new"), RENAMED_FUNCTIONS, ids=[f"{m}.{o}" for m, o, _ in RENAMED_FUNCTIONS])
def test_a_renamed_function_still_works_under_its_old_name_and_warns(module, old, new):
    where = importlib.import_module(module)
    fn, renamed_to = getattr(where, old), getattr(where, new)
    assert fn.__wrapped__ is renamed_to
    with pytest.warns(DeprecationWarning, match=rf"{old} is now .*\.{new}\b.*{REMOVED_IN}"):
        with pytest.raises(StepDefinitionError, match="not a step"):  # the new one ran, and checked its arguments
            fn("evals/x", "not a step", {})


def test_the_old_keyword_and_field_of_an_evaluation_kind_warn_and_mean_eval_kind():
    from marin_assets.experiments import tiny_stories
    from marin_assets.steps import CheckpointEvals, eval_step, loss_checkpoint_evals

    pipeline = tiny_stories.build()
    family = loss_checkpoint_evals("evals/renamed", pipeline.train, {"stories": pipeline.tokenized})
    kind = family.eval_kind
    with pytest.warns(DeprecationWarning, match=rf"eval_step\(eval_kind=…\).*{REMOVED_IN}"):
        step = eval_step("evals/renamed-final", kind=kind, train=pipeline.train)
    assert step.hash == eval_step("evals/renamed-final", kind, pipeline.train).hash
    with pytest.warns(DeprecationWarning, match=r"CheckpointEvals\(eval_kind=…\)"):
        old = CheckpointEvals("evals/renamed", pipeline.train, kind=kind)
    assert (old.hash, old.step(50).hash) == (family.hash, family.step(50).hash)
    with pytest.warns(DeprecationWarning, match=r"CheckpointEvals.kind is now CheckpointEvals.eval_kind"):
        assert family.kind is kind
    with pytest.raises(TypeError, match="not both"):
        eval_step("evals/renamed-final", kind=kind, eval_kind=kind, train=pipeline.train)
