"""Real English text every machine with Python has: the standard library's documentation.

The docstrings of the standard library's modules, classes and functions (read from its `.py`
source with `ast`, never by importing it) and pydoc's topics (`pydoc_data.topics`: the language
reference's sections behind `help("assert")`). About 6,800 documents, 2.6 MB of text on CPython
3.12: small enough for a laptop demo, real enough that a tiny model's loss behaves like a real
run's instead of dropping to zero on template sentences.

The text is fixed by the Python build, so the step's identity holds its implementation and
version (`PythonBuild`), and the function refuses to run under another one; its record holds
what was collected (documents, bytes, sha256), so two builds that differ anyway (a distro's
patches) are told apart. Validation is held out by a hash of each document's group — a
top-level package or a pydoc topic — so near-duplicate docstrings of one package never
straddle the splits.
"""

from __future__ import annotations

import ast
import hashlib
import os
import platform
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.data.corpus import write_jsonl_shards

EXCLUDED_DIRS = ("__pycache__", "site-packages", "dist-packages", "test", "tests", "idle_test")
"""Folders of the standard library not read: caches, installed packages and test suites."""
DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


class PythonDocsError(RuntimeError):
    """The documentation cannot be collected as the step's identity says."""


@dataclass(frozen=True)
class PythonBuild:
    """What fixes the documentation's text: the interpreter's implementation and version."""

    implementation: str
    version: str

    @classmethod
    def current(cls) -> PythonBuild:
        """The running interpreter (`platform.python_implementation()`, `platform.python_version()`)."""
        return cls(platform.python_implementation(), platform.python_version())

    def __str__(self) -> str:
        return f"{self.implementation} {self.version}"


@dataclass(frozen=True)
class Document:
    """One piece of documentation: where it comes from, the group its split is drawn by, its text."""

    source: str
    """`stdlib:json.decoder:JSONDecoder.decode` or `pydoc:assert`."""
    group: str
    """`stdlib:json` (the top-level package) or `pydoc:assert`."""
    text: str


@dataclass(frozen=True)
class SplitSummary:
    """One split as written: files, documents, uncompressed JSONL bytes and their sha256."""

    files: list[str]
    documents: int
    bytes: int
    sha256: str


@record_type("python_docs")
@dataclass(frozen=True)
class PythonDocs:
    """The collected corpus: per split, what the Python build held, and what was dropped."""

    path: str
    python: PythonBuild
    train: SplitSummary
    validation: SplitSummary
    sha256: str
    """Of both splits' JSONL, train then validation: changes exactly when the text does."""
    source_files: int
    dropped_short: int
    dropped_duplicate: int


def clean(text: str) -> str:
    """Light cleaning: trailing spaces gone from every line, runs of blank lines made one, ends stripped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    kept = [line for i, line in enumerate(lines) if line or (i > 0 and lines[i - 1])]
    return "\n".join(kept).strip()


def stdlib_files(stdlib_dir: str) -> Iterator[tuple[str, str]]:
    """(module name, path) of the standard library's `.py` files, in sorted path order."""
    for dirpath, dirnames, filenames in os.walk(stdlib_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("."))
        rel = os.path.relpath(dirpath, stdlib_dir)
        package = [] if rel == "." else rel.split(os.sep)
        for filename in sorted(f for f in filenames if f.endswith(".py")):
            module = package + ([] if filename == "__init__.py" else [filename[:-3]])
            if module:
                yield ".".join(module), os.path.join(dirpath, filename)


def docstrings(module: str, source: bytes) -> Iterator[Document]:
    """The docstrings of a module's source, dedented (`ast.get_docstring`), in source order."""
    group = "stdlib:" + module.split(".")[0]

    def visit(node: ast.AST, qualname: list[str]) -> Iterator[Document]:
        if isinstance(node, (ast.Module, *DEFINITIONS)) and (doc := ast.get_docstring(node, clean=True)):
            yield Document(f"stdlib:{module}" + (":" + ".".join(qualname) if qualname else ""), group, doc)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, DEFINITIONS):
                yield from visit(child, qualname + [child.name])
            elif isinstance(child, ast.If | ast.Try) and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, qualname)  # definitions under `if sys.platform…:` / `try:`

    yield from visit(ast.parse(source), [])


