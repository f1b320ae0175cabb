"""The front door (`marin_assets.steps`) holds: every name resolves, the groups (Marin's four and the recipes)
partition it, every factory's and recipe's docstring says what it makes and what its identity is, and the shipped
experiments and the documentation's examples (the README's and docs/'s) build from it rather than from deep
pipeline modules."""

import ast
import inspect
import json
import re
import subprocess
import sys
import typing
from collections.abc import Mapping

import pytest

import marin_assets
import marin_assets.steps as front
from marin_assets import Step
from marin_assets.steps import CheckpointEvals
from tests.support.helpers import ROOT

GROUPS = ("data", "train", "evaluation", "sweep", "recipes")
EXPERIMENTS = sorted((ROOT / "marin_assets" / "experiments").glob("*.py"))


def _moved(path) -> bool:
    """A module's old path left for one release (`core/renames.py`): it only forwards to the new one."""
    return "moved_module(__name__" in path.read_text()


COMPONENTS = sorted(p for p in (ROOT / "marin_assets" / "dagster" / "components").glob("*.py") if not _moved(p))
"""The YAML experiment component's files: they build steps as the experiments do."""
FRONT_DOOR = {"marin_assets", "marin_assets.steps"}
"""Where a documentation example takes names from: the protocol's names and the front door."""
IMPERATIVES = {"build", "compute", "create", "download", "evaluate", "fine-tune", "make", "pin", "read", "return",
               "run", "start", "submit", "train", "tune", "use", "write"}
"""Summaries that say what the factory does rather than what it makes."""


def test_every_name_resolves_and_the_groups_partition_the_front_door():
    assert set(front.GROUPS) == set(GROUPS)
    seen: dict[str, str] = {}
    for group, module in front.GROUPS.items():
        assert module.__name__ == f"marin_assets.steps.{group}"
        assert (module.__doc__ or "").strip(), f"{module.__name__} says nothing about what it holds"
        assert len(module.__all__) == len(set(module.__all__)), f"{group} lists a name twice"
        for name in module.__all__:
            assert name not in seen, f"{name} is in both {seen.get(name)} and {group}"
            seen[name] = group
            value = getattr(module, name)  # AttributeError: listed, not there
            assert getattr(front, name) is value, f"marin_assets.steps.{name} is not {group}'s"
    assert sorted(front.__all__) == sorted(seen), "the package's __all__ is not the union of its groups'"
    assert len(front.__all__) == len(set(front.__all__))
    assert len(front.__all__) >= 50


