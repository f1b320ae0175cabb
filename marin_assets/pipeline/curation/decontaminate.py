"""decontaminate: take out text that overlaps evaluation sets, so a model is not trained on its own exam.

As in Marin: word n-grams (13 by default, `ngrams`), and a paragraph (the text between two
`paragraph_separator`s, a line by default, as Marin splits) is contaminated when at least `threshold` of
its n-grams occur in an evaluation set: in the index of every evaluation set's n-grams (`eval_index`: a
Bloom filter whose every hit is confirmed exactly, each n-gram traced to its record), built once by the
filter's `prepare`.

Re-wrapped text (`across_paragraphs`, on by default): a paragraph of fewer than `ngram` words has no
n-gram of its own, so an evaluation paragraph hard-wrapped into short lines would pass line by line. Such
a paragraph is also contaminated when at least `threshold` of its words lie inside evaluation n-grams of
the document's whole word stream, n-grams that run across its breaks (the index hashes records whole, line
breaks and all). A paragraph with n-grams of its own is judged on them alone, as before, so the unit
removed stays the line: measured on the standard library's documentation, blank-line paragraphs (the other
way to see across lines) caught 8 of 20 planted one-line evaluation paragraphs and took 705 characters of
their carriers with them; this catches all 20, and every line holding a word of evaluation paragraphs
re-wrapped at 20–100 columns, trailing spaces and CRLF included. Off, the step's identity and output are
what they were.

Per shard (resumable, fanned out), by `mode`: `remove_paragraph` drops contaminated paragraphs (a
document left empty is removed), `remove_document` drops the document, `mark` keeps everything and
adds `contaminated_by` (the sets' names, comma-joined; "" when clean). The reason is the set that
matched most of the paragraph's n-grams. Every contaminated paragraph is listed, for people to read,
in `{output}/contamination/{split}-NNNNN.parquet` (one per shard, beside the splits: not a split).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.eval_index import (
    INDEX_PHASE,
    STAGE,
    Index,
    build_index,
    chunk_bounds,
    confirmed,
    found_exactly,
    index_params,
    load_index,
)
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step, run_filter
from marin_assets.pipeline.curation.ngrams import combine_ngrams, word_hashes
from marin_assets.pipeline.curation.shards import CurationError, Shard, write_shard
from marin_assets.pipeline.curation.stage import CurationResult, run_phase
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.data.text_files import expand_files

MODES = ("remove_paragraph", "remove_document", "mark")
CONTAMINATION_DIR = "contamination"
"""Under the output, beside the splits: the contaminated paragraphs, one parquet per shard."""
MARK_COLUMN = "contaminated_by"
ACROSS = "short-paragraphs-by-word-coverage-v1"
"""Enters the identity when `across_paragraphs` is on: how a short paragraph is judged by n-grams across breaks."""
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
SIDE_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("paragraph", pa.int32()),
                         ("eval_set", pa.string()), ("eval_file", pa.string()), ("eval_record", pa.int64()),
                         ("overlap", pa.float64())])
"""A row per contaminated paragraph: the document, the paragraph's index in it (from 0), the set, the file
and line (from 1) of the record that matched most of it, and the share of its n-grams found (of its words
inside found n-grams, for a short paragraph judged across its breaks)."""


@dataclass(frozen=True)
class EvalFiles:
    """An evaluation set as files (paths or URLs): what an `EvalSet` is once its step has run."""

    name: str
    files: tuple[str, ...]
    text_field: str = "text"
    text_format: str = "auto"

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "files": list(self.files), "text_field": self.text_field,
                "text_format": self.text_format}

    def resolve(self) -> EvalFiles:
        return self


@dataclass(frozen=True)
class EvalSet:
    """An evaluation set: some files of another step's output. Its name is the removal reason."""

    name: str
    """Letters, digits, `_`, `-`, `.`: names the reason (`stdlib-qa`) and the `contaminated_by` mark."""
    step: Step
    """The step whose output holds the files (a dependency of the decontaminate step)."""
    files: tuple[str, ...] = ("**/*.jsonl*",)
    """Globs relative to the step's output."""
    text_field: str = "text"
    """The field (JSON lines) or column (parquet) holding a record's text."""
    text_format: str = "auto"
    """As `readers.FORMATS`: "auto" tells it from the file names."""

    def identity(self) -> dict[str, Any]:
        """The set in the step's identity: its step by name (its hash enters through the deps)."""
        return {"name": self.name, "step": self.step.name, "files": list(self.files), "text_field": self.text_field,
                "text_format": self.text_format}

    def resolve(self) -> EvalFiles:
        """Its files, found under its step's output (now: the step has run)."""
        try:
            found = expand_files(self.step.output_path, self.files)
        except DatasetError as error:
            raise CurationError(f"{STAGE}: evaluation set {self.name!r} of step {self.step.name!r}: {error}") from None
        return EvalFiles(self.name, tuple(found), self.text_field, self.text_format)


