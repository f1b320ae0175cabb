"""Real templated text and six kinds of near copy of it: what a fuzzy dedup must tell apart.

Three kinds of real text that share most of their wording and are still different documents, all found on any
machine where `make install` ran:

- *reference pages of one tool*: the `--help` page of every command of the Dagster and Ray command lines (click
  renders them from one template: usage, options, the same option texts across commands);
- *generated API documentation*: pydoc's text page of every public class of some standard library modules
  (inherited methods listed alike, `Method resolution order`, `Data descriptors defined here`);
- *licence-headed files*: JAX's own source files, each under the same Apache licence header.

Each text is clipped to `MAX_CHARS` at a line end; texts under `MIN_CHARS` are left out, and so is every text
whose word 5-gram Jaccard with one kept before it reaches `DISTINCT_BELOW` (the definition of *distinct* the
issue measured with). Copies are made of distinct originals, a different original for each copy, one kind each:

- `rewrap`: the paragraphs re-filled at another width (`textwrap`);
- `punct_case`: typographic quotes, dashes and ellipses, and the whole text upper- or lower-cased;
- `header_footer`: a mirror's header line before and a site's footer after;
- `swap`: two pairs of neighbouring sentences (or lines) swapped;
- `noise3`: 3 % of the characters edited by nlpaug (`bench/independent_noise.py`, independent of the detector);
- `trunc85`: cut to 85 % of its length at a word end.

Seeded: the same seed gives the same corpus.
"""

from __future__ import annotations

import functools
import glob
import importlib
import inspect
import os
import pydoc
import random
import re
import sys
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KINDS = ("rewrap", "punct_case", "header_footer", "swap", "noise3", "trunc85")
MIN_CHARS, MAX_CHARS = 1000, 5000
DISTINCT_BELOW = 0.6
"""Word 5-gram Jaccard under which two texts count as distinct documents."""
MODULES = ("argparse", "asyncio", "collections", "concurrent.futures", "configparser", "csv", "datetime", "decimal",
           "email.message", "enum", "fractions", "ftplib", "http.client", "http.server", "imaplib", "ipaddress",
           "json", "logging", "logging.handlers", "mailbox", "multiprocessing", "optparse", "pathlib", "pickle",
           "poplib", "queue", "random", "smtplib", "socketserver", "sqlite3", "ssl", "string", "subprocess",
           "tarfile", "tempfile", "textwrap", "threading", "unittest", "urllib.request", "uuid", "xml.dom.minidom",
           "xml.etree.ElementTree", "zipfile", "zoneinfo")
"""Standard library modules whose classes' pydoc pages are the generated API documentation."""
CLIS = (("dagster._cli", "cli", "dagster"), ("ray.scripts.scripts", "cli", "ray"))
"""Click command lines whose every command's help page is a reference page."""


@dataclass(frozen=True)
class Document:
    family: str
    """`click`, `pydoc` or `licence`."""
    name: str
    text: str


@dataclass(frozen=True)
class TemplatedCorpus:
    distinct: list[Document]
    """The distinct documents, in order; `texts` begins with theirs."""
    texts: list[str]
    """Every text: the distinct documents', then the copies'."""
    copies: list[tuple[int, int, str]]
    """(original's index, copy's index, kind) into `texts`."""


@functools.cache
def help_pages() -> dict[str, str]:
    """Every visible command's `--help` page of the `CLIS`, by its command line."""
    import click

    pages: dict[str, str] = {}

    def walk(command: click.Command, path: str, parent: click.Context | None) -> None:
        context = click.Context(command, info_name=path.split()[-1], parent=parent)
        pages[path] = command.get_help(context)
        if isinstance(command, click.Group):
            for name in sorted(command.list_commands(context)):
                sub = command.get_command(context, name)
                if sub is not None and not sub.hidden:
                    walk(sub, f"{path} {name}", context)

    for module, attribute, name in CLIS:
        walk(getattr(importlib.import_module(module), attribute), name, None)
    return pages


@functools.cache
def api_pages() -> dict[str, str]:
    """pydoc's plain-text page of every public class defined in the `MODULES`."""
    pages = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MODULES:
            module = importlib.import_module(name)
            for class_name, value in sorted(vars(module).items()):
                if inspect.isclass(value) and value.__module__ == name and not class_name.startswith("_"):
                    pages[f"{name}.{class_name}"] = pydoc.render_doc(value, renderer=pydoc.plaintext)
    return pages


@functools.cache
def licence_headed_files() -> dict[str, str]:
    """JAX's source files that begin with the Apache licence header, by their path inside the package."""
    import jax

    root = Path(jax.__file__).parent
    found = {}
    for path in sorted(glob.glob(str(root / "_src" / "**" / "*.py"), recursive=True)):
        text = Path(path).read_text(encoding="utf-8")
        if "Licensed under the Apache License" in text[:1500]:
            found[os.path.relpath(path, root.parent)] = text
    return found


def _clipped(text: str) -> str | None:
    text = text.strip()
    if len(text) < MIN_CHARS:
        return None
    if len(text) > MAX_CHARS:
        end = text.rfind("\n", 0, MAX_CHARS)
        text = text[:end if end > MIN_CHARS else MAX_CHARS]
    return text