def test_star_import_gives_exactly_the_listed_names():
    namespace: dict[str, object] = {}
    exec("from marin_assets.steps import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(front.__all__)


def _returns_steps(fn) -> bool:
    """A factory: it returns a step (any `Step` subclass), a list of them, or a per-checkpoint family; or a recipe,
    its steps by role (a mapping)."""
    returned = typing.get_type_hints(fn).get("return")
    if inspect.isclass(returned):
        return issubclass(returned, (Step, CheckpointEvals, Mapping))
    args = typing.get_args(returned)
    return typing.get_origin(returned) is list and len(args) == 1 and inspect.isclass(args[0]) \
        and issubclass(args[0], Step)


FACTORIES = sorted(n for n, value in ((n, getattr(front, n)) for n in front.__all__)
                   if inspect.isfunction(value) and _returns_steps(value))


def test_the_factories_are_found():
    # If the return annotations stopped resolving, the docstring checks below would check nothing.
    assert len(FACTORIES) >= 45
    assert {"train_step", "tokenize_step", "loss_eval_step", "lr_model_sweep", "loss_checkpoint_evals",
            "language_model_pipeline", "tokenized_corpus"} <= set(FACTORIES)


def _identity_part(doc: str) -> str | None:
    """The `Identity:` paragraph of a docstring (`Identity (each checkpoint's step):` counts), or None."""
    found = re.search(r"^Identity\b[^:\n]*:(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    return found.group(1).strip() if found else None


@pytest.mark.parametrize("name", FACTORIES)
def test_each_factory_names_its_output_and_its_identity(name):
    fn = getattr(front, name)
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n", 1)[0].strip()
    assert len(summary.split()) >= 3, f"{name}: no summary of what it makes"
    first = summary.split()[0].strip("`").lower()
    assert first not in IMPERATIVES, f"{name}'s summary says what it does ({first!r}…), not what it makes"
    identity = _identity_part(doc)
    assert identity is not None, f"{name}: no `Identity:` paragraph"
    parameters = set(inspect.signature(fn).parameters)
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", identity))
    assert named & parameters, f"{name}: its Identity paragraph names none of its parameters ({sorted(parameters)})"
    module = sys.modules[fn.__module__]
    stale = {n for n in named if n not in parameters and n not in front.__all__ and not hasattr(module, n)}
    assert not stale, f"{name}: its Identity paragraph names {sorted(stale)}, which it does not take"


def test_identity_part_is_found_only_where_written():
    assert _identity_part("A step.\n\nIdentity: `n`, `seed`.\n") == "`n`, `seed`."
    assert _identity_part("A step.\n\nIdentity (each checkpoint's step): `x`.\n\nMore.") == "`x`."
    assert _identity_part("A step whose identity is its seed.") is None


def _imports(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every import, at any depth (a function-level import counts too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names)
    return found


def _marin_imports_outside_the_front_door(tree: ast.AST, experiment: bool = False,
                                          component: bool = False) -> list[str]:
    """Imports of marin_assets names from anywhere but the front door and `marin_assets`, and names taken from
    them that they do not export. An experiment may also import other experiments and the protocol's own
    modules (`marin_assets.core`: `walk`, `run_check`, … in its `main`), never the pipeline library. A component
    (`marin_assets/dagster/components/`) may also import the Dagster layer it belongs to (`marin_assets.dagster`:
    its sibling settings, `experiment_definitions`), never the pipeline library nor the protocol's modules."""
    wrong = []
    for module, names, line in _imports(tree):
        if module.split(".")[0] != "marin_assets":
            continue
        protocol = module == "marin_assets.core" or module.startswith("marin_assets.core.")
        if experiment and (module == "marin_assets.experiments" or protocol):
            continue
        if component and (module == "marin_assets.dagster" or module.startswith("marin_assets.dagster.")):
            continue
        if module not in FRONT_DOOR:
            wrong.append(f"l.{line}: {module}")
        elif module == "marin_assets.steps":
            wrong.extend(f"l.{line}: {n} (not exported)" for n in names if n not in front.__all__)
        elif module == "marin_assets":
            wrong.extend(f"l.{line}: marin_assets.{n} (not exported)" for n in names if n not in marin_assets.__all__)
    return wrong


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_the_shipped_experiments_build_from_the_front_door(path):
    wrong = _marin_imports_outside_the_front_door(ast.parse(path.read_text()), experiment=True)
    assert not wrong, f"{path.name} imports from outside the front door: {wrong}"


@pytest.mark.parametrize("path", COMPONENTS, ids=lambda p: p.name)
def test_the_yaml_component_builds_from_the_front_door(path):
    wrong = _marin_imports_outside_the_front_door(ast.parse(path.read_text()), component=True)
    assert not wrong, f"{path.name} imports from outside the front door: {wrong}"


def test_the_yaml_component_takes_its_factories_from_the_front_door():
    # The component check above passes vacuously if the files import no step factory at all.
    taken = {n for p in COMPONENTS for module, names, _ in _imports(ast.parse(p.read_text()))
             if module == "marin_assets.steps" for n in names}
    assert {"language_model_pipeline", "tokenized_corpus", "lr_model_sweep", "ModelSpec"} <= taken


def test_the_import_check_catches_a_deep_import():
    tree = ast.parse("from marin_assets.pipeline.training.pretrain.step import train_step\n"
                     "def f():\n    from marin_assets.pipeline.training.training_run import TrainResult\n"
                     "    from marin_assets.core.step import walk\n"
                     "from marin_assets.steps import not_a_factory\n"
                     "import marin_assets.dagster\n")
    assert len(_marin_imports_outside_the_front_door(tree, experiment=True)) == 4  # the protocol's walk is allowed
    assert len(_marin_imports_outside_the_front_door(tree, component=True)) == 4  # the Dagster layer is allowed
    assert len(_marin_imports_outside_the_front_door(tree)) == 5


DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""The README (the front page) and the documentation's pages, whose examples tests/test_docs.py runs."""


def _doc_examples() -> list[str]:
    return [block for page in DOC_PAGES for block in re.findall(r"```python[^\n]*\n(.*?)```", page.read_text(), re.S)]


def test_the_doc_examples_import_only_from_the_front_door():
    examples = _doc_examples()
    assert len(examples) >= 25
    assert any("from marin_assets.steps import" in e for e in re.findall(r"```python\n(.*?)```",
                                                                         (ROOT / "README.md").read_text(), re.S))
    for example in examples:
        wrong = _marin_imports_outside_the_front_door(ast.parse(example))
        assert not wrong, f"a documentation example imports from outside the front door: {wrong}\n{example}"


def test_every_step_factory_the_docs_call_is_at_the_front_door():
    """Calls of `*_step(`, `*_evals(`, `*_sweep(` (not methods: `pipeline.checkpoint_evals()`)."""
    text = " ".join(p.read_text() for p in DOC_PAGES)
    called = set(re.findall(r"(?<![\w.])([a-z_]+_(?:step|evals|sweep))\(", text))
    assert {"train_step", "tokenize_step", "harness_checkpoint_evals", "lr_model_sweep"} <= called
    assert sorted(called - set(front.__all__) - set(marin_assets.__all__)) == []


def test_the_front_door_and_the_experiments_import_without_dagster():
    names = [f"marin_assets.experiments.{p.stem}" for p in EXPERIMENTS if p.stem != "__init__"]
    script = ("import importlib, json, sys\nimport marin_assets.steps\n"
              f"for name in {names!r}:\n    importlib.import_module(name)\n"
              "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
              "{'dagster', 'dagster_gcp', 'dagster_postgres', 'levanter', 'jax'})))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
