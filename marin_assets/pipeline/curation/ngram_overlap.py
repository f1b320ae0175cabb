"""Train–test overlap: which evaluation examples share a word n-gram with a training dataset.

Marin's `train_test_overlap` measures, for each evaluation set and each training dataset, the fraction of
evaluation examples with at least one n-gram (15 words by default) in the training text, and the same against
all training datasets together (the union). This is that measurement, on decontamination's words and hashes
(`ngrams`: lowercased runs of letters and digits, 64-bit hashes the same on every machine; `eval_index.
hash_in_chunks` to bound memory): the evaluation side is small, so all its n-grams are held in one sorted
array with, per n-gram, the example and word it starts at; the training side is streamed in chunks of
documents, each chunk's n-grams looked up at once (`np.searchsorted`) and every match confirmed exactly.

An example with fewer than n words is checked whole, as Marin does (`min(n, words)`): a training document
then has to hold all its words in order. A training document shorter than that length is compared whole
too (the hashes agree: `ngram_hashes` gives a short document the hash of all its words).

Unlike decontamination, which asks whether a training paragraph is mostly evaluation text, this asks whether
an evaluation example appears at all: one shared n-gram is a hit, and every example sharing it is hit.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marin_assets.pipeline.curation.eval_index import CHUNK_CHARACTERS, hash_in_chunks
from marin_assets.pipeline.curation.ngrams import word_hashes
from marin_assets.pipeline.data.readers import DatasetError, iter_documents, iter_records

DEFAULT_NGRAM = 15
"""Marin's train–test overlap n-gram (`train_test_total.py`, `aggregate_total.py`: 15 words); decontamination
uses 13 (`decontaminate.py`)."""
READERS = ("text", "conversations")
"""How a training dataset's records become text: a text field (`text_field`), or the turns of conversations."""
CONVERSATION_FIELDS = ("messages", "conversations", "prompt", "chosen", "rejected")
"""Fields of a conversation record whose turns (`content` or ShareGPT `value`) are its text: chat data, and
preference pairs (both sides: DPO trains on the chosen and the rejected answer)."""
UNION = "union"
"""The matrix's column for all training datasets together."""
_WORD = re.compile(r"[0-9a-z\u0080-\U0010ffff]+")
"""A word as `ngrams` hashes one, on lowercased text: ASCII letters and digits, and any non-ASCII character
(whose UTF-8 bytes are all word bytes there)."""


class OverlapError(ValueError):
    """An evaluation set or training dataset that cannot be measured: no examples, no files, unreadable rows."""


@dataclass(frozen=True)
class EvalExamples:
    """An evaluation set's examples as text, each with an id a person can find it by."""

    name: str
    ids: tuple[str, ...]
    """Per example: lm-eval's `doc_id`, or `file:line` of a data file."""
    texts: tuple[str, ...]
    source: str = ""
    """Where the examples come from, in words (the task's YAML, the files)."""


@dataclass(frozen=True)
class TrainText:
    """A training dataset as files, and how to read its text."""

    name: str
    files: tuple[str, ...]
    reader: str = "text"
    """One of `READERS`."""
    text_field: str = "text"
    text_format: str = "auto"


@dataclass(frozen=True)
class OverlapHit:
    """One evaluation example found in one training dataset: the n-gram and the training document holding it."""

    eval_set: str
    example: str
    """The example's id."""
    train: str
    """The training dataset."""
    ngram: str
    """The shared words, as the example writes them."""
    words: int
    """Their number: n, or fewer for an example shorter than n (checked whole)."""
    file: str
    line: int
    """The training document's line or row (from 1) in `file`."""


@dataclass(frozen=True)
class TrainScan:
    """What was read of one training dataset."""

    files: int
    documents: int
    characters: int


@dataclass(frozen=True)
class Overlap:
    """Per evaluation set and training dataset, the examples with at least one shared n-gram."""

    ngram: int
    examples: dict[str, int]
    """Examples per evaluation set (every one counts, short or not)."""
    short_examples: dict[str, int]
    """Examples with fewer than `ngram` words (checked whole), per evaluation set."""
    hit: dict[str, dict[str, list[str]]]
    """Evaluation set → training dataset → ids of the examples it holds, in example order."""
    union: dict[str, list[str]]
    """Evaluation set → ids of the examples some training dataset holds."""
    hits: list[OverlapHit]
    """One match per (evaluation set, training dataset, example) hit."""
    scanned: dict[str, TrainScan]
    eval_sources: dict[str, str] = field(default_factory=dict)

    def fraction(self, eval_set: str, train: str = UNION) -> float:
        """The share of `eval_set`'s examples that `train` (or, by default, any training dataset) holds."""
        found = self.union[eval_set] if train == UNION else self.hit[eval_set][train]
        return len(found) / self.examples[eval_set]

    def matrix(self) -> dict[str, dict[str, float]]:
        """Evaluation set → {training dataset: fraction, …, "union": fraction}: Marin's overlap matrix."""
        return {e: {**{t: self.fraction(e, t) for t in self.scanned}, UNION: self.fraction(e)} for e in self.examples}


