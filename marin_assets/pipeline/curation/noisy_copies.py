"""Copies of real documents with character noise, and distinct documents sharing a long boilerplate:
what fuzzy dedup's character path is measured on (recall on the first, false removals on the second).

Noise (`add_noise`), at `rate` per non-space character, each edit one of four kinds drawn evenly: a
typo (a letter replaced by a neighbour on a QWERTY keyboard), an OCR confusion (`rn`→`m`, `l`→`1`,
`O`→`0`, `cl`→`d`, … or back), a dropped character, a doubled one. Word 5-grams lose most of their
overlap at a few percent (one edit every ~30 characters touches about every sixth word, and each
word sits in five 5-grams), character n-grams keep most of theirs.

Boilerplate (`boilerplate`): the running Python's own licence (`LICENSE.txt` of its standard
library, what the `license()` builtin prints), whole (~14 KB, longer than most documents it heads)
or its PSF licence agreement section (~2.5 KB, a header), put before documents that are otherwise
distinct: their Jaccard is high on the licence alone, but none is a copy of another.
"""

from __future__ import annotations

import os
import random
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass

from marin_assets.pipeline.curation.shards import document_id

RATES = (0.01, 0.02, 0.03, 0.05)
"""Fractions of characters edited in the noisy copies, in turn."""
PSF_SECTION = "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2"
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _keyboard_neighbours() -> dict[str, str]:
    """Each letter → the letters beside it on a QWERTY keyboard (same row, and the rows above and below)."""
    found = {}
    for r, row in enumerate(_ROWS):
        for i, letter in enumerate(row):
            near = [row[j] for j in (i - 1, i + 1) if 0 <= j < len(row)]
            near += [_ROWS[o][j] for o in (r - 1, r + 1) if 0 <= o < len(_ROWS) for j in (i - 1, i, i + 1)
                     if 0 <= j < len(_ROWS[o])]
            found[letter] = "".join(near)
    return found


_NEIGHBOURS = _keyboard_neighbours()
OCR = (("rn", "m"), ("m", "rn"), ("cl", "d"), ("d", "cl"), ("l", "1"), ("1", "l"), ("O", "0"), ("0", "O"),
       ("e", "c"), ("c", "e"), ("i", "l"), ("h", "b"), ("u", "v"), ("S", "5"), ("5", "S"), ("I", "l"))
"""OCR confusions: (read, misread)."""


class BoilerplateError(FileNotFoundError):
    """The running Python has no licence text to use as boilerplate."""


def add_noise(text: str, rate: float, rng: random.Random) -> str:
    """`text` with about `rate` of its non-space characters edited (typo, OCR confusion, dropped, doubled)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace() or rng.random() >= rate:
            out.append(char)
            i += 1
            continue
        kind = rng.randrange(4)
        if kind == 0:  # typo: a keyboard neighbour (a random letter for what has none)
            near = _NEIGHBOURS.get(char.lower(), "etaoinshrdlu")
            out.append(rng.choice(near))
        elif kind == 1:  # OCR: the first confusion that reads here, or a typo-like substitute
            read = next(((a, b) for a, b in OCR if text.startswith(a, i)), None)
            if read:
                out.append(read[1])
                i += len(read[0])
                continue
            out.append(rng.choice(_NEIGHBOURS.get(char.lower(), "etaoinshrdlu")))
        elif kind == 3:  # doubled
            out.append(char + char)
        i += 1  # kind 2: dropped
    return "".join(out)


def licence_text() -> str:
    """The running Python's licence (its standard library's `LICENSE.txt`)."""
    path = os.path.join(sysconfig.get_paths()["stdlib"], "LICENSE.txt")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise BoilerplateError(f"noisy_copies: this Python has no licence text at {path} to use as boilerplate"
                               ) from None


def boilerplate() -> dict[str, str]:
    """name → boilerplate text: the whole licence (`licence`) and its PSF agreement section (`header`)."""
    text = licence_text()
    start = text.find(PSF_SECTION)
    end = text.find("\n\n\n", start)
    if start < 0 or end < 0:
        raise BoilerplateError(f"noisy_copies: no {PSF_SECTION!r} section in this Python's licence")
    return {"licence": text, "header": text[start:end]}


@dataclass(frozen=True)
class NoisyCorpus:
    """Documents in order, and which of them are noisy copies and which carry boilerplate."""

    texts: list[str]
    """Originals first, then their noisy copies, then the distinct documents under boilerplate."""
    copies: list[tuple[str, str, float]]
    """(original id, copy id, rate): every copy comes after its original; one of the two should go."""
    distinct: list[tuple[str, str]]
    """(id, boilerplate name) of documents sharing only boilerplate: removing one is a false removal."""


def noisy_corpus(documents: Sequence[str], copies: int, with_boilerplate: int, seed: int = 0,
                 rates: Sequence[float] = RATES) -> NoisyCorpus:
    """The first `copies` documents each with a noisy copy (rates in turn), then the next `with_boilerplate`
    headed by a boilerplate (the whole licence and its PSF section in turn). `documents`: distinct real texts."""
    if len(documents) < copies + with_boilerplate:
        raise ValueError(f"noisy_copies: {copies} copies and {with_boilerplate} boilerplate documents need"
                         f" {copies + with_boilerplate} distinct documents, got {len(documents)}")
    rng = random.Random(f"noisy-copies:{seed}")
    originals = list(documents[:copies])
    noisy = [add_noise(text, rates[i % len(rates)], rng) for i, text in enumerate(originals)]
    kinds = boilerplate()
    names = sorted(kinds)
    headed = [(f"{kinds[names[i % len(names)]]}\n\n{text}", names[i % len(names)])
              for i, text in enumerate(documents[copies:copies + with_boilerplate])]
    return NoisyCorpus(
        originals + noisy + [text for text, _ in headed],
        [(document_id(a), document_id(b), rates[i % len(rates)])
         for i, (a, b) in enumerate(zip(originals, noisy, strict=True)) if a != b],
        [(document_id(text), name) for text, name in headed])


@dataclass(frozen=True)
class NoiseScore:
    """How a dedup did on a `NoisyCorpus`."""

    recall: float
    """Fraction of noisy copies with exactly one of the pair kept."""
    recall_by_rate: dict[str, float]
    """Noise rate (as text) → recall among its copies."""
    false_removals: float
    """Fraction of the distinct documents under boilerplate removed."""
    copies: int
    distinct: int


def score(corpus: NoisyCorpus, kept: dict[str, int]) -> NoiseScore:
    """`corpus` scored against `kept` (document id → how many times it remains)."""
    found: dict[str, list[bool]] = {}
    for original, copy, rate in corpus.copies:
        found.setdefault(str(rate), []).append(kept.get(original, 0) + kept.get(copy, 0) == 1)
    every = [f for fs in found.values() for f in fs]
    removed = [kept.get(doc, 0) == 0 for doc, _ in corpus.distinct]
    return NoiseScore(sum(every) / max(len(every), 1), {r: sum(fs) / len(fs) for r, fs in found.items()},
                      sum(removed) / max(len(removed), 1), len(every), len(removed))
