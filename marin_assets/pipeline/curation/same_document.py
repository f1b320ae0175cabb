"""Whether two texts are the same document as a person would say: one aligned against the other, word by word.

N-gram overlap cannot tell a copy with typos from a sibling page of the same template: a copy with 3 % of its
characters changed keeps fewer character 7-grams (Jaccard 0.57–0.73) than two reference pages of one tool that
differ in a name and a paragraph (up to 0.81), and two pages of one API's generated documentation can hold each
other's every window. What differs is *how* they differ, which an alignment shows: the copy's differences are
isolated words a character or two away from the original, a passage moved, or material added before or after
(a header, a footer) or missing at the end (truncation); the sibling page's are its own words inside the shared
text. So both texts are lower-cased with punctuation folded (`shingles.normalize_punctuation`: re-wrapped,
re-punctuated and re-cased copies become equal), their words aligned (`difflib.SequenceMatcher`, no junk
heuristic), and each word of the shorter text is

- *identical*: aligned to an equal word;
- *edited*: aligned to a word one character away (two for words of 5+ characters): a typo, an OCR error — unless
  the same change happens twice or more, which is a rename, not noise (then it is *differing*);
- *moved*: in a passage of `MOVED_RUN`+ words found elsewhere in the longer text (swapped sentences);
- *differing*: anything else.

The longer text's words that align to nothing and lie between its first and last aligned word are *added
inside*: a sibling page's own material, where a header or footer lies outside. `Comparison.same` holds when the
shorter text is at least `min_length_ratio` of the longer (a paragraph quoted in a long page is not its copy) and
both `differing` and `added_inside` stay within `max_different` of the shorter's words (`LIMITS`, measured on
templated reference text: the char path's docstring in `fuzzy_dedup`).
"""

from __future__ import annotations

import collections
import difflib
from dataclasses import asdict, dataclass

from marin_assets.pipeline.curation.shingles import normalize_punctuation

MOVED_RUN = 4
"""Words in a row that count as a moved passage when found in the other text."""
SHARED_BLOCK = 50
"""Identical words in a row that are text the two share verbatim (noise at 1 % of characters leaves fewer)."""
MIN_OWN = 40
"""The fewest words `Comparison.own_different` divides by."""
LIMITS = {"min_length_ratio": 0.7, "max_different": 0.09, "max_own_different": 0.3}
"""The shorter text's words over the longer's; differing and added-inside words over the shorter's, and over its
words not shared verbatim (`own_different`)."""
CLOSE = 0.15
"""Characters that may differ in a passage whose words were split or joined, over its characters."""
CLOSE_WORDS = 64
"""The longest passage (in words, either side) compared character by character: the comparison grows with the square
of its length."""
ALGORITHM = "aligned-words-v1"
"""What `compare` and `LIMITS` decide: enters the identity of a fuzzy dedup that aligns."""


@dataclass(frozen=True)
class Comparison:
    """How two texts differ, as fractions of the shorter text's words (the evidence kept per removed pair)."""

    words: int
    """Words of the shorter text (normalized)."""
    length_ratio: float
    """The shorter text's words over the longer's."""
    identical: float
    edited: float
    """Words one or two characters away from their aligned word, each change seen once (noise)."""
    moved: float
    differing: float
    """Words neither identical, edited nor moved, and renames (one change made twice or more)."""
    added_inside: float
    """The longer text's unaligned words between its first and last aligned word, over the shorter's words."""
    own_different: float
    """Differing and added-inside words over the shorter's words outside passages of `SHARED_BLOCK`+ identical
    words (at least `MIN_OWN`): what differs within what is not shared verbatim, however long the text the two
    share (a licence heading two different notes)."""

    def same(self, min_length_ratio: float = LIMITS["min_length_ratio"],
             max_different: float = LIMITS["max_different"],
             max_own_different: float = LIMITS["max_own_different"]) -> bool:
        return (self.length_ratio >= min_length_ratio and self.differing <= max_different
                and self.added_inside <= max_different and self.own_different <= max_own_different)

    def as_dict(self) -> dict[str, float]:
        return {k: round(float(v), 4) for k, v in asdict(self).items()}


