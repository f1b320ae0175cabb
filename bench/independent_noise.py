"""Character noise made independently of the detector it tests: nlpaug's character augmenters, not the project's
`noisy_copies.add_noise` (written beside fuzzy dedup, by the same hands, with the same idea of noise).

A copy of a document gets `round(rate × its non-space characters)` edits, each in a different word (2+
characters) drawn uniformly at random, made by one of nlpaug's augmenters in turn: a keyboard typo (`KeyboardAug`:
nlpaug's own QWERTY neighbour map, which also has `u` → ` t`), an OCR confusion (`OcrAug`: its own confusion
table), a deleted character and an inserted random character (`RandomCharAug`). Each augmenter is given the one
word and edits one character of it (a word it cannot edit, say with no OCR-confusable letter, stays as it is).
nlpaug is handed single words, not the document: it strips, re-tokenizes and re-joins what it augments (its
default tokenizer would rewrite the layout of code), and picks words with list scans that grow with the square
of a document's length. Where its edits landed is counted (`NoisyCopy.edits`, Levenshtein per word), so the rate
reached is reported, not assumed. Seeded (the word choice by its own generator; nlpaug draws from Python's and
NumPy's global ones, seeded per copy): the same documents give the same copies.

Only the noise is independent: the corpus's shape (`NoisyCorpus`: originals, their copies, then documents headed
by Python's licence) and its scoring come from `noisy_copies`, so the rows read as before.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

RATES = (0.01, 0.02, 0.03, 0.05)
"""Fractions of characters edited in the noisy copies, in turn (as `noisy_copies.RATES`)."""
MIN_CHAR = 2
"""Words shorter than this are never edited."""
_WHITESPACE = re.compile(r"(\s+)")


@dataclass(frozen=True)
class NoisyCopy:
    text: str
    edits: int
    """Characters inserted, deleted or replaced (Levenshtein distance, word by word)."""
    rate: float
    """`edits` ÷ the original's non-space characters."""


def _one_token(word: str) -> list[str]:
    """The word as nlpaug's one token (its own tokenizer splits at punctuation and re-joins with spaces)."""
    return [word]


@functools.cache
def augmenters() -> tuple[Any, ...]:
    """nlpaug's four character augmenters, each editing one character of the one word it is given."""
    import nlpaug.augmenter.char as nac

    one = dict(aug_word_p=1.0, aug_word_min=1, aug_word_max=1, aug_char_p=1e-9, aug_char_min=1, aug_char_max=1,
               min_char=MIN_CHAR, tokenizer=_one_token, reverse_tokenizer="".join)
    return (nac.KeyboardAug(**one), nac.OcrAug(**one), nac.RandomCharAug(action="delete", **one),
            nac.RandomCharAug(action="insert", **one))


def levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def noisy_copy(text: str, rate: float, seed: int) -> NoisyCopy:
    """`text` with `round(rate × non-space characters)` words edited once each by nlpaug (typo, OCR, deletion,
    insertion in turn)."""
    import numpy as np

    tokens = _WHITESPACE.split(text)  # words at even positions, whitespace between
    words = [i for i in range(0, len(tokens), 2) if len(tokens[i]) >= MIN_CHAR]
    nonspace = sum(len(tokens[i]) for i in range(0, len(tokens), 2))
    chosen = random.Random(f"independent-noise:{seed}").sample(words, min(len(words), round(rate * nonspace)))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    edits = 0
    for k, i in enumerate(chosen):
        augmented = augmenters()[k % 4].augment(tokens[i])
        word = augmented[0] if isinstance(augmented, list) else augmented
        edits += levenshtein(tokens[i], word)
        tokens[i] = word
    return NoisyCopy("".join(tokens), edits, edits / max(1, nonspace))


def noisy_corpus(documents: Sequence[str], copies: int, with_boilerplate: int, seed: int = 0,
                 rates: Sequence[float] = RATES) -> tuple[Any, dict[float, float]]:
    """As `noisy_copies.noisy_corpus` (same shape, same boilerplate), the copies made by `noisy_copy`; and for each
    nominal rate, the mean rate its copies reached."""
    from marin_assets.pipeline.curation.noisy_copies import NoisyCorpus, boilerplate
    from marin_assets.pipeline.curation.shards import document_id

    if len(documents) < copies + with_boilerplate:
        raise ValueError(f"{copies} copies and {with_boilerplate} boilerplate documents need"
                         f" {copies + with_boilerplate} distinct documents, got {len(documents)}")
    originals = list(documents[:copies])
    made = [noisy_copy(text, rates[i % len(rates)], seed * 1_000_003 + i) for i, text in enumerate(originals)]
    noisy = [m.text for m in made]
    kinds = boilerplate()
    names = sorted(kinds)
    headed = [(f"{kinds[names[i % len(names)]]}\n\n{text}", names[i % len(names)])
              for i, text in enumerate(documents[copies:copies + with_boilerplate])]
    corpus = NoisyCorpus(
        originals + noisy + [text for text, _ in headed],
        [(document_id(a), document_id(b), rates[i % len(rates)])
         for i, (a, b) in enumerate(zip(originals, noisy, strict=True)) if a != b],
        [(document_id(text), name) for text, name in headed])
    reached: dict[float, list[float]] = {}
    for i, m in enumerate(made):
        reached.setdefault(rates[i % len(rates)], []).append(m.rate)
    return corpus, {r: sum(v) / len(v) for r, v in reached.items()}