@dataclass(frozen=True)
class SetHits:
    """What one evaluation set contaminated."""

    documents: int
    """Documents with at least one paragraph attributed to the set."""
    paragraphs: int


@record_type("decontamination_result")
@dataclass(frozen=True)
class DecontaminationResult(CurationResult):
    """A `CurationResult` (removed and modified per evaluation set) and what the evaluation sets held."""

    ngram: int
    threshold: float
    mode: str
    eval_set_records: dict[str, int]
    """Records read per evaluation set."""
    eval_set_ngrams: dict[str, int]
    """Distinct n-grams per evaluation set."""
    hits: dict[str, SetHits]
    contamination_path: str
    """The folder of `{split}-NNNNN.parquet` listing every contaminated paragraph (`SIDE_SCHEMA`)."""
    across_paragraphs: bool = False
    """Whether short paragraphs were also judged by n-grams across their breaks (records from before: no)."""


@dataclass(frozen=True)
class Built:
    """What the index build (`Decontaminate.prepare`) found."""

    output_path: str
    token: str
    """Of the build: a process keeps the index it loaded while the token is the same."""
    records: dict[str, int]
    ngrams: dict[str, int]


def _problem(eval_names: Sequence[str], ngram: int, threshold: float, mode: str, paragraph_separator: str,
             false_positive_rate: float = 1e-6) -> str | None:
    """What is wrong with these parameters, or None."""
    if not eval_names:
        return "no evaluation sets"
    bad = [n for n in eval_names if not isinstance(n, str) or not _NAME.match(n)]
    if bad:
        return f"evaluation set name {bad[0]!r} is not letters, digits, '_', '-' or '.'"
    if len(set(eval_names)) != len(eval_names):
        return f"evaluation set names repeat: {list(eval_names)}"
    if mode not in MODES:
        return f"mode {mode!r} is not one of {', '.join(MODES)}"
    if not isinstance(ngram, int) or ngram < 1:
        return f"ngram must be a positive integer, got {ngram!r}"
    if not 0 < threshold <= 1:
        return f"threshold must be in (0, 1], got {threshold!r}"
    if not paragraph_separator:
        return "paragraph_separator must not be empty"
    if not 0 < false_positive_rate < 1:
        return f"false_positive_rate must be in (0, 1), got {false_positive_rate!r}"
    return None


def side_index_path(output_path: str, shard: Shard) -> str:
    """Where a shard's hits are listed (which evaluation record each came from)."""
    return join_path(output_path, CONTAMINATION_DIR, f"{shard.key}.parquet")


