"""decontaminate: take out text that overlaps evaluation sets, so a model is not trained on its own exam.

As in Marin: word n-grams (13 by default, `ngrams`), and a paragraph (the text between two
`paragraph_separator`s) is contaminated when at least `threshold` of its n-grams occur in an
evaluation set. Built once (a resumable phase), from every record of every evaluation set:

- an rbloom Bloom filter of all their n-gram hashes (a few bytes per n-gram): most of a corpus'
  n-grams are answered "no" in one probe;
- an exact index: the sorted distinct hashes with, per hash, the set and the record where it first
  appears. Every Bloom hit is confirmed there (`np.searchsorted`), so a Bloom false positive never
  removes anything, and each contaminated paragraph is traced to its evaluation record.

Per shard (resumable, fanned out), by `mode`: `remove_paragraph` drops contaminated paragraphs (a
document left empty is removed), `remove_document` drops the document, `mark` keeps everything and
adds `contaminated_by` (the sets' names, comma-joined; "" when clean). The reason is the set that
matched most of the paragraph's n-grams. Every contaminated paragraph is listed, for people to read,
in `{output}/contamination/{split}-NNNNN.parquet` (one per shard, beside the splits: not a split).
"""

from __future__ import annotations

import functools
import io
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.ngrams import ngram_hashes
from marin_assets.pipeline.curation.shards import CurationError, Shard, list_shards, work_path, write_shard
from marin_assets.pipeline.curation.stage import (
    CurationResult,
    Verdicts,
    curation_step,
    filter_shards,
    run_phase,
)
from marin_assets.pipeline.readers import DatasetError, iter_documents
from marin_assets.pipeline.text_files import expand_files

STAGE = "decontaminate"
MODES = ("remove_paragraph", "remove_document", "mark")
CONTAMINATION_DIR = "contamination"
"""Under the output, beside the splits: the contaminated paragraphs, one parquet per shard."""
INDEX_PHASE = "eval_index"
MARK_COLUMN = "contaminated_by"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
CHUNK_CHARACTERS = 2 << 20
"""Text hashed per `ngram_hashes` call: still vectorized, yet memory stays bounded (it holds ~50 bytes per byte
of its input, so a whole 64 MB shard at once would take gigabytes)."""
SIDE_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("paragraph", pa.int32()),
                         ("eval_set", pa.string()), ("eval_file", pa.string()), ("eval_record", pa.int64()),
                         ("overlap", pa.float64())])
"""A row per contaminated paragraph: the document, the paragraph's index in it (from 0), the set, the file
and line (from 1) of the record that matched most of it, and the share of its n-grams found."""


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


@dataclass(frozen=True)
class SetHits:
    """What one evaluation set contaminated."""

    documents: int
    """Documents with at least one paragraph attributed to the set."""
    paragraphs: int


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


@dataclass(frozen=True)
class _Plan:
    """What a shard's worker needs (pickled to Ray tasks): the index is loaded from `_work` by `token`."""

    output_path: str
    names: tuple[str, ...]
    ngram: int
    threshold: float
    mode: str
    separator: str
    token: str
    """Of the index build: a process keeps the index it loaded while the token is the same."""


@dataclass
class _Index:
    bloom: Any
    hashes: np.ndarray
    """Sorted distinct n-gram hashes (uint64)."""
    sets: np.ndarray
    """Per hash: the evaluation set (index into the names) where it first appears."""
    records: np.ndarray
    """Per hash: the record (index into record_file/record_line) where it first appears."""
    record_file: np.ndarray
    record_line: np.ndarray
    files: list[str]


def _identity(value: int) -> int:
    """rbloom's hash: the n-gram hashes are already mixed 64-bit values (and a filter saves only with
    its own hash function; Python's is salted per process for strings)."""
    return value


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


# --- the evaluation sets' index ---------------------------------------------------------------


