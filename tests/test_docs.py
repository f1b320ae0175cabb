"""The documentation keeps up with the code: the site builds with warnings as errors, every ```python
block of the pages and the README runs, every `Step` field is in the steps page's table, and a docstring on
every public step factory, result type and function of the protocol and library.

Which blocks run: a fence whose info string is exactly `python` runs. A block that must not run (a
fragment, a run that would train for minutes) is fenced ```` ```python title="not run: <why>" ```` —
GitHub and the site still show it as Python, the site with its reason as the title — and no other info
string starting with `python` is allowed. A page's blocks run in order in one fresh namespace (a later
block uses what an earlier one defined), in a fresh temporary working directory (outputs go to
`./outputs`, the default storage prefix) with `DAGSTER_HOME` a fresh temporary folder, in one subprocess
with this venv's Python for all pages (imports are paid once). Other fences (`sh`, `text`, none) are not
Python and are not run.
"""

import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import marin_assets.core
import marin_assets.pipeline
from marin_assets import Step
from tests.support.helpers import ROOT, subprocess_env

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""The README and every hand-written page (the API reference pages hold no examples of their own)."""
NOT_RUN = re.compile(r'^python title="not run: [^"]+"$')
FENCE = re.compile(r"^```(\S.*)?$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the first line of code, 1-based
    code: str
    runs: bool


def python_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page whose info string starts with `python`, in order."""
    blocks, info, start, body = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line.strip()) if line.startswith("```") else None
        if info is None and fence:
            info, start, body = (fence.group(1) or "").strip(), number + 1, []
        elif info is not None and line.strip() == "```":
            if info.startswith("python"):
                assert info == "python" or NOT_RUN.match(info), (
                    f"{path.name}:{start - 1}: ```{info}: a Python block either runs (```python) or says why not "
                    '(```python title="not run: …")')
                blocks.append(Block(path.name, start, "\n".join(body) + "\n", info == "python"))
            info = None
        elif info is not None:
            body.append(line)
    assert info is None, f"{path.name}: a fence opened at line {start - 1} is never closed"
    return blocks


RUNNER = textwrap.dedent('''
    import json, os, sys, tempfile, time, traceback, types
    pages, root = json.load(sys.stdin), sys.argv[1]
    results = []
    for n, (page, blocks) in enumerate(pages.items()):
        here = os.path.join(root, f"page-{n}")
        os.makedirs(os.path.join(here, "dagster_home"))
        os.chdir(here)
        os.environ["DAGSTER_HOME"] = os.path.join(here, "dagster_home")
        module = types.ModuleType(f"docs_page_{n}")  # a module of its own: dataclasses and pickling find it
        sys.modules[module.__name__] = module
        for line, code in blocks:
            started = time.monotonic()
            try:
                exec(compile("\\n" * (line - 1) + code, page, "exec"), module.__dict__)
                error = None
            except BaseException:
                error = traceback.format_exc(limit=-8)
            results.append({"page": page, "line": line, "error": error, "s": round(time.monotonic() - started, 2)})
            if error:
                break  # the page's later blocks build on this one
    print("RESULTS " + json.dumps(results))
''')


def run_blocks(pages: dict[str, list[Block]], tmp: Path) -> list[dict]:
    """Run each page's runnable blocks (see the module's docstring); one result per block that ran."""
    payload = {page: [(b.line, b.code) for b in blocks if b.runs] for page, blocks in pages.items()}
    env = subprocess_env(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    env.pop("MARIN_PREFIX", None)  # outputs under each page's working directory
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(tmp)], input=json.dumps(payload), env=env,
                          cwd=tmp, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-5000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[0].removeprefix("RESULTS "))


@pytest.fixture(scope="module")
def site_build(tmp_path_factory):
    """`mkdocs build --strict` started in the background, so that it runs while the examples do."""
    site = tmp_path_factory.mktemp("site")
    log = site.parent / f"{site.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                                cwd=ROOT, env=subprocess_env(NO_MKDOCS_2_WARNING="1"), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
    yield proc, site, log, time.monotonic()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_every_python_block_of_the_docs_runs(tmp_path, site_build):  # starts the build test's site_build
    pages = {page.relative_to(ROOT).as_posix(): python_blocks(page) for page in PAGES}
    blocks = [b for found in pages.values() for b in found]
    skipped = [f"{b.page}:{b.line}" for b in blocks if not b.runs]
    assert len(blocks) - len(skipped) >= 25, "fewer runnable examples than the pages had"
    assert len(skipped) <= 3, f"too many blocks marked not run: {skipped}"
    results = run_blocks(pages, tmp_path)
    failed = [f"{r['page']}:{r['line']}\n{r['error']}" for r in results if r["error"]]
    assert not failed, "\n\n".join(failed)
    assert len(results) == len(blocks) - len(skipped), "a page stopped before its last block"
    slowest = sorted(results, key=lambda r: -r["s"])[:5]
    print("slowest blocks:", ", ".join(f"{r['page']}:{r['line']} {r['s']} s" for r in slowest))