@dataclass(frozen=True)
class Decontaminate(CurationFilter):
    """Removes (or marks) the paragraphs or documents that overlap the evaluation sets."""

    eval_sets: tuple[EvalSet | EvalFiles, ...]
    ngram: int = 13
    threshold: float = 0.5
    mode: str = "remove_paragraph"
    paragraph_separator: str = "\n"
    false_positive_rate: float = 1e-6
    """Sizes the Bloom filter only: every hit is confirmed exactly, so the output does not depend on it."""
    across_paragraphs: bool = True
    """A paragraph of fewer than `ngram` words (a line of re-wrapped text) is also contaminated when at least
    `threshold` of its words lie in evaluation n-grams running across its breaks; False: judged on its own only."""
    built: Built | None = None
    """Set by `prepare`: the index's build."""
    name = STAGE

    def identity(self) -> dict[str, Any]:
        """Without `across_paragraphs` the identity is what it was before that option: the same output."""
        return {"eval_sets": [e.identity() for e in self.eval_sets], "ngram": self.ngram,
                "threshold": self.threshold, "mode": self.mode, "paragraph_separator": self.paragraph_separator,
                **({"across_paragraphs": ACROSS} if self.across_paragraphs else {})}

    def deps(self) -> Sequence[Step]:
        return list(dict.fromkeys(e.step for e in self.eval_sets if isinstance(e, EvalSet)))

    def problem(self) -> str | None:
        """What is wrong with its parameters, or None."""
        problem = _problem([e.name for e in self.eval_sets], self.ngram, self.threshold, self.mode,
                           self.paragraph_separator, self.false_positive_rate)
        if problem is None and not isinstance(self.across_paragraphs, bool):
            return f"across_paragraphs must be True or False, got {self.across_paragraphs!r}"
        return problem

    def prepare(self, output_path: str, shards: Sequence[Shard], workers: int) -> Decontaminate:
        """Resolve the evaluation sets' files and build their index (once: a resumable phase)."""
        resolved = tuple(e.resolve() for e in self.eval_sets)
        files = {e.name: list(e.files) for e in resolved}
        formats = {e.name: (e.text_field, e.text_format) for e in resolved}
        built = run_phase(output_path, INDEX_PHASE, ["index"],
                          functools.partial(build_index, output_path, files, formats, self.ngram,
                                            self.false_positive_rate),
                          key_of=lambda item: item, name=f"{STAGE}: index of {len(files)} evaluation sets")[0]
        if built["params"] != index_params(files, formats, self.ngram):
            raise CurationError(f"{STAGE}: {output_path} holds an evaluation index built from other evaluation sets"
                                f" or n-gram size ({built['params']}); decontaminate into a fresh output")
        return dataclasses.replace(self, eval_sets=resolved,
                                   built=Built(output_path, built["token"], built["records"], built["ngrams"]))

    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        """Find the contaminated paragraphs of one shard, write its side index, and say what to do with each row."""
        if self.built is None:
            raise CurationError(f"{STAGE}: the evaluation index is built by prepare(), before any shard is decided")
        texts = table.column("text").to_pylist()
        found, side, counters = self._contamination(texts, table, load_index(self.built.output_path, self.built.token))
        write_shard(pa.table(side, schema=SIDE_SCHEMA), side_index_path(self.built.output_path, shard))
        names = [e.name for e in self.eval_sets]
        separator = self.paragraph_separator
        removed: list[str | None] = [None] * len(texts)
        modified: list[str | None] = [None] * len(texts)
        new_texts = list(texts) if self.mode == "remove_paragraph" and found else None
        marks = [""] * len(texts)
        for d, hit in found.items():
            by_set = np.bincount([s for _, s in hit], minlength=len(names))
            for s in np.flatnonzero(by_set):
                name = names[s]
                counters[f"documents_hit:{name}"] = counters.get(f"documents_hit:{name}", 0) + 1
                counters[f"paragraphs_hit:{name}"] = counters.get(f"paragraphs_hit:{name}", 0) + int(by_set[s])
            reason = names[int(by_set.argmax())]  # the set that took most of its paragraphs; ties: named first
            marks[d] = ",".join(names[s] for s in np.flatnonzero(by_set))
            if self.mode == "remove_document":
                removed[d] = reason
            elif new_texts is not None:
                dropped = {q for q, _ in hit}
                new_texts[d] = separator.join(q for j, q in enumerate(texts[d].split(separator)) if j not in dropped)
                counters["paragraphs_removed"] = counters.get("paragraphs_removed", 0) + len(dropped)
                modified[d] = reason
                if not new_texts[d].strip():
                    removed[d] = reason  # nothing of its own left
        if self.mode == "mark":
            counters["documents_marked"] = len(found)
            return Verdicts(removed, columns={MARK_COLUMN: pa.array(marks, pa.string())}, counters=counters)
        return Verdicts(removed, new_texts, modified if new_texts is not None else None, counters=counters)

    def _contamination(self, texts: list[str], table: pa.Table, index: Index
                       ) -> tuple[dict[int, list[tuple[int, int]]], dict[str, list[Any]], dict[str, int]]:
        """The contaminated paragraphs of each document (`{document: [(paragraph within it, set)]}`), the
        side index's rows (`SIDE_SCHEMA`) and the counts of paragraphs, n-grams and Bloom hits. Each paragraph is
        judged on its own n-grams; with `across_paragraphs`, a short one also by the n-grams across its breaks.
        Hashed a chunk of documents (about `eval_index.CHUNK_CHARACTERS`) at a time, so memory stays bounded."""
        paragraphs: list[str] = []
        per_doc = np.zeros(len(texts), dtype=np.int64)
        for d, text in enumerate(texts):
            parts = text.split(self.paragraph_separator)
            paragraphs += parts
            per_doc[d] = len(parts)
        doc_start = np.concatenate([[0], np.cumsum(per_doc)])
        counters = {"ngrams": 0, "bloom_hits": 0, "bloom_false_positives": 0}
        if self.across_paragraphs:
            counters.update(ngrams_across=0, paragraphs_across=0)
        # per chunk: each paragraph's n-grams, and (paragraph, index entry) per n-gram found; across: each
        # paragraph's words and those inside found n-grams across breaks, and (paragraph, entry) per such n-gram
        grams_of: list[np.ndarray] = []
        hit_paragraph: list[np.ndarray] = []
        hit_entry: list[np.ndarray] = []
        words_of: list[np.ndarray] = []
        covered_of: list[np.ndarray] = []
        across_paragraph: list[np.ndarray] = []
        across_entry: list[np.ndarray] = []
        cuts = chunk_bounds([len(t) for t in texts])
        for first, last in zip(cuts, cuts[1:], strict=False):
            p0, p1 = int(doc_start[first]), int(doc_start[last])
            words, word_offsets = word_hashes(paragraphs[p0:p1])
            grams, gram_offsets = combine_ngrams(words, word_offsets, self.ngram)
            at, entries, bloom_hits = confirmed(index, grams)
            grams_of.append(np.diff(gram_offsets))
            hit_paragraph.append(p0 + np.repeat(np.arange(p1 - p0), grams_of[-1])[at])
            hit_entry.append(entries)
            counters["ngrams"] += len(grams)
            counters["bloom_hits"] += bloom_hits
            counters["bloom_false_positives"] += bloom_hits - len(at)
            if self.across_paragraphs:
                spanning = _across(words, word_offsets, doc_start[first:last + 1] - p0, self.ngram, index)
                words_of.append(np.diff(word_offsets))
                covered_of.append(spanning.covered)
                across_paragraph.append(p0 + spanning.paragraph)
                across_entry.append(spanning.entry)
                counters["ngrams_across"] += spanning.looked_up
        per_paragraph = _joined(grams_of, np.int64)
        hit_p, hit_e = _joined(hit_paragraph, np.int64), _joined(hit_entry, np.int64)
        hits = np.bincount(hit_p, minlength=len(paragraphs))
        overlap = hits / np.maximum(per_paragraph, 1)
        judged = (hits > 0) & (overlap >= self.threshold)  # on its own n-grams, as without across_paragraphs
        pair_p, pair_e = hit_p[judged[hit_p]], hit_e[judged[hit_p]]
        if self.across_paragraphs:
            words, covered = _joined(words_of, np.int64), _joined(covered_of, np.int64)
            share = covered / np.maximum(words, 1)
            across = (words > 0) & (words < self.ngram) & (covered > 0) & (share >= self.threshold) & ~judged
            overlap = np.where(across, share, overlap)
            across_p, across_e = _joined(across_paragraph, np.int64), _joined(across_entry, np.int64)
            pair_p = np.concatenate([pair_p, across_p[across[across_p]]])
            pair_e = np.concatenate([pair_e, across_e[across[across_p]]])
            counters["paragraphs_across"] = int(across.sum())
            judged |= across
        contaminated = np.flatnonzero(judged)

        # Per contaminated paragraph: the set with most of its n-grams, then that set's record with most.
        order = np.argsort(pair_p, kind="stable")
        entries = pair_e[order]
        bounds = np.append(np.searchsorted(pair_p[order], contaminated, side="left"), len(entries))
        doc_of = np.repeat(np.arange(len(texts)), per_doc)
        found: dict[int, list[tuple[int, int]]] = {}
        side: dict[str, list[Any]] = {name: [] for name in SIDE_SCHEMA.names}
        ids, sources = table.column("id"), table.column("source")
        for i, p in enumerate(contaminated.tolist()):
            mine = entries[bounds[i]:bounds[i + 1]]
            sets = index.sets[mine]
            best = int(np.bincount(sets).argmax())  # ties: the set named first
            records, counts = np.unique(index.records[mine][sets == best], return_counts=True)
            record = int(records[counts.argmax()])
            d = int(doc_of[p])
            found.setdefault(d, []).append((p - int(doc_start[d]), best))
            side["id"].append(ids[d].as_py())
            side["source"].append(sources[d].as_py())
            side["paragraph"].append(p - int(doc_start[d]))
            side["eval_set"].append(self.eval_sets[best].name)
            side["eval_file"].append(index.files[int(index.record_file[record])])
            side["eval_record"].append(int(index.record_line[record]))
            side["overlap"].append(float(overlap[p]))
        counters.update(paragraphs=len(paragraphs), paragraphs_contaminated=len(contaminated),
                        documents_contaminated=len(found))
        return found, side, counters

    def result(self, summary: CurationResult) -> DecontaminationResult:
        assert self.built is not None
        counters = dict(summary.counters)
        hits = {e.name: SetHits(counters.pop(f"documents_hit:{e.name}", 0), counters.pop(f"paragraphs_hit:{e.name}", 0))
                for e in self.eval_sets}
        return DecontaminationResult.of(
            dataclasses.replace(summary, counters=counters), ngram=self.ngram, threshold=self.threshold,
            mode=self.mode, eval_set_records=self.built.records, eval_set_ngrams=self.built.ngrams, hits=hits,
            contamination_path=join_path(self.built.output_path, CONTAMINATION_DIR),
            across_paragraphs=self.across_paragraphs)


