"""How the heuristic rules measure a document: words, lines, characters and repeats, many documents at once.

- tokens are whitespace-separated; a *word* is a token holding a letter or digit (non-ASCII characters
  count as letters, as in `ngrams`); a word's length counts its letters and digits only;
- lines are split on `\\n` and blank lines are not counted: they separate paragraphs and are not
  content (Gopher and FineWeb count them, which penalizes well-spaced text); whitespace is ASCII's;
- the n-gram repetition rules read `ngrams.word_hashes` words (runs of letters and digits, lowercased);
  their character fractions are the characters of those words over all the document's characters, as
  datatrove (which FineWeb used) divides by the text's length: dividing by the words' characters alone
  (RedPajama-V2's denominator, whose numerator also counts first occurrences) made documentation with
  code, tables and indentation look more repetitive than prose (on CPython 3.12.1's documentation of 80+
  words the 5-gram rule failed 6.5% of documents that way, 3.2% this way); an n-gram repeats only within
  its document.

Documents are measured in batches, in numpy over one byte buffer (tokens, lines, character classes; the
n-gram repeats sort each n-gram length once, only where the shorter n-gram repeats); only duplicate lines
and paragraphs are counted per document, with `collections.Counter`. `counts` measures only what the
enabled rules read.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

import numpy as np

from marin_assets.pipeline.curation.heuristic_rules import (
    BULLETS,
    C4_TERMINAL,
    SHORT_LINE,
    STOP_WORDS,
    TERMINAL,
    HeuristicRules,
    ratio,
)
from marin_assets.pipeline.curation.ngrams import mix, word_hashes

MEASURES = "heuristics-v2"
"""Enters identity: how words, lines and repeats are counted (this module's docstring); change it with them."""

_SPACE = np.zeros(256, dtype=bool)
_SPACE[np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)] = True
_LETTER = np.zeros(256, dtype=bool)
_LETTER[np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)] = True
_LETTER[128:] = True
_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[np.frombuffer(b"0123456789", dtype=np.uint8)] = True
_WORD_BYTE = _LETTER | _DIGIT
"""What `ngrams` counts as a word's byte: ASCII letters and digits, and every non-ASCII byte."""
_CONTINUATION = np.zeros(256, dtype=bool)
_CONTINUATION[0x80:0xC0] = True
_TERMINAL = np.zeros(256, dtype=bool)
_TERMINAL[np.frombuffer(TERMINAL.encode(), dtype=np.uint8)] = True
_ASCII_BULLETS = np.frombuffer(b"*-", dtype=np.uint8)
_UTF8_BULLETS = [c.encode() for c in BULLETS if ord(c) > 127]
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\x0b\x0c]*\n\s*")
_BLANK = " \t\r\x0b\x0c"
_GRAM = np.uint64(0x9E3779B97F4A7C15)
_DOC = np.uint64(0xD6E8FEB86659FD93)
_STOP_HASHES = word_hashes([" ".join(STOP_WORDS)])[0]


def _duplicates(items: Sequence[str]) -> tuple[int, int]:
    """(items equal to an earlier item, their characters), blank items not counted."""
    repeats = chars = 0
    for item, n in collections.Counter(items).items():
        if n > 1 and item.strip(_BLANK):
            repeats += n - 1
            chars += (n - 1) * len(item)
    return repeats, chars


def _c4_lines(text: str) -> int:
    """Lines C4 keeps: 3+ words, ending in terminal punctuation but not an ellipsis."""
    kept = 0
    for line in text.split("\n"):
        line = line.strip()
        if line.endswith(tuple(C4_TERMINAL)) and not line.endswith("...") and len(line.split(None, 3)) >= 3:
            kept += 1
    return kept