@dataclass
class _Index:
    """Every n-gram of every evaluation example, sorted by hash."""

    hashes: np.ndarray
    example: np.ndarray
    """Per n-gram: the example (index into all examples, sets in order)."""
    start: np.ndarray
    """Per n-gram: the word it starts at in its example."""
    length: np.ndarray
    """Per n-gram: its words (n, or the whole of a shorter example)."""
    lengths: list[int]
    """The n-gram lengths present: each is one hashing pass over the training text."""


def _problem(eval_sets: Sequence[EvalExamples], train: Sequence[TrainText], ngram: int) -> str | None:
    if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 1:
        return f"the n-gram size must be a positive integer, got {ngram!r}"
    if not eval_sets:
        return "no evaluation sets"
    if not train:
        return "no training datasets"
    for what, names in (("evaluation set", [e.name for e in eval_sets]), ("training dataset", [t.name for t in train])):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            return f"two {what}s are named {repeated[0]!r}"
    if UNION in (t.name for t in train):
        return f"a training dataset is named {UNION!r}, the matrix's column for all of them"
    bad = [t for t in train if t.reader not in READERS]
    if bad:
        return f"training dataset {bad[0].name!r}: reader {bad[0].reader!r} is not one of {', '.join(READERS)}"
    for e in eval_sets:
        if len(e.ids) != len(e.texts):
            return f"evaluation set {e.name!r} has {len(e.ids)} ids for {len(e.texts)} examples"
        if not e.texts:
            return f"evaluation set {e.name!r} has no examples{f' ({e.source})' if e.source else ''}"
    return None


def _index(eval_sets: Sequence[EvalExamples], ngram: int) -> tuple[_Index, np.ndarray]:
    """The sorted n-gram index of all examples, and each example's word count."""
    texts = [t for e in eval_sets for t in e.texts]
    _, word_offsets = word_hashes(texts)
    words = np.diff(word_offsets)
    first = 0
    for e in eval_sets:
        if not words[first:first + len(e.texts)].any():
            raise OverlapError(f"evaluation set {e.name!r}: not one of its {len(e.texts)} examples has a word"
                               f"{f' ({e.source})' if e.source else ''}")
        first += len(e.texts)
    grams, offsets = hash_in_chunks(texts, ngram)
    example = np.repeat(np.arange(len(texts)), np.diff(offsets))
    start = np.arange(len(grams)) - offsets[example]
    length = np.minimum(words, ngram)[example]
    order = np.argsort(grams, kind="stable")
    index = _Index(grams[order], example[order], start[order], length[order], sorted(set(length.tolist())))
    return index, words


def _conversation_text(record: Mapping[str, Any]) -> str:
    """A conversation record's turns, one after another: what chat and preference training read."""
    parts: list[str] = []
    for key in CONVERSATION_FIELDS:
        value = record.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            for turn in value:
                text = turn.get("content", turn.get("value")) if isinstance(turn, dict) else None
                if isinstance(text, str):
                    parts.append(text)
    return "\n".join(parts)


def read_documents(train: TrainText) -> Iterator[tuple[str, int, str]]:
    """(file, line or row, text) of every document of a dataset, read as `train.reader` says."""
    if train.reader == "text":
        yield from iter_documents(train.files, train.text_field, train.text_format)
        return
    for file in train.files:
        for numbers, records in iter_records(file, CONVERSATION_FIELDS, train.text_format):
            for number, record in zip(numbers, records, strict=True):
                yield file, number, _conversation_text(record)


def _chunks(train: TrainText) -> Iterator[tuple[list[str], list[int], list[str]]]:
    """The training documents in chunks of about `CHUNK_CHARACTERS`: (files, lines, texts)."""
    files: list[str] = []
    lines: list[int] = []
    texts: list[str] = []
    size = 0
    for file, line, text in read_documents(train):
        files.append(file)
        lines.append(line)
        texts.append(text)
        size += len(text)
        if size >= CHUNK_CHARACTERS:
            yield files, lines, texts
            files, lines, texts, size = [], [], [], 0
    if texts:
        yield files, lines, texts


def _ngram_text(text: str, start: int, length: int) -> str:
    """Words `start` … `start + length - 1` of an example, as the example writes them."""
    lowered = text.lower()
    spans = [m.span() for m in _WORD.finditer(lowered)][start:start + length]
    if not spans:
        return ""
    shown = text if len(lowered) == len(text) else lowered
    return shown[spans[0][0]:spans[-1][1]]