def _index_paths(output_path: str) -> tuple[str, str]:
    return work_path(output_path, INDEX_PHASE, "index.npz"), work_path(output_path, INDEX_PHASE, "bloom.bin")


def _build_index(output_path: str, eval_sets: dict[str, list[str]], formats: dict[str, tuple[str, str]], ngram: int,
                 false_positive_rate: float, _item: str) -> dict[str, Any]:
    """Hash every record of every set; write the exact index and the Bloom filter; their counts (JSON)."""
    import rbloom

    started = time.perf_counter()
    files: list[str] = []
    record_file: list[int] = []
    record_line: list[int] = []
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # hashes, set, record of each n-gram
    records: dict[str, int] = {}
    ngrams: dict[str, int] = {}
    for s, (name, set_files) in enumerate(eval_sets.items()):
        text_field, text_format = formats[name]
        first_record, set_parts = len(record_line), []
        numbers = {}
        for f in set_files:
            numbers[f] = len(files)
            files.append(f)
        texts: list[str] = []
        size = 0
        try:
            for file, line, text in iter_documents(set_files, text_field=text_field, text_format=text_format):
                record_file.append(numbers[file])
                record_line.append(line)
                texts.append(text)
                size += len(text)
                if size >= CHUNK_CHARACTERS:
                    set_parts.append(_hashed(texts, len(record_line), s, ngram))
                    texts, size = [], 0
        except DatasetError as e:
            raise CurationError(f"{STAGE}: evaluation set {name!r}: {e}") from None
        except FileNotFoundError as e:
            raise CurationError(f"{STAGE}: evaluation set {name!r}: {e.filename or e} does not exist") from None
        if texts:
            set_parts.append(_hashed(texts, len(record_line), s, ngram))
        records[name] = len(record_line) - first_record
        distinct = len(np.unique(np.concatenate([p[0] for p in set_parts]))) if set_parts else 0
        if not distinct:
            what = "has no records" if not records[name] else f"has {records[name]} records but not one word"
            raise CurationError(f"{STAGE}: evaluation set {name!r} {what} ({len(set_files)} files:"
                                f" {', '.join(set_files[:3])}{', …' if len(set_files) > 3 else ''});"
                                " an empty evaluation set decontaminates nothing")
        ngrams[name] = distinct
        parts += set_parts
    every = np.concatenate([p[0] for p in parts])
    hashes, first = np.unique(every, return_index=True)  # the first occurrence: sets in order, records in order
    sets = np.concatenate([p[1] for p in parts])[first]
    owners = np.concatenate([p[2] for p in parts])[first]
    buffer = io.BytesIO()
    np.savez(buffer, hashes=hashes, sets=sets, records=owners, record_file=np.array(record_file, np.int32),
             record_line=np.array(record_line, np.int64), files=np.array(files, dtype=str))
    index_path, bloom_path = _index_paths(output_path)
    atomic_write(index_path, buffer.getvalue())
    bloom = rbloom.Bloom(len(hashes), false_positive_rate, _identity)
    bloom.update(hashes.tolist())
    atomic_write(bloom_path, bloom.save_bytes())
    return {"params": _params(eval_sets, formats, ngram), "records": records, "ngrams": ngrams,
            "distinct_ngrams": len(hashes), "bloom_bytes": bloom.size_in_bits // 8,
            "index_bytes": len(buffer.getvalue()),
            "false_positive_rate": false_positive_rate, "seconds": round(time.perf_counter() - started, 3),
            "token": uuid.uuid4().hex}


