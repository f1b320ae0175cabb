"""The training wing's layout: a folder per method over shared pieces, imports that point one way, and the old
module paths still importing for one release (warning, naming the new one).

The import graph is read from the source (every `import`, at module level and inside functions: a function-level
import hid the last cycle), so a cycle or a new floor is caught before anything runs.
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest

from tests.support.helpers import ROOT

PACKAGE = "marin_assets.pipeline.training"
FOLDER = ROOT / "marin_assets" / "pipeline" / "training"
METHODS = {"pretrain": "train_step", "sft": "sft_step", "dpo": "dpo_step", "rl": "rl_step"}
MAX_FLOORS = 11
"""Fewer import levels than the 12 the flat folder had (issue 38); the layout of 0.2.0 has 10."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in FOLDER.rglob("*.py")}


def imports_of(module: str) -> set[str]:
    """The training modules `module` imports, anywhere in it (package faces resolved to what they name)."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


@cache
def floor(module: str, seen: tuple[str, ...] = ()) -> int:
    if module in seen:
        raise AssertionError(f"import cycle in {PACKAGE}: {' -> '.join((*seen[seen.index(module):], module))}")
    below = [floor(m, (*seen, module)) for m in GRAPH[module]]
    return 1 + max(below, default=0)


def test_the_training_wing_has_no_import_cycle_and_fewer_floors_than_twelve():
    floors = {m: floor(m) for m in MODULES}
    top = max(floors.values())
    print(f"{len(MODULES)} modules, {top} floors; top: {sorted(m for m, f in floors.items() if f == top)}")
    assert top <= MAX_FLOORS, sorted(floors.items(), key=lambda kv: -kv[1])[:5]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_is_a_folder_whose_step_module_makes_its_step(method):
    step_module = importlib.import_module(f"{PACKAGE}.{method}.step")
    assert callable(getattr(step_module, METHODS[method]))
    # a method reads the shared pieces and its own folder; SFT alone builds on pretraining (train_lm on chat caches)
    others = {m for m in GRAPH[f"{PACKAGE}.{method}.step"]
              if any(m.startswith(f"{PACKAGE}.{o}.") or m == f"{PACKAGE}.{o}" for o in METHODS if o != method)}
    allowed = {f"{PACKAGE}.pretrain.step"} if method == "sft" else set()
    assert others <= allowed, f"{method} imports another method's modules: {sorted(others - allowed)}"


def test_where_a_runs_first_weights_come_from_is_answered_in_sources():
    sources = importlib.import_module(f"{PACKAGE}.sources")
    for name in ("InitFrom", "InitWeights", "from_hf", "from_checkpoint", "source_model", "model_of",
                 "resolve_weights", "source_mismatches", "check_source_tokenizer"):
        assert getattr(sources, name).__module__ == sources.__name__, name


OLD_NAMES = [
    # (old module, name, new module)
    (f"{PACKAGE}.pretrain", "train_step", f"{PACKAGE}.pretrain.step"),
    (f"{PACKAGE}.sft", "sft_step", f"{PACKAGE}.sft.step"),
    (f"{PACKAGE}.dpo", "dpo_step", f"{PACKAGE}.dpo.step"),
    (f"{PACKAGE}.rl", "rl_step", f"{PACKAGE}.rl.step"),
    (f"{PACKAGE}.run", "TrainResult", f"{PACKAGE}.training_run"),
]


@pytest.mark.parametrize(("old", "name", "new"), OLD_NAMES)
def test_an_old_training_path_still_imports_and_warns_naming_the_new_one(old, name, new):
    if sys.modules.get(old) is importlib.import_module(new):  # a moved module warns when first imported
        del sys.modules[old]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(new in m and "0.3.0" in m for m in messages), messages


def test_a_folder_forwards_only_the_names_its_old_module_had():
    with pytest.raises(ImportError):
        exec(f"from {PACKAGE}.pretrain import no_such_name", {})


def _train_record(**method_fields):
    from marin_assets.core.results import to_jsonable
    from marin_assets.pipeline.training.training_run import TrainResult

    base = to_jsonable(TrainResult(run_id="r", steps=2, final_train_loss=1.0, final_eval_loss=None, eval_losses={},
                                   tokens_per_second=None, checkpoint_steps=[2], checkpoint_dir="c", hf_dir=None))
    base.pop("method_metrics")
    return {**base, **method_fields}


def test_a_method_fills_one_slot_and_records_before_it_load_into_that_slot():
    from marin_assets.core.results import from_jsonable, to_jsonable
    from marin_assets.pipeline.training.dpo.metrics import DpoMetrics
    from marin_assets.pipeline.training.rl.metrics import RlMetrics
    from marin_assets.pipeline.training.training_run import TrainResult

    dpo = DpoMetrics(beta=0.1, final_validation_accuracy=0.9, validation_accuracy_curve=[[1, 0.5], [2, 0.9]])
    rl = RlMetrics(environment={"name": "addition"}, held_out_problems=8, final_held_out_pass_rate=0.5)
    for metrics, old_field in ((dpo, "dpo"), (rl, "rl")):
        other = "rl" if old_field == "dpo" else "dpo"
        # a record of 0.1: the method's own field, the other method's field None
        old = from_jsonable(_train_record(**{old_field: to_jsonable(metrics), other: None}), TrainResult)
        assert old.method_metrics == metrics and type(old.method_metrics) is type(metrics)
        # a record of 0.2: the one slot, which loads back as the method's type
        new = from_jsonable(to_jsonable(old), TrainResult)
        assert new == old and "dpo" not in to_jsonable(new) and "rl" not in to_jsonable(new)
        with pytest.warns(DeprecationWarning, match="method_metrics"):
            assert getattr(new, old_field) == metrics
        with pytest.warns(DeprecationWarning, match="method_metrics"):
            assert getattr(new, other) is None
    with pytest.raises(ValueError, match="'dpp'"):  # an unknown field is still an error, naming it
        from_jsonable(_train_record(dpp=None), TrainResult)
