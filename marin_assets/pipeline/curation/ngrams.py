"""Word n-gram hashes of many documents at once, in numpy: what MinHash and decontamination read.

Text is lowercased; a word is a run of letters and digits (any non-ASCII byte counts as a letter,
so accented and non-Latin words stay whole); everything else separates words. Each word's
64-bit hash comes from a polynomial prefix hash over the UTF-8 bytes (wrapping uint64, so no
Python object per word), mixed by splitmix64; an n-gram's hash combines its words' hashes the
same way. Documents with fewer than `n` words get one hash of all their words; empty ones none.
The same text gives the same hashes on every machine and run (no seeds from the process).
`combine_ngrams` makes n-grams of any units' hashes (`shingles` uses it for character n-grams).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_P = np.uint64(0x100000001B3)  # odd, so invertible mod 2**64
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_Q = np.uint64(0x9E3779B97F4A7C15)
_WORD_BYTE = np.zeros(256, dtype=bool)
for _c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":
    _WORD_BYTE[_c] = True
_WORD_BYTE[128:] = True
_powers = {"p": np.ones(1, dtype=np.uint64), "inv": np.ones(1, dtype=np.uint64)}


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i (mod 2**64) for i < n, grown as needed and kept."""
    if len(_powers["p"]) < n:
        size = max(n, 2 * len(_powers["p"]))
        with np.errstate(over="ignore"):
            _powers["p"] = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _P, dtype=np.uint64))])
            _powers["inv"] = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _P_INV, dtype=np.uint64))])
    return _powers["p"][:n], _powers["inv"][:n]


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit moves every output bit."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every word, in order, uint64; offsets: document i's words are [offsets[i], offsets[i+1]))."""
    encoded = [t.lower().encode("utf-8", "surrogatepass") for t in texts]
    starts = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) + 1 for e in encoded], out=starts[1:])
    buf = np.frombuffer(b" ".join(encoded) + b" ", dtype=np.uint8)
    is_word = _WORD_BYTE[buf]
    edges = np.diff(np.concatenate([[False], is_word, [False]]).astype(np.int8))
    word_start = np.flatnonzero(edges == 1)
    word_end = np.flatnonzero(edges == -1)
    powers, inverse = _power_tables(len(buf) + 1)
    with np.errstate(over="ignore"):
        prefix = np.zeros(len(buf) + 1, dtype=np.uint64)
        np.cumsum(buf.astype(np.uint64) * powers[:len(buf)], out=prefix[1:])
        hashes = mix((prefix[word_end] - prefix[word_start]) * inverse[word_start] + (word_end - word_start)
                     .astype(np.uint64))
    offsets = np.searchsorted(word_start, starts, side="left").astype(np.int64)
    return hashes, offsets


def ngram_hashes(texts: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every word n-gram, uint64; offsets per document as in `word_hashes`)."""
    if n < 1:
        raise ValueError(f"n-gram size must be at least 1, got {n}")
    return combine_ngrams(*word_hashes(texts), n)


def combine_ngrams(words: np.ndarray, offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every n-gram of consecutive units, uint64; offsets per document) from the units' hashes
    (`words`, document i's units at [offsets[i], offsets[i+1])): words for `ngram_hashes`, characters for
    `shingles`. A document with fewer than `n` units gets one hash of all of them; an empty one none."""
    if n < 1:
        raise ValueError(f"n-gram size must be at least 1, got {n}")
    counts = np.diff(offsets)
    total = len(words)
    with np.errstate(over="ignore"):
        combined = np.zeros(max(total - n + 1, 0), dtype=np.uint64)
        for k in range(n):
            combined = combined * _Q + words[k:k + len(combined)]
        grams = mix(combined)
    per_doc = np.where(counts >= n, counts - n + 1, np.minimum(counts, 1))
    out_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(per_doc, out=out_offsets[1:])
    out = np.empty(out_offsets[-1], dtype=np.uint64)
    if len(combined):
        word_doc = np.repeat(np.arange(len(counts)), counts)[:len(combined)]
        valid = np.arange(len(combined)) + n <= offsets[word_doc + 1]
        out[np.repeat(counts >= n, per_doc)] = grams[valid]
    short = np.flatnonzero((counts > 0) & (counts < n))
    if len(short):  # h = sum of w_k * Q**(c-1-k) mod 2**64 (Horner's rule of the loop above), per document at once
        with np.errstate(over="ignore"):
            powers = np.concatenate([[np.uint64(1)], np.cumprod(np.full(max(n - 1, 1), _Q, dtype=np.uint64))])
            lengths = counts[short]
            ends = np.cumsum(lengths)
            index = np.repeat(offsets[short], lengths) + (np.arange(ends[-1]) - np.repeat(ends - lengths, lengths))
            exponent = np.repeat(offsets[short + 1], lengths) - 1 - index
            out[out_offsets[short]] = mix(np.add.reduceat(words[index] * powers[exponent],
                                                          np.concatenate([[0], ends[:-1]])))
    return out, out_offsets