@dataclass(frozen=True)
class _Across:
    """What the n-grams running across paragraphs found in one chunk of documents."""

    covered: np.ndarray
    """Per paragraph: its words inside a found n-gram that runs across a paragraph break."""
    paragraph: np.ndarray
    entry: np.ndarray
    """Per (found n-gram, paragraph it runs through): the paragraph and the n-gram's index entry."""
    looked_up: int
    """The n-grams asked for (through `eval_index.found_exactly`, not the Bloom filter: there are many)."""


def _across(words: np.ndarray, word_offsets: np.ndarray, doc_paragraphs: np.ndarray, n: int, index: Index) -> _Across:
    """The n-grams of each document's whole word stream that run across a paragraph break into a short paragraph
    (fewer than `n` words: a line of re-wrapped text, which holds no n-gram of its own), looked up in the index.

    `words`, `word_offsets`: the word hashes of the chunk's paragraphs (paragraph i's at [offsets[i], offsets[i+1]));
    `doc_paragraphs`: where each document's paragraphs start (and the end). A paragraph break separates words as
    a space does (as in the index, whose records are hashed whole, line breaks and all)."""
    paragraph_words = np.diff(word_offsets)
    short = (paragraph_words > 0) & (paragraph_words < n)
    if not short.any():  # text of long paragraphs only (one per line, say): nothing to judge across
        empty = np.zeros(0, dtype=np.int64)
        return _Across(np.zeros(len(paragraph_words), dtype=np.int64), empty, empty, 0)
    doc_words = word_offsets[doc_paragraphs]
    grams, gram_offsets = combine_ngrams(words, doc_words, n)
    doc = np.repeat(np.arange(len(doc_words) - 1), np.diff(gram_offsets))
    start = doc_words[doc] + np.arange(len(grams)) - gram_offsets[doc]
    end = np.minimum(start + n, doc_words[doc + 1])  # a document shorter than n: one hash of all its words
    paragraph_of = np.repeat(np.arange(len(paragraph_words)), paragraph_words)
    first, last = paragraph_of[start], paragraph_of[end - 1]
    in_short = np.concatenate([[0], np.cumsum(short[paragraph_of])])
    ask = np.flatnonzero((first != last) & (in_short[end] > in_short[start]))  # the rest: judged as before
    at, entries = found_exactly(index, grams[ask])
    hit = ask[at]
    edges = np.zeros(len(words) + 1, dtype=np.int64)
    np.add.at(edges, start[hit], 1)
    np.add.at(edges, end[hit], -1)
    inside = np.concatenate([[0], np.cumsum(np.cumsum(edges[:-1]) > 0)])
    spans = last[hit] - first[hit] + 1
    through = np.repeat(first[hit], spans) + np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans)
    return _Across(inside[word_offsets[1:]] - inside[word_offsets[:-1]], through, np.repeat(entries, spans),
                   len(ask))


