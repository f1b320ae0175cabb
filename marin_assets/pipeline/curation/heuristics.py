"""Heuristic filters: the Gopher, C4 and FineWeb rules that remove documents no reader would want.

Every rule is a threshold in `HeuristicRules` (None turns it off) and has a stable name, the field's
name, which is the removal reason; a document failing several rules is removed for the first in field
order, and `counters` count every rule each document fails (`fails:{rule}`), so how rules overlap is
visible. The rules read a few counts per document:

- tokens are whitespace-separated; a *word* is a token holding a letter or digit (non-ASCII characters
  count as letters, as in `ngrams`); a word's length counts its letters and digits only;
- lines are split on `\\n` and blank lines are not counted: they separate paragraphs and are not
  content (Gopher and FineWeb count them, which penalizes well-spaced text); whitespace is ASCII's;
- the n-gram repetition rules read `ngrams.word_hashes` words (runs of letters and digits, lowercased)
  and measure characters as the UTF-8 bytes of those words (spaces and punctuation not counted, as
  RedPajama-V2 measures them); an n-gram repeats only within its document.

Documents are measured in batches of about a megabyte, in numpy over one byte buffer (tokens, lines,
character classes; the n-gram repeats sort each n-gram length once, only where the shorter n-gram
repeats); only duplicate lines and paragraphs are counted per document, with `collections.Counter`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.curation.ngrams import mix, word_hashes
from marin_assets.pipeline.curation.shards import list_shards
from marin_assets.pipeline.curation.stage import CurationResult, Verdicts, curation_step, filter_shards

STAGE = "heuristic_filter"
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
"""Gopher's stop words (Rae et al. 2021, appendix A.1.1)."""
BULLETS = "•‣◦▪●*-"
TERMINAL = ".!?\"'"
"""FineWeb's line-ending punctuation (datatrove `FineWebQualityFilter`)."""
C4_TERMINAL = ".!?\""
"""C4's terminal punctuation marks (Raffel et al. 2020, section 2.2)."""
SHORT_LINE = 30
"""FineWeb: a line of at most this many characters is short."""
MEASURES = "heuristics-v1"
"""Enters identity: how words, lines and repeats are counted (this module's docstring); change it with them."""
BATCH_CHARACTERS = 1 << 20
"""Documents are measured together in batches of about this many characters (numpy over one buffer)."""