class _Batch:
    """Byte-level counts of many documents, from one buffer (documents joined by newlines)."""

    def __init__(self, texts: Sequence[str]) -> None:
        encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
        self.docs = len(texts)
        self.start = np.zeros(self.docs + 1, dtype=np.int64)
        np.cumsum([len(e) + 1 for e in encoded], out=self.start[1:])
        self.padded = np.frombuffer(b"\n".join(encoded) + b"\n\0\0", dtype=np.uint8)
        """The buffer and two zero bytes, so a three-byte look-ahead never leaves it."""
        self.buf = self.padded[:-2]
        self.space = _SPACE[self.buf]

    def per_doc(self, mask: np.ndarray) -> np.ndarray:
        """Per document: how many of its bytes `mask` marks (never a separating newline)."""
        return np.add.reduceat(mask.view(np.uint8), self.start[:-1], dtype=np.int64).astype(np.float64)

    def tally(self, doc: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
        """Per document: how many items (of document `doc`, those `where` marks) it holds."""
        return np.bincount(doc if where is None else doc[where], minlength=self.docs).astype(np.float64)

    def tokens(self) -> dict[str, np.ndarray]:
        """Whitespace tokens: all, words (with a letter or digit), without a letter; word characters."""
        starts = np.flatnonzero(~self.space & np.concatenate([[True], self.space[:-1]]))
        doc = np.searchsorted(self.start, starts, side="right") - 1
        letters = np.logical_or.reduceat(_LETTER[self.buf], starts) if len(starts) else np.zeros(0, dtype=bool)
        digits = np.logical_or.reduceat(_DIGIT[self.buf], starts) if len(starts) else np.zeros(0, dtype=bool)
        return {"tokens": self.tally(doc), "words": self.tally(doc, letters | digits),
                "no_letter_tokens": self.tally(doc, ~letters),
                "word_chars": self.per_doc(_WORD_BYTE[self.buf] & ~_CONTINUATION[self.buf])}

    def lines(self, rules: HeuristicRules) -> dict[str, np.ndarray]:
        """Non-blank lines, and those starting with a bullet, ending with an ellipsis or terminal
        punctuation, or short."""
        newline = np.flatnonzero(self.buf == 10)
        begin = np.concatenate([[0], newline[:-1] + 1])
        solid = np.flatnonzero(~self.space)
        first_at = np.searchsorted(solid, begin)
        last_at = np.searchsorted(solid, newline) - 1
        nonblank = first_at <= last_at
        begin, end = begin[nonblank], newline[nonblank]
        first, last = solid[first_at[nonblank]], solid[last_at[nonblank]]
        doc = np.searchsorted(self.start, begin, side="right") - 1
        b = self.padded
        out = {"lines": self.tally(doc)}
        if rules.gopher_bullet_lines is not None:
            bullet = np.isin(b[first], _ASCII_BULLETS)
            for seq in _UTF8_BULLETS:
                bullet |= (b[first] == seq[0]) & (b[first + 1] == seq[1]) & (b[first + 2] == seq[2])
            out["bullet_lines"] = self.tally(doc, bullet)
        if rules.gopher_ellipsis_lines is not None:
            dots = (b[last] == 46) & (b[last - 1] == 46) & (b[last - 2] == 46) & (last - 2 >= begin)
            out["ellipsis_lines"] = self.tally(doc, dots | ((b[last] == 0xA6) & (b[last - 1] == 0x80)
                                                            & (b[last - 2] == 0xE2)))
        if rules.fineweb_line_punct is not None:
            out["punct_lines"] = self.tally(doc, _TERMINAL[b[last]])
        if rules.fineweb_short_lines is not None:
            continuation = np.concatenate([[0], np.cumsum(_CONTINUATION[self.buf], dtype=np.int64)])
            chars = (end - begin) - (continuation[end] - continuation[begin])
            out["short_lines"] = self.tally(doc, chars <= SHORT_LINE)
        return out


def _word_lengths(batch: _Batch) -> np.ndarray:
    """Characters of every word (a run of `_WORD_BYTE`) of the batch, in order."""
    edges = np.diff(np.concatenate([[False], _WORD_BYTE[batch.buf], [False]]).astype(np.int8))
    characters = np.concatenate([[0], np.cumsum(~_CONTINUATION[batch.buf], dtype=np.int64)])
    return characters[np.flatnonzero(edges == -1)] - characters[np.flatnonzero(edges == 1)]


def _repetition(texts: Sequence[str], batch: _Batch, rules: HeuristicRules, chars: np.ndarray) -> dict[str, np.ndarray]:
    """Per document: stop-word occurrences, and the top/duplicated n-gram character fractions (of `chars`,
    each document's characters)."""
    hashes, offsets = word_hashes(texts)
    lengths = _word_lengths(batch)
    if len(lengths) != len(hashes):  # lowercasing changed a word's bytes: measure the lowercased text
        lengths = _word_lengths(_Batch([t.lower() for t in texts]))
    docs = len(texts)
    doc_of = np.repeat(np.arange(docs), np.diff(offsets))
    out = {"stop_words": np.bincount(doc_of, weights=np.isin(hashes, _STOP_HASHES), minlength=docs)}
    wanted = {n: getattr(rules, f"gopher_top_{n}gram") for n in (2, 3, 4)}
    wanted.update({n: getattr(rules, f"gopher_dup_{n}gram") for n in range(5, 11)})
    if all(v is None for v in wanted.values()):
        return out
    total = chars
    prefix = np.concatenate([[0], np.cumsum(lengths)])
    word_end = offsets[doc_of + 1]
    doc_key = doc_of.astype(np.uint64) * _DOC
    grams = hashes
    candidates = np.arange(len(hashes))
    for n in range(2, max(n for n, v in wanted.items() if v is not None) + 1):
        with np.errstate(over="ignore"):
            grams = mix(grams[:-1] * _GRAM + hashes[n - 1:])
        # an n-gram repeats only where its (n-1)-gram prefix repeats: sort only those
        candidates = candidates[candidates + n <= word_end[candidates]]
        with np.errstate(over="ignore"):
            keys = grams[candidates] + doc_key[candidates]
        order = np.argsort(keys, kind="stable")  # equal n-grams in document order: the first is not a repeat
        sorted_keys = keys[order]
        new_run = np.ones(len(keys), dtype=bool)
        new_run[1:] = sorted_keys[1:] != sorted_keys[:-1]
        run_start = np.flatnonzero(new_run)
        run_count = np.diff(np.concatenate([run_start, [len(order)]]))
        repeats = np.repeat(run_count >= 2, run_count)
        if wanted[n] is not None:
            if n <= 4:  # the most frequent repeated n-gram (ties: the longest) × its occurrences
                first = candidates[order[run_start]]
                run_doc, run_chars = doc_of[first], prefix[first + n] - prefix[first]
                repeated = run_count >= 2
                top = np.zeros(docs, dtype=np.int64)
                np.maximum.at(top, run_doc[repeated], run_count[repeated])
                best = repeated & (run_count == top[run_doc])
                longest = np.zeros(docs, dtype=np.int64)
                np.maximum.at(longest, run_doc[best], run_chars[best])
                covered_chars = (top * longest).astype(np.float64)
            else:  # every word inside an n-gram repeating an earlier one, each counted once
                dup_starts = candidates[order[~new_run]]
                cover = np.zeros(len(hashes) + 1, dtype=np.int64)
                np.add.at(cover, dup_starts, 1)
                np.add.at(cover, dup_starts + n, -1)
                covered = np.cumsum(cover[:-1]) > 0
                covered_chars = np.bincount(doc_of, weights=lengths * covered, minlength=docs).astype(np.float64)
            out[f"gram_{n}"] = ratio(covered_chars, total)
        candidates = np.sort(candidates[order[repeats]])
    return out


def counts(texts: Sequence[str], rules: HeuristicRules) -> dict[str, np.ndarray]:
    """Everything the enabled rules read, one value per document."""
    batch = _Batch(texts)
    c = {**batch.tokens(), **batch.lines(rules)}
    c["chars"] = np.array([len(t) for t in texts], dtype=np.float64)
    c["hashes"] = np.array([t.count("#") for t in texts], dtype=np.float64)
    c["ellipses"] = np.array([t.count("...") + t.count("…") for t in texts], dtype=np.float64)
    if any(r is not None for r in (rules.gopher_dup_lines, rules.gopher_dup_line_chars, rules.fineweb_dup_line_chars)):
        c["dup_lines"], c["dup_line_chars"] = np.array([_duplicates(t.split("\n")) for t in texts],
                                                       dtype=np.float64).reshape(-1, 2).T
        c["chars_without_newlines"] = c["chars"] - np.array([t.count("\n") for t in texts])
    if rules.gopher_dup_paragraphs is not None or rules.gopher_dup_paragraph_chars is not None:
        paragraphs = [[p for p in _PARAGRAPH_BREAK.split(t.strip()) if p] for t in texts]
        c["paragraphs"] = np.array([len(p) for p in paragraphs], dtype=np.float64)
        c["dup_paragraphs"], c["dup_paragraph_chars"] = np.array([_duplicates(p) for p in paragraphs],
                                                                 dtype=np.float64).reshape(-1, 2).T
    if rules.c4_terminal_lines is not None:
        c["c4_lines"] = np.array([_c4_lines(t) for t in texts], dtype=np.float64)
    if rules.c4_lorem_ipsum:
        c["lorem_ipsum"] = np.array(["lorem ipsum" in t.lower() for t in texts], dtype=np.float64)
    if rules.c4_curly_bracket:
        c["curly_bracket"] = np.array(["{" in t for t in texts], dtype=np.float64)
    if rules.digit_fraction is not None:
        c["digits"] = batch.per_doc(_DIGIT[batch.buf])
        c["non_space_bytes"] = batch.per_doc(~batch.space)
    c.update(_repetition(texts, batch, rules, c["chars"]))
    return c