def _hashed(texts: list[str], end: int, eval_set: int, ngram: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The n-gram hashes of the records `end - len(texts)` … `end - 1`, each with its set and record."""
    grams, offsets = hash_in_chunks(texts, ngram)
    owner = np.repeat(np.arange(end - len(texts), end, dtype=np.int64), np.diff(offsets))
    return grams, np.full(len(grams), eval_set, np.int32), owner


def hash_in_chunks(texts: Sequence[str], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """`ngram_hashes(texts, ngram)`, computed about CHUNK_CHARACTERS of text at a time."""
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    if not len(ends) or ends[-1] <= CHUNK_CHARACTERS:
        return ngram_hashes(texts, ngram)
    cuts = [0, *(np.flatnonzero(np.diff(ends // CHUNK_CHARACTERS)) + 1).tolist(), len(texts)]
    grams, offsets = [], [np.zeros(1, dtype=np.int64)]
    for start, end in zip(cuts, cuts[1:], strict=False):
        part, part_offsets = ngram_hashes(texts[start:end], ngram)
        grams.append(part)
        offsets.append(part_offsets[1:] + offsets[-1][-1])
    return np.concatenate(grams), np.concatenate(offsets)


def _params(eval_sets: Mapping[str, Sequence[str]], formats: Mapping[str, tuple[str, str]], ngram: int) -> dict:
    return {"eval_sets": {name: list(files) for name, files in eval_sets.items()},
            "formats": {name: list(formats[name]) for name in eval_sets}, "ngram": ngram}


_LOADED: dict[str, tuple[str, _Index]] = {}
"""Per process: output path → (token, index), so a worker loads the index once, not once per shard."""


def _load_index(output_path: str, token: str) -> _Index:
    import rbloom

    found = _LOADED.get(output_path)
    if found is not None and found[0] == token:
        return found[1]
    index_path, bloom_path = _index_paths(output_path)
    raw, bloom = read_bytes(index_path), read_bytes(bloom_path)
    if raw is None or bloom is None:
        raise CurationError(f"{STAGE}: the evaluation index {index_path} is missing; remove"
                            f" {work_path(output_path, INDEX_PHASE)} to rebuild it")
    with np.load(io.BytesIO(raw)) as data:
        index = _Index(rbloom.Bloom.load_bytes(bloom, _identity), data["hashes"], data["sets"], data["records"],
                       data["record_file"], data["record_line"], [str(f) for f in data["files"]])
    _LOADED.clear()
    _LOADED[output_path] = (token, index)
    return index


# --- per shard ------------------------------------------------------------------------------


def side_index_path(output_path: str, shard: Shard) -> str:
    """Where a shard's hits are listed (which evaluation record each came from)."""
    return join_path(output_path, CONTAMINATION_DIR, f"{shard.key}.parquet")


def decide(plan: _Plan, shard: Shard, table: pa.Table) -> Verdicts:
    """Find the contaminated paragraphs of one shard, write its side index, and say what to do with each row."""
    index = _load_index(plan.output_path, plan.token)
    texts = table.column("text").to_pylist()
    paragraphs: list[str] = []
    per_doc = np.zeros(len(texts), dtype=np.int64)
    for d, text in enumerate(texts):
        parts = text.split(plan.separator)
        paragraphs += parts
        per_doc[d] = len(parts)
    grams, offsets = hash_in_chunks(paragraphs, plan.ngram)
    per_paragraph = np.diff(offsets)
    maybe = np.flatnonzero(np.fromiter(map(index.bloom.__contains__, grams.tolist()), dtype=bool, count=len(grams)))
    at = np.minimum(np.searchsorted(index.hashes, grams[maybe]), len(index.hashes) - 1)
    confirmed = index.hashes[at] == grams[maybe]
    hit_gram, hit_entry = maybe[confirmed], at[confirmed]
    hit_paragraph = np.repeat(np.arange(len(paragraphs)), per_paragraph)[hit_gram]
    hits = np.bincount(hit_paragraph, minlength=len(paragraphs))
    overlap = hits / np.maximum(per_paragraph, 1)
    contaminated = np.flatnonzero((hits > 0) & (overlap >= plan.threshold))

    # Per contaminated paragraph: the set with most of its n-grams, then that set's record with most.
    keep = np.isin(hit_paragraph, contaminated)
    order = np.argsort(hit_paragraph[keep], kind="stable")
    entries = hit_entry[keep][order]
    bounds = np.searchsorted(hit_paragraph[keep][order], contaminated, side="left")
    bounds = np.append(bounds, len(entries))
    doc_start = np.concatenate([[0], np.cumsum(per_doc)])
    doc_of = np.repeat(np.arange(len(texts)), per_doc)
    found: dict[int, list[tuple[int, int]]] = {}  # document → [(paragraph within it, set)]
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
        side["eval_set"].append(plan.names[best])
        side["eval_file"].append(index.files[int(index.record_file[record])])
        side["eval_record"].append(int(index.record_line[record]))
        side["overlap"].append(float(overlap[p]))
    write_shard(pa.table(side, schema=SIDE_SCHEMA), side_index_path(plan.output_path, shard))

    counters = {"paragraphs": len(paragraphs), "paragraphs_contaminated": len(contaminated),
                "documents_contaminated": len(found), "ngrams": len(grams), "bloom_hits": len(maybe),
                "bloom_false_positives": int(len(maybe) - confirmed.sum())}
    removed: list[str | None] = [None] * len(texts)
    modified: list[str | None] = [None] * len(texts)
    new_texts = list(texts) if plan.mode == "remove_paragraph" and found else None
    marks = [""] * len(texts)
    for d, hit in found.items():
        by_set = np.bincount([s for _, s in hit], minlength=len(plan.names))
        for s in np.flatnonzero(by_set):
            name = plan.names[s]
            counters[f"documents_hit:{name}"] = counters.get(f"documents_hit:{name}", 0) + 1
            counters[f"paragraphs_hit:{name}"] = counters.get(f"paragraphs_hit:{name}", 0) + int(by_set[s])
        reason = plan.names[int(by_set.argmax())]  # the set that took most of its paragraphs; ties: named first
        marks[d] = ",".join(plan.names[s] for s in np.flatnonzero(by_set))
        if plan.mode == "remove_document":
            removed[d] = reason
        elif new_texts is not None:
            dropped = {q for q, _ in hit}
            new_texts[d] = plan.separator.join(q for j, q in enumerate(texts[d].split(plan.separator))
                                               if j not in dropped)
            counters["paragraphs_removed"] = counters.get("paragraphs_removed", 0) + len(dropped)
            modified[d] = reason
            if not new_texts[d].strip():
                removed[d] = reason  # nothing of its own left
    if plan.mode == "mark":
        counters["documents_marked"] = len(found)
        return Verdicts(removed, columns={MARK_COLUMN: pa.array(marks, pa.string())}, counters=counters)
    return Verdicts(removed, new_texts, modified if new_texts is not None else None, counters=counters)


def _decider(plan: _Plan, shard: Shard) -> Callable[[Any], Verdicts]:
    """A shard's `decide`, knowing which shard it is (for its side index)."""
    return functools.partial(decide, plan, shard)


# --- the stage ------------------------------------------------------------------------------


def decontaminate(output_path: str, dataset_path: str, eval_sets: Mapping[str, Sequence[str]], text_field: str = "text",
                  text_format: str = "auto", ngram: int = 13, threshold: float = 0.5, mode: str = "remove_paragraph",
                  paragraph_separator: str = "\n", false_positive_rate: float = 1e-6, workers: int = 1,
                  eval_formats: Mapping[str, tuple[str, str]] | None = None) -> DecontaminationResult:
    """A curated dataset without the paragraphs (or documents) that overlap the evaluation sets.

    `eval_sets`: name → its files (paths). `text_field`/`text_format` say how to read them, or per set
    `eval_formats` (name → (text_field, text_format)). `false_positive_rate` sizes the Bloom filter only:
    every hit is confirmed exactly, so the output does not depend on it.
    """
    names = list(eval_sets)
    problem = _problem(names, ngram, threshold, mode, paragraph_separator, false_positive_rate)
    if problem:
        raise CurationError(f"{STAGE}: {problem}")
    chosen = {name: list(files) for name, files in eval_sets.items()}
    formats: dict[str, tuple[str, str]] = {name: (eval_formats or {}).get(name, (text_field, text_format))
                                           for name in names}
    shards = list_shards(STAGE, dataset_path)
    built = run_phase(output_path, INDEX_PHASE, ["index"],
                      functools.partial(_build_index, output_path, chosen, formats, ngram, false_positive_rate),
                      key_of=lambda item: item, name=f"{STAGE}: index of {len(names)} evaluation sets")[0]
    if built["params"] != _params(chosen, formats, ngram):
        raise CurationError(f"{STAGE}: {output_path} holds an evaluation index built from other evaluation sets or"
                            f" n-gram size ({built['params']}); decontaminate into a fresh output")
    plan = _Plan(output_path, tuple(names), ngram, threshold, mode, paragraph_separator, built["token"])
    summary = filter_shards(STAGE, output_path, shards, workers=workers, decide_for=functools.partial(_decider, plan))
    counters = summary.pop("counters")
    hits = {name: SetHits(counters.pop(f"documents_hit:{name}", 0), counters.pop(f"paragraphs_hit:{name}", 0))
            for name in names}
    return DecontaminationResult(**summary, counters=counters, ngram=ngram, threshold=threshold, mode=mode,
                                 eval_set_records=built["records"], eval_set_ngrams=built["ngrams"], hits=hits,
                                 contamination_path=join_path(output_path, CONTAMINATION_DIR))


def resolve_eval_sets(eval_sets: Sequence[EvalSet]) -> dict[str, list[str]]:
    """Each set's files, found under its step's output (now: the step has run)."""
    resolved = {}
    for e in eval_sets:
        try:
            resolved[e.name] = expand_files(e.step.output_path, e.files)
        except DatasetError as error:
            raise CurationError(f"{STAGE}: evaluation set {e.name!r} of step {e.step.name!r}: {error}") from None
    return resolved


def decontaminate_step(name: str, dataset: Step, eval_sets: Sequence[EvalSet], ngram: int = 13,
                       threshold: float = 0.5, mode: str = "remove_paragraph", paragraph_separator: str = "\n",
                       workers: int = 1, max_removed_fraction: float = 0.5,
                       false_positive_rate: float = 1e-6) -> Step:
    """`dataset` (curated shards) decontaminated against `eval_sets`. Identity: the sets (name, step, files,
    field, format), `ngram`, `threshold`, `mode`, `paragraph_separator`; not `workers` nor the Bloom filter's
    `false_positive_rate` (hits are confirmed exactly)."""
    eval_sets = tuple(eval_sets)
    problem = _problem([e.name for e in eval_sets], ngram, threshold, mode, paragraph_separator,
                           false_positive_rate)
    if problem:
        raise StepDefinitionError(f"{STAGE} step {name!r}: {problem}")
    steps = list(dict.fromkeys(e.step for e in eval_sets))
    formats = {e.name: (e.text_field, e.text_format) for e in eval_sets}
    return curation_step(
        name, STAGE,
        lambda out: decontaminate(out, dataset.output_path, resolve_eval_sets(eval_sets), ngram=ngram,
                                  threshold=threshold, mode=mode, paragraph_separator=paragraph_separator,
                                  false_positive_rate=false_positive_rate, workers=workers, eval_formats=formats),
        dataset,
        {"eval_sets": [{"name": e.name, "step": e.step.name, "files": list(e.files), "text_field": e.text_field,
                        "text_format": e.text_format} for e in eval_sets],
         "ngram": ngram, "threshold": threshold, "mode": mode, "paragraph_separator": paragraph_separator},
        description=made_by(decontaminate), max_removed_fraction=max_removed_fraction, more_deps=steps)
