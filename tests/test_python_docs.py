"""The demo's real-text corpus: the standard library's docstrings and pydoc's topics, collected
without importing the library, cleaned lightly, split by package, deterministic, and read back
through the same readers every dataset goes through."""

import dataclasses
import gzip
import hashlib
import json
import textwrap

import pytest

from marin_assets.pipeline.data import python_docs as pd
from marin_assets.pipeline.data.python_docs import (
    PythonBuild,
    PythonDocsError,
    clean,
    collect_python_docs,
    python_docs_step,
    python_documents,
    split_documents,
)
from marin_assets.pipeline.data.text_files import expand_files, iter_documents

PACKAGE_INIT = '''
"""A package whose docstring is long enough to keep as a document."""
import sys
raise SystemExit("collecting documentation must never import the library")
'''
MODULE = '''
"""
    The module docstring, indented the way docstrings are.

       An indented example line stays indented relative to the rest.TRAILING


    Blank runs shrink to one.
"""

class Widget:
    """A widget that frobnicates knobs whenever it is asked to do so."""

    def frob(self):
        """Short."""

    def turn(self, knob):
        """Turn one knob of the widget by exactly one notch clockwise."""

        def inner():
            """Nested functions are implementation details, but documented ones are kept."""

if sys.platform == "win32":
    def only_windows():
        """A function defined under a platform check is documentation too."""
else:
    def only_windows():
        """A function defined under a platform check is documentation too."""
'''.replace("TRAILING", "   ")  # trailing spaces, written so the source has none


@pytest.fixture
def stdlib(tmp_path):
    """A tiny stand-in standard library: a package, a module, and folders that must be skipped."""
    root = tmp_path / "lib"
    (root / "widgets").mkdir(parents=True)
    (root / "widgets" / "__init__.py").write_text(PACKAGE_INIT)
    (root / "widgets" / "knobs.py").write_text(MODULE)
    (root / "other.py").write_text('"""Another top-level module with a docstring long enough to keep."""\n')
    (root / "broken.py").write_text('"""A file this Python cannot parse is skipped."""\nprint "old syntax"\n')
    for skipped in ("test", "site-packages", "__pycache__"):
        (root / skipped).mkdir()
        (root / skipped / "x.py").write_text('"""This folder is not the documentation of the library."""\n')
    return str(root)


def test_docstrings_are_read_without_importing_dedented_cleaned_and_deduplicated(stdlib, monkeypatch):
    monkeypatch.setattr(pd, "pydoc_topics", lambda: iter(()))
    documents, counts = python_documents(stdlib, min_chars=40)
    assert [d.source for d in documents] == [
        "stdlib:other", "stdlib:widgets", "stdlib:widgets.knobs", "stdlib:widgets.knobs:Widget",
        "stdlib:widgets.knobs:Widget.turn", "stdlib:widgets.knobs:Widget.turn.inner",
        "stdlib:widgets.knobs:only_windows"]
    assert counts == {"source_files": 3, "dropped_short": 1, "dropped_duplicate": 1}  # "Short."; the else branch
    assert {d.group for d in documents} == {"stdlib:other", "stdlib:widgets"}
    module = next(d.text for d in documents if d.source == "stdlib:widgets.knobs")
    assert module == ("The module docstring, indented the way docstrings are.\n\n"
                      "   An indented example line stays indented relative to the rest.\n\nBlank runs shrink to one.")


def test_a_split_left_empty_is_an_error_before_anything_is_written(stdlib, tmp_path):
    with pytest.raises(PythonDocsError, match="no validation documents"):
        collect_python_docs(str(tmp_path / "out"), PythonBuild.current(), validation_percent=0, stdlib_dir=stdlib)
    assert not (tmp_path / "out").exists()


def test_clean_keeps_paragraphs_and_drops_trailing_space():
    assert clean("  a  \r\n\r\n\n\nb\t\n  c\n\n") == "a\n\nb\n  c"


def test_pydoc_topics_are_documents_of_their_own_group():
    topics = list(pd.pydoc_topics())
    assert topics, "pydoc_data ships with CPython"
    assert [t.source for t in topics] == sorted(t.source for t in topics)
    assert all(t.group == t.source and t.source.startswith("pydoc:") for t in topics)
    assert any("assert" in t.text for t in topics if t.source == "pydoc:assert")


def test_validation_holds_out_whole_groups_deterministically():
    docs = [pd.Document(f"stdlib:m{i}:f{j}", f"stdlib:m{i}", f"text {i} {j}") for i in range(200) for j in range(3)]
    splits = split_documents(docs, validation_percent=10)
    assert split_documents(list(reversed(docs)), 10) == splits  # order in, order out: by hash only
    train_groups = {d.group for d in splits["train"]}
    validation_groups = {d.group for d in splits["validation"]}
    assert not train_groups & validation_groups
    assert 8 <= len(validation_groups) <= 35  # about 10% of 200 groups
    assert split_documents(docs, 0)["validation"] == []


def group_of(source: str) -> str:
    """`stdlib:json.decoder:JSONDecoder` → `stdlib:json`; `pydoc:assert` stays."""
    kind, name = source.split(":")[:2]
    return f"{kind}:{name.split('.')[0]}"


def test_the_real_corpus_is_collected_deterministically_and_reads_back(tmp_path):
    python = PythonBuild.current()
    first = collect_python_docs(str(tmp_path / "a"), python)
    assert first.python == python and first.source_files > 300
    assert first.train.documents > 3000 and first.validation.documents > 100
    assert first.train.bytes + first.validation.bytes > 1_000_000
    assert first.train.files == ["train/shard-00000.jsonl.gz", "train/shard-00001.jsonl.gz"]

    content = hashlib.sha256()
    for split, summary in (("train", first.train), ("validation", first.validation)):
        files = expand_files(str(tmp_path / "a"), [f"{split}/*"])
        texts = [text for _, _, text in iter_documents(files)]  # the reader every tokenizer and cache uses
        assert len(texts) == summary.documents and all(len(t) >= 40 for t in texts)
        raw = b"".join(gzip.open(f).read() for f in files)
        assert hashlib.sha256(raw).hexdigest() == summary.sha256 and len(raw) == summary.bytes
        content.update(raw)
        groups = {group_of(json.loads(line)["source"]) for line in raw.splitlines()}
        if split == "train":
            train_groups = groups
    assert content.hexdigest() == first.sha256
    assert not train_groups & groups  # no package on both sides

    second = collect_python_docs(str(tmp_path / "b"), python)
    assert dataclasses.replace(second, path=first.path) == first
    for rel in first.train.files + first.validation.files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_identity_names_the_python_build_and_the_function_refuses_another(tmp_path):
    here = PythonBuild.current()
    step = python_docs_step("raw/docs")
    assert step.hash_attrs["python"] == here
    other = PythonBuild(here.implementation, here.version + "1")
    assert python_docs_step("raw/docs", other).hash != step.hash
    assert python_docs_step("raw/docs", validation_percent=5).hash != step.hash
    with pytest.raises(PythonDocsError, match=textwrap.shorten(f"identity is for {other}'s documentation", 80)):
        collect_python_docs(str(tmp_path / "x"), other)
    assert not (tmp_path / "x").exists()