def test_the_site_builds_with_warnings_as_errors(site_build):
    proc, site, log, started = site_build
    rc = proc.wait(timeout=300)
    output = log.read_text()
    assert rc == 0, output[-5000:]
    assert "WARNING" not in output, output[-5000:]
    for page in PAGES[1:]:
        if page.name != "index.md":
            assert (site / page.stem / "index.html").is_file(), f"{page.name} is not on the site"
    train = (site / "reference" / "steps-train" / "index.html").read_text()
    assert 'id="marin_assets.steps.train.train_step"' in train  # the API reference, from the docstrings
    assert 'id="marin_assets.build_definitions"' in (site / "reference" / "protocol" / "index.html").read_text()
    changelog = (site / "changelog" / "index.html").read_text()
    assert "A documentation site" in changelog and 'href="../stability/"' in changelog
    print(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")


def test_the_block_runner_reports_a_failing_block_and_what_a_fence_means(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('x\n```python\nx = 1\n```\n```sh\nexit 1\n```\n```python title="not run: a fragment"\n'
                    "undefined()\n```\n```python\nassert x == 2, 'x is 1'\n```\n```python\nnever = 1\n```\n")
    blocks = python_blocks(page)
    assert [(b.line, b.runs) for b in blocks] == [(3, True), (9, False), (12, True), (15, True)]
    results = run_blocks({"page.md": blocks}, tmp_path)
    assert [(r["line"], r["error"] is None) for r in results] == [(3, True), (12, False)]  # stops at the failure
    assert "x is 1" in results[1]["error"] and 'page.md", line 12' in results[1]["error"]
    bad = tmp_path / "bad.md"
    bad.write_text("```python3\nx = 1\n```\n")
    try:
        python_blocks(bad)
    except AssertionError as e:
        assert "says why not" in str(e)
    else:
        raise AssertionError("a python fence with an unknown info string was accepted")


def steps_page_fields() -> set[str]:
    """The first column of the steps page's table of `Step` fields (`fn(output_path)` counts as `fn`)."""
    text = (ROOT / "docs" / "steps.md").read_text()
    table = text.split("| field | meaning |", 1)[1].split("\n\n", 1)[0]
    names = set()
    for line in table.splitlines()[2:]:
        cell = line.strip("|").split("|")[0].strip()
        names.update(part.strip().strip("`").split("(")[0] for part in cell.split(","))
    return names


def test_the_steps_page_lists_every_step_field():
    assert steps_page_fields() == {f.name for f in dataclasses.fields(Step)}


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
    for page in PAGES:
        flat = " ".join(page.read_text().replace("\\\n", " ").split())
        for at in [i for i in range(len(flat)) if flat.startswith("--tags", i)]:
            before = flat[max(0, at - 160):at]
            said_missing = before.endswith("no `")  # "… have no `--tags`"
            assert "job execute" in before or said_missing, f"{page.name}: --tags after {before[-100:]!r}"
    assert "dagster job execute -f definitions.py -j __ASSET_JOB" in (ROOT / "docs" / "dagster.md").read_text()


def test_the_readme_links_to_pages_that_exist():
    """The README is the front page on GitHub: its relative links resolve there as on the site."""
    text = (ROOT / "README.md").read_text()
    links = [link for link in re.findall(r"\]\(([^)#\s]+)[^)]*\)", text) if "://" not in link]
    assert len(links) >= 10
    missing = [link for link in links if not (ROOT / link).exists()]
    assert missing == []
    linked = {Path(link).name for link in links if link.startswith("docs/")}
    assert {p.name for p in PAGES[1:]} - {"index.md"} <= linked, "a docs page the README never points to"
    assert os.path.getsize(ROOT / "README.md") and len(text.splitlines()) <= 250
