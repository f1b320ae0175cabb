"""The documentation keeps up with the code: every `Step` field in the README's table, and a
docstring on every public step factory, result type and function of the protocol and library."""

import dataclasses
import importlib
import inspect
import pkgutil

import marin_assets.core
import marin_assets.pipeline
from marin_assets import Step
from tests.support.helpers import ROOT


def readme_step_fields() -> set[str]:
    """The first column of the README's table of `Step` fields (`fn(output_path)` counts as `fn`)."""
    text = (ROOT / "README.md").read_text()
    table = text.split("| field | meaning |", 1)[1].split("\n\n", 1)[0]
    names = set()
    for line in table.splitlines()[2:]:
        cell = line.strip("|").split("|")[0].strip()
        names.update(part.strip().strip("`").split("(")[0] for part in cell.split(","))
    return names


def test_the_readme_lists_every_step_field():
    assert readme_step_fields() == {f.name for f in dataclasses.fields(Step)}


def undocumented(packages) -> list[str]:
    missing = []
    for package in packages:
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                    continue
                if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                    continue
                doc = (obj.__doc__ or "").strip()
                generated = inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")  # dataclass default
                if not doc or generated:
                    missing.append(f"{module.__name__}.{name}")
    return missing


def test_every_public_factory_result_type_and_function_has_a_docstring():
    assert undocumented([marin_assets.core, marin_assets.pipeline]) == []


def test_every_name_of_the_dagster_surface_has_a_docstring():
    import marin_assets.dagster as serving

    missing = [n for n in serving.__all__ if not isinstance(getattr(serving, n), str)
               and not (getattr(serving, n).__doc__ or "").strip()]
    assert missing == []


def test_the_docs_give_run_tags_only_with_a_command_that_takes_them():
    """`dagster asset materialize` and `dg launch` have no `--tags` (Dagster 1.13); `dagster job execute` has."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        flat = " ".join(page.read_text().replace("\\\n", " ").split())
        for at in [i for i in range(len(flat)) if flat.startswith("--tags", i)]:
            before = flat[max(0, at - 160):at]
            said_missing = before.endswith("no `")  # "… have no `--tags`"
            assert "job execute" in before or said_missing, f"{page.name}: --tags after {before[-100:]!r}"
    assert "dagster job execute -f definitions.py -j __ASSET_JOB" in (ROOT / "README.md").read_text()