def _scan(train: TrainText, index: _Index, hit: np.ndarray, found: list[tuple[int, int, int, str, int]]) -> TrainScan:
    """Stream one training dataset's documents against the index; mark each example it holds in `hit` and
    append (example, start, length, file, line) of its first match to `found`."""
    documents = characters = 0
    for files, lines, texts in _chunks(train):
        documents += len(texts)
        characters += sum(map(len, texts))
        for length in index.lengths:
            if hit.all():
                break
            grams, offsets = hash_in_chunks(texts, length)
            at = np.minimum(np.searchsorted(index.hashes, grams), len(index.hashes) - 1)
            matched = np.flatnonzero(index.hashes[at] == grams)
            if not len(matched):
                continue
            values, first = np.unique(grams[matched], return_index=True)
            document = np.searchsorted(offsets, matched[first], side="right") - 1
            low = np.searchsorted(index.hashes, values, side="left")
            counts = np.searchsorted(index.hashes, values, side="right") - low
            entries = np.repeat(low, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            in_document = np.repeat(document, counts)
            # an n-gram of `length` words matches only entries of that length (a shorter training document's
            # whole-document hash is looked up again in the pass of its own length)
            keep = (index.length[entries] == length) & ~hit[index.example[entries]]
            entries, in_document = entries[keep], in_document[keep]
            order = np.lexsort((index.start[entries], index.example[entries]))  # each example's earliest n-gram
            entries, in_document = entries[order], in_document[order]
            examples, first_entry = np.unique(index.example[entries], return_index=True)
            for example, e, d in zip(examples.tolist(), entries[first_entry].tolist(),
                                     in_document[first_entry].tolist(), strict=True):
                hit[example] = True
                found.append((example, int(index.start[e]), length, files[d], lines[d]))
    return TrainScan(len(train.files), documents, characters)


def ngram_overlap(eval_sets: Sequence[EvalExamples], train: Sequence[TrainText],
                  ngram: int = DEFAULT_NGRAM) -> Overlap:
    """For each evaluation set and training dataset, the examples sharing at least one `ngram`-word n-gram with
    the dataset's text (examples shorter than `ngram` words: all their words), and the union over datasets.

    An evaluation set without examples, or whose examples hold no word, a training dataset without files or
    documents, and an unreadable file or row are `OverlapError`s naming the set or dataset (and file and row)."""
    problem = _problem(eval_sets, train, ngram)
    if problem:
        raise OverlapError(problem)
    index, words = _index(eval_sets, ngram)
    owners = [(e, i) for e in eval_sets for i in range(len(e.texts))]
    texts = [t for e in eval_sets for t in e.texts]
    hits: list[OverlapHit] = []
    hit: dict[str, dict[str, list[str]]] = {e.name: {} for e in eval_sets}
    any_hit = np.zeros(len(texts), dtype=bool)
    scanned: dict[str, TrainScan] = {}
    for t in train:
        if not t.files:
            raise OverlapError(f"training dataset {t.name!r} has no files")
        held = np.zeros(len(texts), dtype=bool)
        found: list[tuple[int, int, int, str, int]] = []
        try:
            scanned[t.name] = _scan(t, index, held, found)
        except DatasetError as error:
            raise OverlapError(f"training dataset {t.name!r}: {error}") from None
        except FileNotFoundError as error:
            raise OverlapError(f"training dataset {t.name!r}: {error.filename or error} does not exist") from None
        if not scanned[t.name].documents:
            raise OverlapError(f"training dataset {t.name!r} has no documents in its {len(t.files)} files"
                               f" ({', '.join(t.files[:3])}{', …' if len(t.files) > 3 else ''})")
        any_hit |= held
        for s in eval_sets:
            hit[s.name][t.name] = []
        for example in np.flatnonzero(held).tolist():
            s, i = owners[example]
            hit[s.name][t.name].append(s.ids[i])
        for example, start, length, file, line in sorted(found):
            s, i = owners[example]
            hits.append(OverlapHit(s.name, s.ids[i], t.name, _ngram_text(texts[example], start, length), length,
                                   file, line))
    union: dict[str, list[str]] = {s.name: [] for s in eval_sets}
    for example in np.flatnonzero(any_hit).tolist():
        s, i = owners[example]
        union[s.name].append(s.ids[i])
    first = 0
    short = {}
    for s in eval_sets:
        short[s.name] = int((words[first:first + len(s.texts)] < ngram).sum())
        first += len(s.texts)
    return Overlap(ngram, {e.name: len(e.texts) for e in eval_sets}, short, hit, union, hits, scanned,
                   {e.name: e.source for e in eval_sets})


__all__ = ["CONVERSATION_FIELDS", "DEFAULT_NGRAM", "READERS", "UNION", "EvalExamples", "Overlap", "OverlapError",
           "OverlapHit", "TrainScan", "TrainText", "ngram_overlap", "read_documents"]