def _word_5grams(text: str) -> set[str]:
    words = text.split()
    return {" ".join(words[i:i + 5]) for i in range(max(len(words) - 4, 1))}


def distinct_documents(limit_per_family: int | None = None) -> list[Document]:
    """The real templated texts, clipped, without any near an earlier one (word 5-gram Jaccard >= `DISTINCT_BELOW`);
    at most `limit_per_family` of each family (spread over it), for a quicker corpus."""
    families = {"click": help_pages(), "pydoc": api_pages(), "licence": licence_headed_files()}
    candidates = []
    for family, pages in families.items():
        chosen = [Document(family, name, text) for name, page in sorted(pages.items())
                  if (text := _clipped(page)) is not None]
        if limit_per_family and len(chosen) > limit_per_family:
            step = len(chosen) / limit_per_family
            chosen = [chosen[int(i * step)] for i in range(limit_per_family)]
        candidates += chosen
    kept: list[Document] = []
    kept_grams: list[set[str]] = []
    for document in candidates:
        grams = _word_5grams(document.text)
        if all(len(grams & other) < DISTINCT_BELOW * len(grams | other) for other in kept_grams):
            kept.append(document)
            kept_grams.append(grams)
    return kept


def _rewrap(text: str, rng: random.Random) -> str:
    width = rng.choice([50, 60, 100])
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width) for p in re.split(r"\n\s*\n", text))


def _punct_case(text: str, rng: random.Random) -> str:
    text = text.replace("'", "\u2019").replace('"', "\u201d").replace(" - ", " \u2014 ").replace("...", "\u2026")
    return text.lower() if rng.random() < 0.5 else text.upper()


HEADERS = ("Archived copy, retrieved {date} from the project's documentation mirror.\n===\n",
           "From the internal wiki (page last edited {date}). This page is mirrored automatically; do not edit it"
           " here.\n\n")
FOOTERS = ("\n\n---\nCopyright the authors. Licensed under CC BY-SA 4.0. Report problems with this page on the issue"
           " tracker.", "\n\nWas this page helpful? Yes / No\nPrivacy policy | Terms of use | Contact us")


def _header_footer(text: str, rng: random.Random) -> str:
    date = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return rng.choice(HEADERS).format(date=date) + text + rng.choice(FOOTERS)


def _swap(text: str, rng: random.Random) -> str:
    parts = [p for p in re.split(r"(?<=[.!?:])\s+|\n", text) if p.strip()]
    for _ in range(2):
        if len(parts) > 3:
            i = rng.randrange(len(parts) - 1)
            parts[i], parts[i + 1] = parts[i + 1], parts[i]
    return "\n".join(parts)


def _truncated(text: str, rng: random.Random) -> str:
    cut = int(0.85 * len(text))
    space = text.rfind(" ", 0, cut)
    return text[:space if space > 0 else cut]


def _noisy(text: str, seed: int) -> str:
    bench = str(Path(__file__).resolve().parents[2] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from independent_noise import noisy_copy

    return noisy_copy(text, 0.03, seed).text


EDITS: dict[str, Callable[[str, random.Random], str]] = {
    "rewrap": _rewrap, "punct_case": _punct_case, "header_footer": _header_footer, "swap": _swap,
    "trunc85": _truncated}


def templated_corpus(per_kind: int, seed: int = 0, limit_per_family: int | None = None) -> TemplatedCorpus:
    """The distinct documents and `per_kind` copies of each kind, each of another original."""
    distinct = distinct_documents(limit_per_family)
    rng = random.Random(seed)
    if per_kind * len(KINDS) > len(distinct):
        raise ValueError(f"{per_kind} copies of {len(KINDS)} kinds need as many originals; there are {len(distinct)}")
    originals = rng.sample(range(len(distinct)), per_kind * len(KINDS))
    texts = [d.text for d in distinct]
    copies = []
    for k, kind in enumerate(KINDS):
        for n, original in enumerate(originals[k * per_kind:(k + 1) * per_kind]):
            text = texts[original]
            copy = _noisy(text, seed * 100_000 + k * 1000 + n) if kind == "noise3" else EDITS[kind](text, rng)
            texts.append(copy)
            copies.append((original, len(texts) - 1, kind))
    return TemplatedCorpus(distinct, texts, copies)


@dataclass(frozen=True)
class TemplatedScore:
    recall: dict[str, float]
    """Kind → fraction of its copies whose pair ends with exactly one text kept."""
    erased: list[Document]
    """Distinct documents of which nothing is left (neither the document nor its copy)."""
    distinct: int


def score(corpus: TemplatedCorpus, kept: dict[str, int], document_id: Callable[[str], str]) -> TemplatedScore:
    """`corpus` against `kept` (document id → how many times it remains)."""
    ids = [document_id(t) for t in corpus.texts]
    found: dict[str, list[bool]] = {}
    copy_of = {}
    for original, copy, kind in corpus.copies:
        found.setdefault(kind, []).append(kept.get(ids[original], 0) + kept.get(ids[copy], 0) == 1)
        copy_of[original] = copy
    erased = [d for i, d in enumerate(corpus.distinct)
              if kept.get(ids[i], 0) == 0 and (i not in copy_of or kept.get(ids[copy_of[i]], 0) == 0)]
    return TemplatedScore({k: sum(v) / len(v) for k, v in found.items()}, erased, len(corpus.distinct))
