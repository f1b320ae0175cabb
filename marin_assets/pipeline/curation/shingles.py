"""Shingles for fuzzy dedup: word or character n-grams, with punctuation normalised first or not.

Word n-grams (`ngrams.ngram_hashes`) cannot see a copy with character noise: one typo every few
words changes most word 5-grams, while it changes only `n` character n-grams. Character n-grams
see such copies (Marin shingles characters too).

Punctuation normalisation (`normalize_punctuation`) lower-cases the text and turns every character
that is not a letter, a mark or a digit (Unicode categories L, M, N) into a space, runs of them into
one space, and strips both ends: curly quotes, dashes, ellipses, non-breaking spaces and other
non-ASCII punctuation no longer count as word letters (`ngrams` counts any non-ASCII byte as one),
and `don’t`, `don't` and `don t` read alike. Categories come from the running Python's `unicodedata`
(its Unicode version enters the identity of a step that normalises).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from marin_assets.pipeline.curation.ngrams import combine_ngrams, mix, ngram_hashes

UNITS = ("word", "char")
"""What a shingle counts in: words or characters (`fuzzy_dedup_step(shingles=…)`)."""
CHAR_NGRAMS = (3, 32)
"""Allowed character n-gram sizes: below 3 almost every text shares almost every n-gram with every other;
above 32 one typo hides a whole sentence's worth of them."""
NORMALIZATION = f"shingles.normalize_punctuation-v1-unicode-{unicodedata.unidata_version}"
"""What `normalize_punctuation` does, for identities: its rules and the Unicode version they read."""
_ASCII_WORD = np.zeros(128, dtype=bool)
for _c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":
    _ASCII_WORD[_c] = True
_categories: dict[int, bool] = {}
_CHAR_SALT = np.uint64(0xC6A4A7935BD1E995)
"""Added to a code point before mixing: mix(0) is 0."""


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _is_word(points: np.ndarray) -> np.ndarray:
    """Per code point: a letter, mark or digit (ASCII by table, the rest by `unicodedata`, each once)."""
    word = _ASCII_WORD[np.minimum(points, 127)]  # 127 (DEL) is not a word character
    others = np.flatnonzero(points >= 128)
    if len(others):
        distinct, where = np.unique(points[others], return_inverse=True)
        for point in distinct.tolist():
            if point not in _categories:
                _categories[point] = unicodedata.category(chr(point))[0] in "LMN"
        word[others] = np.array([_categories[p] for p in distinct.tolist()], dtype=bool)[where]
    return word


def normalize_punctuation(texts: Sequence[str]) -> list[str]:
    """Each text lower-cased, every run of characters that are not letters, marks or digits made one space,
    both ends stripped: `“Don’t” — he said…` → `don t he said`."""
    lowered = [t.lower() for t in texts]
    points = _codepoints("\0".join(lowered) + "\0")  # a NUL (not a word character) ends each text
    ends = np.cumsum([len(t) + 1 for t in lowered], dtype=np.int64) - 1  # where those NULs are
    word = _is_word(points)
    runs = np.flatnonzero(word[1:] & ~word[:-1]) + 1  # where a word starts (the first character cannot: no text)
    if word[0]:
        runs = np.concatenate([[0], runs])
    doc = np.searchsorted(ends, runs)
    later = runs[1:][doc[1:] == doc[:-1]]  # a word after another in the same text: one space before it
    keep = word.copy()
    keep[later - 1] = True
    values = points.copy()
    values[later - 1] = 32
    text = values[keep].tobytes().decode("utf-32-le", "surrogatepass")
    bounds = np.concatenate([[0], np.cumsum(keep)[ends]]).tolist()
    return [text[bounds[i]:bounds[i + 1]] for i in range(len(texts))]


def char_ngram_hashes(texts: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every character n-gram, uint64; offsets: document i's at [offsets[i], offsets[i+1])). The
    characters are taken as they are (normalise first); a text shorter than `n` gets one hash of all of it."""
    points = _codepoints("".join(texts)).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
    with np.errstate(over="ignore"):
        units = mix(points + _CHAR_SALT)
    return combine_ngrams(units, offsets, n)


@dataclass(frozen=True)
class Shingling:
    """How a document becomes the set of n-gram hashes that MinHash signs and verification compares."""

    unit: str
    """`word` (runs of letters and digits, as `ngrams` counts them) or `char` (characters, spaces included)."""
    n: int
    """Units per n-gram."""
    normalize: bool
    """`normalize_punctuation` first (a `char` shingling without it reads the lower-cased text as it is)."""

    def hashes(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(every n-gram hash of every text, in order; offsets per text)."""
        if self.normalize:
            texts = normalize_punctuation(texts)
        if self.unit == "word":
            return ngram_hashes(texts, self.n)
        if self.unit == "char":
            return char_ngram_hashes(texts if self.normalize else [t.lower() for t in texts], self.n)
        raise ValueError(f"shingles must be one of {', '.join(UNITS)}, got {self.unit!r}")
