"""The benchmark harness's cheapest measures, run for real, so that `make bench` cannot break silently: the
1000-asset load (one repetition, two fresh interpreters) and the tokenize comparison on a tiny corpus and
tokenizer (one repetition), then the page written from their rows. Speed is never asserted here (it lives
in `bench/`): only that every row is well formed — finite, positive figures, a ratio that is ours ÷
reference, a verdict that follows from its goal — and that the page says what the rows say."""

import math
import os
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench():
    """The bench modules (they import each other by name, from the bench folder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        import adapter_overhead
        import measure
        import real_tokenize
        import run

        yield {"adapter_overhead": adapter_overhead, "measure": measure, "real_tokenize": real_tokenize, "run": run}


@pytest.fixture(scope="module")
def rows(bench, tmp_path_factory):
    from marin_assets.pipeline.tokens.tokenizer import train_tokenizer

    tmp = str(tmp_path_factory.mktemp("bench"))
    real_tokenize = bench["real_tokenize"]
    texts = real_tokenize.stdlib_texts(150 << 10)
    raw = real_tokenize.write_corpus(os.path.join(tmp, "raw"), texts, shards=2)
    tok = train_tokenizer(os.path.join(tmp, "tok"), raw, vocab_size=400).path
    load = bench["adapter_overhead"].measure_load(n_assets=1000, reps=1)
    return [load, *real_tokenize.throughput_rows(tmp, texts, raw, tok, reps=1, corpus="stdlib source, 400-token BPE")]


def test_every_row_is_well_formed_with_finite_positive_ratios(bench, rows):
    assert [r["key"] for r in rows] == ["load_1000", "real_tokenize_vs_fastokens", "real_tokenize_vs_tokenizers",
                                        "real_tokenize_library"]
    for r in rows:
        assert bench["measure"].check_row(r) == [], r
        assert r["kind"] == "comparison" and r["reps"] == 1
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        assert r["spread"][0] == pytest.approx(r["ratio"], rel=0.01) == r["spread"][1]  # one repetition
    assert rows[0]["unit"] == "CPU s" and rows[0]["goal"] == {"on": "ratio", "op": "<=", "value": 1.2}
    assert all(r["unit"] == "tokens/s" for r in rows[1:])
    assert rows[3]["goal"] is None and rows[3]["met"] is None  # a library choice: reported, never judged


def test_the_page_is_written_from_the_rows_alone(bench, rows, tmp_path):
    measure, run = bench["measure"], bench["run"]
    demo = measure.absolute("demo", "demo end to end", [118.0], "s", goal=("ours", "<=", 180))
    slow = measure.absolute("slow", "something slow", [200.0], "s", goal=("ours", "<=", 180))
    every = [*rows, demo, slow]
    assert run.problems_of(every) == []
    page = run.write_page(every, tmp_path / "page.md", quick=True, seconds=60, start=run.Start(0.1, 0.5, 0.0),
                          groups=["load", "real_tokenize"]).read_text()
    assert "quiet: load average 0.10 when it started (below 0.5)" in page
    table = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| measure")]
    assert len(table) == len(every)
    assert "| 118 | — | — | — | s | 1 | ≤ 180 s | yes |" in page  # an absolute row: no ratio, no spread
    assert "| 200 | — | — | — | s | 1 | ≤ 180 s | **no** |" in page
    goals = [r for r in every if r["goal"] is not None]
    missed = [r for r in goals if not r["met"]]
    assert f"{len(goals)} goals, {len(goals) - len(missed)} met, {len(missed)} missed." in page
    assert page.count("- **missed**: ") == len(missed) and page.count("- **met**: ") == len(goals) - len(missed)
    assert "- **missed**: something slow: 200 s, goal ≤ 180 s." in page
    assert "### something slow" in page and "No profile recorded" in page  # listed even without a profile
    assert "## How each measure is taken" in page and "quick" in page


def test_a_row_that_divides_by_itself_or_contradicts_its_goal_is_refused(bench):
    measure = bench["measure"]
    good = measure.compare("x", "x", [1.0, 2.0], [2.0, 2.0], "s", goal=("ratio", "<=", 1.2))
    assert measure.check_row(good) == [] and good["met"] is True
    assert measure.check_row({**good, "met": False})
    assert measure.check_row({**good, "ratio": 3.0})
    assert measure.check_row({**good, "ours": float("nan")})
    with pytest.raises(ValueError):
        measure.absolute("y", "y", [1.0], "s", goal=("ratio", "<=", 1.0))  # an absolute row has no ratio
    assert measure.rotated(["a", "b"], 0) == ["a", "b"] and measure.rotated(["a", "b"], 1) == ["b", "a"]


def test_a_run_waits_for_a_quiet_machine_and_never_calls_a_busy_start_quiet(bench, tmp_path):
    run = bench["run"]
    now = [0.0]
    loads = iter([1.8, 1.2, 0.4])

    def sleep(seconds):
        now[0] += seconds

    quiet = run.wait_for_quiet(0.5, 300, poll_s=10, load=lambda: next(loads), clock=lambda: now[0], sleep=sleep)
    assert quiet == run.Start(0.4, 0.5, 20.0) and quiet.quiet
    assert "quiet: load average 0.40 when it started (below 0.5 after waiting 20 s)" in quiet.text()

    now[0] = 0.0
    busy = run.wait_for_quiet(0.5, 25, poll_s=10, load=lambda: 1.8, clock=lambda: now[0], sleep=sleep)
    assert busy == run.Start(1.8, 0.5, 25.0) and not busy.quiet  # bounded: it stops waiting
    header = next(line for line in run.page_text([], quick=True, seconds=60, start=busy, groups=["load"])
                  .splitlines() if line.startswith("One run of"))
    assert "**not quiet: load 1.80 at start** (above 0.5 after waiting 25 s" in header
    assert "quiet: load average" not in header
    assert "not quiet: load 1.80 at start** (above 0.5 and no wait allowed" in run.Start(1.8, 0.5, 0.0).text()


def imported_modules(path):
    """Every module `path` imports (at any depth of its code)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module)
    return found