def pydoc_topics() -> Iterator[Document]:
    """pydoc's topics (the language reference behind `help("keyword")`), sorted by name; none if absent."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions package pydoc_data separately
        return
    for name in sorted(topics):
        yield Document(f"pydoc:{name}", f"pydoc:{name}", topics[name])


def python_documents(stdlib_dir: str, min_chars: int) -> tuple[list[Document], dict[str, int]]:
    """The cleaned documents of the standard library and pydoc, in reading order, tiny and repeated
    texts dropped (the first occurrence kept); and counts of files read and documents dropped."""
    counts = {"source_files": 0, "dropped_short": 0, "dropped_duplicate": 0}
    seen: set[str] = set()
    kept: list[Document] = []

    def collected() -> Iterator[Document]:
        for module, path in stdlib_files(stdlib_dir):
            with open(path, "rb") as f:
                source = f.read()
            try:
                found = list(docstrings(module, source))
            except (SyntaxError, ValueError):  # a file this Python cannot parse: not its documentation
                continue
            counts["source_files"] += 1
            yield from found
        yield from pydoc_topics()

    for document in collected():
        text = clean(document.text)
        if len(text) < min_chars:
            counts["dropped_short"] += 1
        elif text in seen:
            counts["dropped_duplicate"] += 1
        else:
            seen.add(text)
            kept.append(Document(document.source, document.group, text))
    return kept, counts


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def is_validation(group: str, validation_percent: float) -> bool:
    """Whether a group is held out: its hash, not its position, decides — stable as documents come and go."""
    return _digest(group) % 10_000 < validation_percent * 100


def split_documents(documents: Sequence[Document], validation_percent: float) -> dict[str, list[Document]]:
    """Train and validation, each in an order shuffled by a hash of the source name: training reads
    files in order, so neighbouring batches should not all come from one package."""
    splits: dict[str, list[Document]] = {"train": [], "validation": []}
    for document in documents:
        splits["validation" if is_validation(document.group, validation_percent) else "train"].append(document)
    return {name: sorted(docs, key=lambda d: _digest(d.source)) for name, docs in splits.items()}


def collect_python_docs(output_path: str, python: PythonBuild, validation_percent: float = 10.0,
                        min_chars: int = 40, shards: int = 2, stdlib_dir: str | None = None) -> PythonDocs:
    """Collect the standard library's docstrings and pydoc's topics as JSONL `train/` and `validation/`."""
    if PythonBuild.current() != python:
        raise PythonDocsError(f"this step's identity is for {python}'s documentation, but it runs under"
                              f" {PythonBuild.current()}: run it where that Python is, or define it here")
    stdlib_dir = stdlib_dir or sysconfig.get_paths()["stdlib"]
    documents, counts = python_documents(stdlib_dir, min_chars)
    splits = split_documents(documents, validation_percent)
    empty = [name for name, docs in splits.items() if not docs]
    if empty:
        raise PythonDocsError(f"no {' or '.join(empty)} documents in {stdlib_dir} (at least {min_chars} characters,"
                              f" {validation_percent}% held out)")
    summaries, content = {}, hashlib.sha256()
    for name, docs in splits.items():
        digest = hashlib.sha256()
        records = [{"text": d.text, "source": d.source} for d in docs]
        files, size = write_jsonl_shards(output_path, name, records, shards if name == "train" else 1,
                                         digests=[digest, content])
        summaries[name] = SplitSummary(files, len(docs), size, digest.hexdigest())
    return PythonDocs(output_path, python, summaries["train"], summaries["validation"], content.hexdigest(),
                      **counts)


def python_docs_step(name: str, python: PythonBuild | None = None, validation_percent: float = 10.0,
                     min_chars: int = 40, shards: int = 2) -> Step:
    """The documentation of a Python build (default: the running one) as a raw text dataset.

    Identity: `python`, `validation_percent`, `min_chars`, `shards`, the sources read and the folders left out.
    """
    python = python or PythonBuild.current()
    return Step(
        name=name,
        fn=lambda out: collect_python_docs(out, python, validation_percent, min_chars, shards),
        hash_attrs={"python": python, "validation_percent": validation_percent, "min_chars": min_chars,
                    "shards": shards, "sources": ["stdlib-docstrings", "pydoc-topics"],
                    "excluded_dirs": list(EXCLUDED_DIRS), "format": "python-docs-v1"},
        kind="generate",
        description=made_by(collect_python_docs),
    )