@dataclass(frozen=True)
class HeuristicRules:
    """The rules, in the order a document's removal reason is chosen; None turns a rule off.

    Defaults follow the papers except where a rule removes a sizeable share of real documentation (our
    base text, which has code samples): those are off by default, and the field says why.
    """

    gopher_min_words: int | None = 50
    """Gopher (Rae et al. 2021, A.1.1): at least 50 words."""
    gopher_max_words: int | None = 100_000
    """Gopher: at most 100,000 words."""
    gopher_min_mean_word_length: float | None = 3.0
    """Gopher: mean word length at least 3 characters."""
    gopher_max_mean_word_length: float | None = 10.0
    """Gopher: mean word length at most 10 characters."""
    gopher_hash_ratio: float | None = 0.1
    """Gopher: '#' symbols per word at most 0.1."""
    gopher_ellipsis_ratio: float | None = 0.1
    """Gopher: ellipses ('...' or '…') per word at most 0.1."""
    gopher_bullet_lines: float | None = 0.9
    """Gopher: at most 90% of lines start with a bullet (• ‣ ◦ ▪ ● * -)."""
    gopher_ellipsis_lines: float | None = 0.3
    """Gopher: at most 30% of lines end with an ellipsis."""
    gopher_alpha_words: float | None = 0.8
    """Gopher: at least 80% of tokens hold an alphabetic character."""
    gopher_stop_words: int | None = 2
    """Gopher: at least 2 occurrences of the stop words `STOP_WORDS`."""
    gopher_dup_lines: float | None = 0.3
    """Gopher repetition (Rae et al. 2021, table A1): at most 30% of lines repeat an earlier line."""
    gopher_dup_line_chars: float | None = 0.2
    """Gopher repetition: at most 20% of the characters are in lines repeating an earlier line."""
    gopher_dup_paragraphs: float | None = 0.3
    """Gopher repetition: at most 30% of paragraphs (blank-line separated) repeat an earlier one."""
    gopher_dup_paragraph_chars: float | None = 0.2
    """Gopher repetition: at most 20% of the characters are in paragraphs repeating an earlier one."""
    gopher_top_2gram: float | None = 0.2
    """Gopher repetition: the most frequent repeated word 2-gram covers at most 20% of word characters."""
    gopher_top_3gram: float | None = 0.18
    """Gopher repetition: the most frequent repeated 3-gram covers at most 18%."""
    gopher_top_4gram: float | None = 0.16
    """Gopher repetition: the most frequent repeated 4-gram covers at most 16%."""
    gopher_dup_5gram: float | None = 0.15
    """Gopher repetition: word 5-grams repeating an earlier 5-gram of the document cover at most 15% of
    its word characters (each character counted once; the first occurrence is not a repeat, as in
    datatrove, which FineWeb used)."""
    gopher_dup_6gram: float | None = 0.14
    """Gopher repetition: duplicated 6-grams cover at most 14%."""
    gopher_dup_7gram: float | None = 0.13
    """Gopher repetition: duplicated 7-grams cover at most 13%."""
    gopher_dup_8gram: float | None = 0.12
    """Gopher repetition: duplicated 8-grams cover at most 12%."""
    gopher_dup_9gram: float | None = 0.11
    """Gopher repetition: duplicated 9-grams cover at most 11%."""
    gopher_dup_10gram: float | None = 0.10
    """Gopher repetition: duplicated 10-grams cover at most 10%."""
    c4_terminal_lines: int | None = None
    """C4 (Raffel et al. 2020, 2.2) keeps only lines of 3+ words ending in terminal punctuation (. ! ? ")
    and needs 5 sentences; here: at least this many such lines. Off by default: hard-wrapped
    documentation ends only a paragraph's last line in a period; at 5 it removed 58% of our real
    base documents (26% at 3)."""
    c4_lorem_ipsum: bool | None = True
    """C4: no "lorem ipsum" (any case)."""
    c4_curly_bracket: bool | None = None
    """C4: no '{' (C4's guard against code), when True. Off by default: it removes documentation with
    code samples (6.5% of our base documents), which code-aware curation keeps."""
    fineweb_line_punct: float | None = None
    """FineWeb (Penedo et al. 2024): more than this fraction of lines end in terminal punctuation
    (. ! ? " '), when set (FineWeb: 0.12). Off by default: argument lists, tables and hard-wrapped
    paragraphs end few lines in punctuation; it removed 11% of our base documents."""
    fineweb_short_lines: float | None = 0.67
    """FineWeb: fewer than 67% of lines have at most 30 characters."""
    fineweb_dup_line_chars: float | None = 0.1
    """FineWeb: less than 10% of the characters (newlines excluded) are in lines repeating an earlier
    line (the FineWeb paper's 0.1; datatrove's default is 0.01)."""
    digit_fraction: float | None = 0.3
    """Ours: at most 30% of non-whitespace characters (UTF-8 bytes) are ASCII digits. Catches number
    tables whose tokens carry a letter or a unit, so pass `gopher_alpha_words`; real prose and code
    stay far below."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if "bool" in str(f.type):
                if not isinstance(value, bool):
                    raise ValueError(f"{STAGE}: rule {f.name} is on (True) or off (None), got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{STAGE}: rule {f.name} must be a non-negative number or None, got {value!r}")


RULE_NAMES = tuple(f.name for f in dataclasses.fields(HeuristicRules))
"""Every rule's name, in the order a removal reason is chosen."""