def test_bare_levanter_imports_only_levanter_and_the_standard_library():
    import sys

    modules = imported_modules(BENCH / "bare_levanter.py")
    outside = {m for m in modules if m.split(".")[0] != "levanter" and m.split(".")[0] not in sys.stdlib_module_names}
    assert not outside, outside
    assert "levanter.main.train_lm" in modules


def test_config_differences_name_every_field_that_differs(bench):
    from dataclasses import dataclass

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        from pipeline_throughput import config_differences

    @dataclass
    class Inner:
        a: int
        b: list

    @dataclass
    class Outer:
        inner: Inner
        name: str

    @dataclass
    class Wider(Outer):
        extra: int = 0

    assert config_differences(Outer(Inner(1, [1, 2]), "x"), Outer(Inner(1, [1, 2]), "x")) == []
    assert config_differences(Outer(Inner(1, [1, 3]), "x"), Outer(Inner(2, [1, 2]), "y")) == ["inner.a", "inner.b[1]",
                                                                                              "name"]
    assert config_differences(Wider(Inner(1, []), "x", 5), Outer(Inner(1, []), "x")) == ["", "extra"]


def test_the_noisy_copies_are_made_by_nlpaug_not_by_the_detectors_module(bench):
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        import independent_noise

    imports = imported_modules(BENCH / "independent_noise.py")
    assert "nlpaug.augmenter.char" in imports
    assert not any("fuzzy" in m or "shingles" in m for m in imports)  # nothing of the detector
    source = (BENCH / "independent_noise.py").read_text()
    assert "import NoisyCorpus, boilerplate" in source and "add_noise(" not in source  # the shape, not the noise
    texts = bench["real_tokenize"].stdlib_texts(200 << 10)[:20]
    for rate in independent_noise.RATES:
        copies = [independent_noise.noisy_copy(text, rate, seed) for seed, text in enumerate(texts)]
        assert copies == [independent_noise.noisy_copy(text, rate, seed) for seed, text in enumerate(texts)]
        reached = sum(c.rate for c in copies) / len(copies)
        assert 0.6 * rate <= reached <= 1.4 * rate, (rate, reached)
        for text, copy in zip(texts, copies, strict=True):
            assert copy.text.count("\n") == text.count("\n")  # the layout stays: only words are edited
            if len(text) < 3000:  # the edits counted word by word are the copy's whole distance, or more
                assert independent_noise.levenshtein(text, copy.text) <= copy.edits