def _joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def decontaminate(output_path: str, dataset_path: str, eval_sets: Mapping[str, Sequence[str]], text_field: str = "text",
                  text_format: str = "auto", ngram: int = 13, threshold: float = 0.5, mode: str = "remove_paragraph",
                  paragraph_separator: str = "\n", false_positive_rate: float = 1e-6, workers: int = 1,
                  eval_formats: Mapping[str, tuple[str, str]] | None = None,
                  across_paragraphs: bool = True) -> DecontaminationResult:
    """A curated dataset without the paragraphs (or documents) that overlap the evaluation sets.

    `eval_sets`: name → its files (paths). `text_field`/`text_format` say how to read them, or per set
    `eval_formats` (name → (text_field, text_format)). `false_positive_rate` sizes the Bloom filter only:
    every hit is confirmed exactly, so the output does not depend on it. `across_paragraphs`: see `Decontaminate`.
    """
    sets = tuple(EvalFiles(name, tuple(files), *(eval_formats or {}).get(name, (text_field, text_format)))
                 for name, files in eval_sets.items())
    chosen = Decontaminate(sets, ngram, threshold, mode, paragraph_separator, false_positive_rate, across_paragraphs)
    problem = chosen.problem()
    if problem:
        raise CurationError(f"{STAGE}: {problem}")
    result = run_filter(output_path, dataset_path, chosen, workers)
    assert isinstance(result, DecontaminationResult)
    return result