@dataclass(frozen=True)
class HeuristicResult(CurationResult):
    """A heuristic filter's counts (removed per rule) and the rules it applied."""

    rules: HeuristicRules = field(default_factory=HeuristicRules)
    """The thresholds applied (None: the rule was off)."""
    failing: dict[str, int] = field(default_factory=dict)
    """Per rule: documents failing it, whether or not an earlier rule was their removal reason."""


# --- counts for many documents at once -----------------------------------------------------------

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


def _repetition(texts: Sequence[str], batch: _Batch, rules: HeuristicRules) -> dict[str, np.ndarray]:
    """Per document: stop-word occurrences, and the top/duplicated n-gram character fractions."""
    hashes, offsets = word_hashes(texts)
    edges = np.diff(np.concatenate([[False], _WORD_BYTE[batch.buf], [False]]).astype(np.int8))
    lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    if len(lengths) != len(hashes):  # lowercasing changed a word's bytes: measure the lowercased text
        lower = _Batch([t.lower() for t in texts])
        edges = np.diff(np.concatenate([[False], _WORD_BYTE[lower.buf], [False]]).astype(np.int8))
        lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    docs = len(texts)
    doc_of = np.repeat(np.arange(docs), np.diff(offsets))
    out = {"stop_words": np.bincount(doc_of, weights=np.isin(hashes, _STOP_HASHES), minlength=docs)}
    wanted = {n: getattr(rules, f"gopher_top_{n}gram") for n in (2, 3, 4)}
    wanted.update({n: getattr(rules, f"gopher_dup_{n}gram") for n in range(5, 11)})
    if all(v is None for v in wanted.values()):
        return out
    total = np.bincount(doc_of, weights=lengths, minlength=docs)
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
            out[f"gram_{n}"] = _ratio(covered_chars, total)
        candidates = np.sort(candidates[order[repeats]])
    return out


def _counts(texts: Sequence[str], rules: HeuristicRules) -> dict[str, np.ndarray]:
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
    c.update(_repetition(texts, batch, rules))
    return c


# --- the rules ---------------------------------------------------------------------------------

def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(len(a)), where=b > 0)


def failures(texts: Sequence[str], rules: HeuristicRules) -> dict[str, np.ndarray]:
    """For each enabled rule, in field order: which documents fail it (a bool per document).
    Documents are measured in batches of about `BATCH_CHARACTERS`, so memory stays flat."""
    enabled = [name for name in RULE_NAMES if getattr(rules, name) not in (None, False)]
    parts: list[dict[str, np.ndarray]] = []
    begin = size = 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= BATCH_CHARACTERS or i == len(texts) - 1:
            parts.append(_batch_failures(texts[begin:i + 1], rules))
            begin, size = i + 1, 0
    return {name: np.concatenate([p[name] for p in parts]) if parts else np.zeros(0, dtype=bool) for name in enabled}


