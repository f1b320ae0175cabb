"""The heuristic rules: each a named threshold (Gopher, C4, FineWeb and one of ours) and its test.

A rule's name is its `HeuristicRules` field and the removal reason; None turns it off. `rule_failures`
applies every enabled rule to counts measured per document (`heuristic_counts` says how words, lines
and repeats are counted); a rule added here needs its test in `rule_failures` and its count there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

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
    """Gopher repetition: the most frequent repeated word 2-gram's words hold at most 20% of the document's
    characters (`heuristic_counts` says how n-gram characters are counted)."""
    gopher_top_3gram: float | None = 0.18
    """Gopher repetition: the most frequent repeated 3-gram covers at most 18%."""
    gopher_top_4gram: float | None = 0.16
    """Gopher repetition: the most frequent repeated 4-gram covers at most 16%."""
    gopher_dup_5gram: float | None = 0.15
    """Gopher repetition: the words of word 5-grams repeating an earlier 5-gram of the document hold at most
    15% of its characters (each character counted once; the first occurrence is not a repeat, as in
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


def rule_failures(c: Mapping[str, np.ndarray], rules: HeuristicRules) -> dict[str, np.ndarray]:
    """For each enabled rule, in field order: which documents fail it, from their counts (`heuristic_counts`)."""
    words, lines = c["words"], c["lines"]
    mean_length = ratio(c["word_chars"], words)
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
            fail = ratio(c["hashes"], words) > t
        elif name == "gopher_ellipsis_ratio":
            fail = ratio(c["ellipses"], words) > t
        elif name == "gopher_bullet_lines":
            fail = ratio(c["bullet_lines"], lines) > t
        elif name == "gopher_ellipsis_lines":
            fail = ratio(c["ellipsis_lines"], lines) > t
        elif name == "gopher_alpha_words":
            fail = ratio(c["tokens"] - c["no_letter_tokens"], c["tokens"]) < t
        elif name == "gopher_stop_words":
            fail = c["stop_words"] < t
        elif name == "gopher_dup_lines":
            fail = ratio(c["dup_lines"], lines) > t
        elif name == "gopher_dup_line_chars":
            fail = ratio(c["dup_line_chars"], c["chars"]) > t
        elif name == "gopher_dup_paragraphs":
            fail = ratio(c["dup_paragraphs"], c["paragraphs"]) > t
        elif name == "gopher_dup_paragraph_chars":
            fail = ratio(c["dup_paragraph_chars"], c["chars"]) > t
        elif name.startswith(("gopher_top_", "gopher_dup_")) and name.endswith("gram"):
            fail = c[f"gram_{int(name.rsplit('_', 1)[1][:-4])}"] > t
        elif name == "c4_terminal_lines":
            fail = c["c4_lines"] < t
        elif name == "c4_lorem_ipsum":
            fail = c["lorem_ipsum"] > 0
        elif name == "c4_curly_bracket":
            fail = c["curly_bracket"] > 0
        elif name == "fineweb_line_punct":
            fail = ratio(c["punct_lines"], lines) <= t
        elif name == "fineweb_short_lines":
            fail = (ratio(c["short_lines"], lines) >= t) & (lines > 0)
        elif name == "fineweb_dup_line_chars":
            fail = ratio(c["dup_line_chars"], c["chars_without_newlines"]) >= t
        elif name == "digit_fraction":
            fail = ratio(c["digits"], c["non_space_bytes"]) > t
        else:
            raise AssertionError(f"{STAGE}: rule {name} has no test")
        failed[name] = np.asarray(fail, dtype=bool)
    return failed


def ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b per document, 0 where b is 0."""
    return np.divide(a, b, out=np.zeros(len(a)), where=b > 0)