def words_of(text: str) -> list[str]:
    """The text's words after `normalize_punctuation` (case and punctuation folded, whitespace collapsed)."""
    return normalize_punctuation([text])[0].split()


def _small_edit(a: str, b: str) -> bool:
    """Whether `b` is `a` with one character changed, inserted or deleted (two for words of 5+ characters)."""
    limit = 1 if len(a) <= 4 else 2
    if a == b or abs(len(a) - len(b)) > limit:
        return False
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > limit:
            return False
        previous = current
    return previous[-1] <= limit


def _close(mine: list[str], theirs: list[str]) -> bool:
    """Whether two passages are one another's characters with at most `CLOSE` of them edited (noise that split
    or joined words, so no word pairs with a word)."""
    if max(len(mine), len(theirs)) > CLOSE_WORDS:  # noise splits a word or two; a long passage is text of its own
        return False
    x, y = " ".join(mine), " ".join(theirs)
    if min(len(x), len(y)) < (1 - CLOSE) * max(len(x), len(y)):
        return False
    return difflib.SequenceMatcher(None, x, y, autojunk=False).ratio() >= 1 - CLOSE


def _inside(run: list[str], grams: set[tuple[str, ...]]) -> bool:
    """Whether `run` is a passage of `MOVED_RUN`+ words every `MOVED_RUN`-gram of which is in `grams`."""
    return len(run) >= MOVED_RUN and all(tuple(run[i:i + MOVED_RUN]) in grams
                                         for i in range(len(run) - MOVED_RUN + 1))


def _grams(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + MOVED_RUN]) for i in range(len(words) - MOVED_RUN + 1)}


def compare(text_a: str, text_b: str) -> Comparison:
    """How the shorter of two texts (in words) differs from the longer."""
    a, b = words_of(text_a), words_of(text_b)
    if len(a) > len(b):
        a, b = b, a
    if not a:
        return Comparison(0, 1.0 if not b else 0.0, 1.0 if not b else 0.0, 0.0, 0.0, 0.0 if not b else 1.0, 0.0,
                          0.0 if not b else 1.0)
    opcodes = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    aligned = [k for k, op in enumerate(opcodes) if op[0] == "equal"]
    identical = shared = 0
    changes: collections.Counter[tuple[str, str]] = collections.Counter()  # word → word, one character or two
    passages: collections.Counter[tuple[str, str]] = collections.Counter()  # words split or joined by noise
    passage_words: dict[tuple[str, str], int] = {}
    unaligned: list[list[str]] = []  # runs of the shorter text's words left unexplained so far
    added: list[list[str]] = []  # runs of the longer text's unaligned words inside the aligned span
    for k, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            identical += i2 - i1
            shared += i2 - i1 if i2 - i1 >= SHARED_BLOCK else 0
            continue
        mine, theirs = a[i1:i2], b[j1:j2]
        if aligned and aligned[0] < k < aligned[-1] and len(theirs) > len(mine):
            added.append(theirs)
        run: list[str] = []
        if tag == "replace" and len(mine) != len(theirs) and _close(mine, theirs):
            key = (" ".join(mine), " ".join(theirs))
            passages[key] += 1
            passage_words[key] = len(mine)
        elif tag == "replace" and abs(len(mine) - len(theirs)) <= max(1, len(mine) // 4):
            for x, y in zip(mine, theirs, strict=False):
                if _small_edit(x, y):
                    changes[(x, y)] += 1
                else:
                    run.append(x)
            run += mine[len(theirs):]
        else:
            run = list(mine)
        if run:
            unaligned.append(run)
    in_b, in_a = _grams(b), _grams(a)
    moved = sum(len(run) for run in unaligned if _inside(run, in_b))
    differing = sum(len(run) for run in unaligned if not _inside(run, in_b))
    renamed = sum(n for n in (*changes.values(), *passages.values()) if n >= 2)  # one change made twice: a rename
    edited = (sum(n for n in changes.values() if n < 2)
              + sum(passage_words[key] for key, n in passages.items() if n < 2))
    added_inside = sum(len(run) for run in added if not _inside(run, in_a))
    n = len(a)
    return Comparison(n, n / len(b), identical / n, edited / n, moved / n, (differing + renamed) / n,
                      added_inside / n, (differing + renamed + added_inside) / max(n - shared, MIN_OWN))