def resolve_eval_sets(eval_sets: Sequence[EvalSet]) -> dict[str, list[str]]:
    """Each set's files, found under its step's output (now: the step has run)."""
    return {e.name: list(e.resolve().files) for e in eval_sets}


def decontaminate_step(name: str, dataset: Step, eval_sets: Sequence[EvalSet], ngram: int = 13,
                       threshold: float = 0.5, mode: str = "remove_paragraph", paragraph_separator: str = "\n",
                       workers: int = 1, max_removed_fraction: float = 0.5,
                       false_positive_rate: float = 1e-6, across_paragraphs: bool = True) -> Step:
    """`dataset` (curated shards) decontaminated against `eval_sets`.

    Identity: the sets (name, step, files, field, format), `ngram`, `threshold`, `mode`, `paragraph_separator`,
    `across_paragraphs` (when on); not `workers` nor the Bloom filter's `false_positive_rate` (hits are confirmed
    exactly).
    """
    chosen = Decontaminate(tuple(eval_sets), ngram, threshold, mode, paragraph_separator, false_positive_rate,
                           across_paragraphs)
    problem = chosen.problem()
    if problem:
        raise StepDefinitionError(f"{STAGE} step {name!r}: {problem}")
    return filter_step(name, dataset, chosen, workers=workers, max_removed_fraction=max_removed_fraction,
                       description=made_by(decontaminate))
