"""The evaluation sets' n-gram index that `decontaminate` checks every paragraph against.

Built once (a resumable phase, `INDEX_PHASE`), from every record of every evaluation set:

- an rbloom Bloom filter of all their n-gram hashes (a few bytes per n-gram): most of a corpus'
  n-grams are answered "no" in one probe;
- an exact index: the sorted distinct hashes with, per hash, the set and the record where it first
  appears. Every Bloom hit is confirmed there (`np.searchsorted`), so a Bloom false positive never
  removes anything, and each contaminated paragraph is traced to its evaluation record.

Both are kept under `_work/eval_index/`; a worker loads them once per build (`load_index`, by its token),
and makes a numpy prefilter of the hashes (`prefilter`) for the many n-grams that run across paragraphs
(`found_exactly`): the Bloom filter takes a Python call per n-gram.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.pipeline.curation.ngrams import ngram_hashes
from marin_assets.pipeline.curation.shards import CurationError, work_path
from marin_assets.pipeline.data.readers import DatasetError, iter_documents

STAGE = "decontaminate"
"""The stage this index serves (its messages name it)."""
INDEX_PHASE = "eval_index"
CHUNK_CHARACTERS = 2 << 20
"""Text hashed per `ngram_hashes` call: still vectorized, yet memory stays bounded (it holds ~50 bytes per byte
of its input, so a whole 64 MB shard at once would take gigabytes)."""


@dataclass
class Index:
    """The loaded index: the Bloom filter, and per distinct hash its first set and record."""

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
    prefilter: np.ndarray
    """A bitmap of the hashes' top `prefilter_bits` bits (`prefilter`), made from `hashes` when loaded."""
    prefilter_bits: int


def _identity(value: int) -> int:
    """rbloom's hash: the n-gram hashes are already mixed 64-bit values (and a filter saves only with
    its own hash function; Python's is salted per process for strings)."""
    return value


def _index_paths(output_path: str) -> tuple[str, str]:
    return work_path(output_path, INDEX_PHASE, "index.npz"), work_path(output_path, INDEX_PHASE, "bloom.bin")


def build_index(output_path: str, eval_sets: dict[str, list[str]], formats: dict[str, tuple[str, str]], ngram: int,
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
    return {"params": index_params(eval_sets, formats, ngram), "records": records, "ngrams": ngrams,
            "distinct_ngrams": len(hashes), "bloom_bytes": bloom.size_in_bits // 8,
            "index_bytes": len(buffer.getvalue()),
            "false_positive_rate": false_positive_rate, "seconds": round(time.perf_counter() - started, 3),
            "token": uuid.uuid4().hex}


def _hashed(texts: list[str], end: int, eval_set: int, ngram: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The n-gram hashes of the records `end - len(texts)` … `end - 1`, each with its set and record."""
    grams, offsets = hash_in_chunks(texts, ngram)
    owner = np.repeat(np.arange(end - len(texts), end, dtype=np.int64), np.diff(offsets))
    return grams, np.full(len(grams), eval_set, np.int32), owner


def chunk_bounds(lengths: Sequence[int]) -> list[int]:
    """Cuts `[0, …, len(lengths)]` splitting texts of these lengths into runs of about CHUNK_CHARACTERS (a text
    longer than that is a run of its own)."""
    ends = np.cumsum(np.fromiter(lengths, dtype=np.int64, count=len(lengths)))
    if not len(ends) or ends[-1] <= CHUNK_CHARACTERS:
        return [0, len(ends)]
    return [0, *(np.flatnonzero(np.diff(ends // CHUNK_CHARACTERS)) + 1).tolist(), len(ends)]


def confirmed(index: Index, grams: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The positions in `grams` that are in the index, each one's entry there, and the number of Bloom hits:
    the Bloom filter answers most n-grams in one probe, and each of its hits is confirmed exactly."""
    maybe = np.flatnonzero(np.fromiter(map(index.bloom.__contains__, grams.tolist()), dtype=bool, count=len(grams)))
    at = np.minimum(np.searchsorted(index.hashes, grams[maybe]), len(index.hashes) - 1)
    found = index.hashes[at] == grams[maybe]
    return maybe[found], at[found], len(maybe)


PREFILTER_BITS_PER_HASH = 16
"""Bits of the prefilter per distinct hash (rounded up to a power of two): an absent n-gram passes it with
probability about 1/16 and is then looked up exactly."""


def prefilter(hashes: np.ndarray) -> tuple[np.ndarray, int]:
    """A one-probe filter in numpy: bit `h >> (64 - bits)` is set for every hash `h` of the index (packed, 8 per
    byte). The Bloom filter takes a Python call per n-gram (0.3–2 µs, measured); this answers a whole array at
    ~10–30 ns an n-gram, and lets only about 1/16 of the absent ones on to the exact lookup."""
    bits = max(int(np.ceil(np.log2(max(len(hashes), 1) * PREFILTER_BITS_PER_HASH))), 3)
    top = hashes >> np.uint64(64 - bits)
    bitmap = np.zeros(1 << (bits - 3), dtype=np.uint8)
    np.bitwise_or.at(bitmap, (top >> np.uint64(3)).astype(np.intp),
                     np.left_shift(np.uint8(1), (top & np.uint64(7)).astype(np.uint8)))
    return bitmap, bits


def found_exactly(index: Index, grams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions in `grams` that are in the index and each one's entry there: through the numpy prefilter,
    then the sorted hashes (what `decontaminate` asks of the many n-grams running across paragraphs)."""
    top = grams >> np.uint64(64 - index.prefilter_bits)
    passed = (index.prefilter[(top >> np.uint64(3)).astype(np.intp)] >> (top & np.uint64(7)).astype(np.uint8)) & 1
    maybe = np.flatnonzero(passed)
    at = np.minimum(np.searchsorted(index.hashes, grams[maybe]), len(index.hashes) - 1)
    found = index.hashes[at] == grams[maybe]
    return maybe[found], at[found]


def hash_in_chunks(texts: Sequence[str], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """`ngram_hashes(texts, ngram)`, computed about CHUNK_CHARACTERS of text at a time."""
    cuts = chunk_bounds([len(t) for t in texts])
    if len(cuts) <= 2:
        return ngram_hashes(texts, ngram)
    grams, offsets = [], [np.zeros(1, dtype=np.int64)]
    for start, end in zip(cuts, cuts[1:], strict=False):
        part, part_offsets = ngram_hashes(texts[start:end], ngram)
        grams.append(part)
        offsets.append(part_offsets[1:] + offsets[-1][-1])
    return np.concatenate(grams), np.concatenate(offsets)


def index_params(eval_sets: Mapping[str, Sequence[str]], formats: Mapping[str, tuple[str, str]], ngram: int) -> dict:
    """What an index is built from: a stage finding another in its output refuses to use it."""
    return {"eval_sets": {name: list(files) for name, files in eval_sets.items()},
            "formats": {name: list(formats[name]) for name in eval_sets}, "ngram": ngram}


_LOADED: dict[str, tuple[str, Index]] = {}
"""Per process: output path → (token, index), so a worker loads the index once, not once per shard."""


def load_index(output_path: str, token: str) -> Index:
    """The index built under `output_path` (by the build whose token is `token`), loaded once per process."""
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
        hashes = data["hashes"]
        index = Index(rbloom.Bloom.load_bytes(bloom, _identity), hashes, data["sets"], data["records"],
                      data["record_file"], data["record_line"], [str(f) for f in data["files"]], *prefilter(hashes))
    _LOADED.clear()
    _LOADED[output_path] = (token, index)
    return index