def _batch_failures(texts: Sequence[str], rules: HeuristicRules) -> dict[str, np.ndarray]:
    c = _counts(texts, rules)
    words, lines = c["words"], c["lines"]
    mean_length = _ratio(c["word_chars"], words)
    failed: dict[str, np.ndarray] = {}
    for name in RULE_NAMES:
        t = getattr(rules, name)
        if t is None or t is False:
            continue
        if name == "gopher_min_words":
            fail = words < t
        elif name == "gopher_max_words":
            fail = words > t
        elif name == "gopher_min_mean_word_length":
            fail = mean_length < t
        elif name == "gopher_max_mean_word_length":
            fail = mean_length > t
        elif name == "gopher_hash_ratio":
            fail = _ratio(c["hashes"], words) > t
        elif name == "gopher_ellipsis_ratio":
            fail = _ratio(c["ellipses"], words) > t
        elif name == "gopher_bullet_lines":
            fail = _ratio(c["bullet_lines"], lines) > t
        elif name == "gopher_ellipsis_lines":
            fail = _ratio(c["ellipsis_lines"], lines) > t
        elif name == "gopher_alpha_words":
            fail = _ratio(c["tokens"] - c["no_letter_tokens"], c["tokens"]) < t
        elif name == "gopher_stop_words":
            fail = c["stop_words"] < t
        elif name == "gopher_dup_lines":
            fail = _ratio(c["dup_lines"], lines) > t
        elif name == "gopher_dup_line_chars":
            fail = _ratio(c["dup_line_chars"], c["chars"]) > t
        elif name == "gopher_dup_paragraphs":
            fail = _ratio(c["dup_paragraphs"], c["paragraphs"]) > t
        elif name == "gopher_dup_paragraph_chars":
            fail = _ratio(c["dup_paragraph_chars"], c["chars"]) > t
        elif name.startswith(("gopher_top_", "gopher_dup_")) and name.endswith("gram"):
            fail = c[f"gram_{int(name.rsplit('_', 1)[1][:-4])}"] > t
        elif name == "c4_terminal_lines":
            fail = c["c4_lines"] < t
        elif name == "c4_lorem_ipsum":
            fail = c["lorem_ipsum"] > 0
        elif name == "c4_curly_bracket":
            fail = c["curly_bracket"] > 0
        elif name == "fineweb_line_punct":
            fail = _ratio(c["punct_lines"], lines) <= t
        elif name == "fineweb_short_lines":
            fail = (_ratio(c["short_lines"], lines) >= t) & (lines > 0)
        elif name == "fineweb_dup_line_chars":
            fail = _ratio(c["dup_line_chars"], c["chars_without_newlines"]) >= t
        elif name == "digit_fraction":
            fail = _ratio(c["digits"], c["non_space_bytes"]) > t
        else:
            raise AssertionError(f"{STAGE}: rule {name} has no test")
        failed[name] = np.asarray(fail, dtype=bool)
    return failed


def first_failures(failed: dict[str, np.ndarray], documents: int) -> list[str | None]:
    """Per document: the first rule (in field order) it fails, or None to keep it."""
    if not failed:
        return [None] * documents
    names = list(failed)
    matrix = np.stack([failed[n] for n in names])
    first = matrix.argmax(axis=0)
    return [names[first[i]] if matrix[first[i], i] else None for i in range(documents)]


def failing_rule(text: str, rules: HeuristicRules = HeuristicRules()) -> str | None:
    """The first rule `text` fails, or None: what the filter decides for one document."""
    return first_failures(failures([text], rules), 1)[0]


def decide(rules: HeuristicRules, table: Any) -> Verdicts:
    """A shard's verdicts: each document's first failing rule; every failing rule counted."""
    texts = table.column("text").to_pylist()
    failed = failures(texts, rules)
    return Verdicts(first_failures(failed, len(texts)),
                    counters={f"fails:{n}": int(f.sum()) for n, f in failed.items()})


def heuristic_filter(output_path: str, dataset_path: str, rules: HeuristicRules = HeuristicRules(),
                     workers: int = 1) -> HeuristicResult:
    """Documents of a normalized dataset that pass every enabled heuristic rule (Gopher, C4, FineWeb)."""
    shards = list_shards(STAGE, dataset_path)
    summary = filter_shards(STAGE, output_path, shards, functools.partial(decide, rules), workers=workers)
    failing = {k.split(":", 1)[1]: v for k, v in summary["counters"].items() if k.startswith("fails:")}
    return HeuristicResult(**summary, rules=rules, failing=failing)


def heuristic_filter_step(name: str, dataset: Step, rules: HeuristicRules = HeuristicRules(), workers: int = 1,
                          max_removed_fraction: float = 0.5) -> Step:
    """`dataset` without the documents that fail a heuristic rule; every threshold is identity."""
    return curation_step(name, STAGE, lambda out: heuristic_filter(out, dataset.output_path, rules, workers),
                         dataset, {"rules": rules, "measures": MEASURES},
                         description=made_by(heuristic_filter), max_removed_fraction=max_removed_fraction, cpu=1)
