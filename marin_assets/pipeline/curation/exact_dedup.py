"""exact_dedup: every document (or paragraph) whose text occurred before, anywhere in the dataset, is removed.

Identity is a 128-bit hash of the exact UTF-8 text (xxh3-128: by the birthday bound a trillion texts
collide with odds near 10**-15). Deduplication is global, across every shard of every split, and keeps
the first occurrence in (split as `list_shards` orders them, shard, row, paragraph) order, so the same
input gives the same output however many workers or hash buckets ran it. A document repeated whole is
removed as `duplicate`. With `paragraphs`, a document is also cut into paragraphs at
`paragraph_separator` (pieces that are empty or only whitespace are neither hashed nor removed); a
paragraph seen before is taken out (`duplicate paragraph`), the document keeping its other pieces joined
as they were (and its `id`, the hash of its original text, so ids still name the input's documents),
and a document left with no paragraph is removed (`all paragraphs duplicated`).

No process holds the whole corpus. Three resumable phases (`stage.run_phase`), each fanned out, with
one bookkeeping file per item (each file costs an open and an fsync: one file per shard and bucket once cost
more than reading, hashing and writing the shards):

1. `hashes`, per shard: hash its documents (and paragraphs) into one file, `_work/hashes/{shard}.hashes`:
   an index of `2**bits + 1` offsets (where each `bits`-bit prefix of the hash's high half starts), then its
   `ENTRY` rows sorted by that high half. Nothing in it depends on the bucket count;
2. `duplicates-{B}`, per bucket: bucket b of B holds the hashes whose high half lies in
   `[b * 2**64 // B, (b + 1) * 2**64 // B)`, read from every shard's file as one byte range found in its
   index; sorted (hash, then position), every entry after the first of its hash repeats an earlier one.
   Its removals, grouped by shard, go to one file `_work/duplicates-{B}/bucket-NNNNN.removals`
   (`REMOVAL` rows), each shard's row range in the bucket's outcome;
3. `shards`, per shard: rewrite it without them (`filters.run_filter`: phases 1 and 2 are the filter's
   `prepare`, its verdicts come from its byte ranges of the buckets' removal files).

B (`buckets`; by default enough buckets to hold `ENTRIES_PER_BUCKET` hashes each, and at least one per
worker) is in the second phase's folder name, so a re-run with another bucket count never mixes the two.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import xxhash

from marin_assets.core.files import atomic_write
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step, run_filter
from marin_assets.pipeline.curation.shards import CurationError, Shard, read_shard, work_path
from marin_assets.pipeline.curation.stage import CurationResult, run_phase

STAGE = "exact_dedup"
HASH = "xxh3-128"
DUPLICATE = "duplicate"
DUPLICATE_PARAGRAPH = "duplicate paragraph"
ALL_PARAGRAPHS = "all paragraphs duplicated"
WHOLE = -1
"""The `paragraph` of an entry that stands for the whole document."""
ENTRY = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("shard", "<i4"), ("row", "<i4"), ("paragraph", "<i4")])
"""One hashed document or paragraph: its hash (two halves), and where it is (shard = position in `list_shards`)."""
REMOVAL = np.dtype([("row", "<i4"), ("paragraph", "<i4")])
"""A row of one shard to remove (`paragraph` WHOLE), or one of its paragraphs (index in `text.split(separator)`)."""
OFFSET = np.dtype("<u8")
"""An entry of a hash file's prefix index."""
HASH_PHASE = "hashes"
MAX_INDEX_BITS = 16
ENTRIES_PER_CELL = 16
"""A hash file's index has about one offset per this many entries (at most `2**MAX_INDEX_BITS + 1`)."""
ENTRIES_PER_BUCKET = 1 << 23
"""The default bucket count gives each bucket about this many hashes at most (28 bytes each: ~235 MB)."""
SAMPLES = 20
MAX_BUCKETS = 1 << 16
TWO_64 = 1 << 64


@dataclass(frozen=True)
class DuplicateSample:
    """One removed duplicate document and the copy that was kept, for a person to check."""

    id: str
    source: str
    """`file:line` of the removed copy."""
    kept_source: str
    """`file:line` of the copy that was kept (the first occurrence)."""
    copies: int
    """How many times this text occurs in the input."""


@record_type("exact_dedup_result")
@dataclass(frozen=True)
class ExactDedupResult(CurationResult):
    """A `CurationResult` plus how the duplicates were distributed."""

    paragraphs: bool
    """Whether paragraphs were deduplicated too."""
    duplicate_groups: int
    """Document texts that occur more than once."""
    largest_group: int
    """Occurrences of the most repeated document text (1 when nothing repeats)."""
    paragraph_groups: int
    """Paragraph texts that occur more than once (0 without `paragraphs`)."""
    largest_paragraph_group: int
    """Occurrences of the most repeated paragraph (0 without `paragraphs`)."""
    samples: list[DuplicateSample]
    """The first (in input order) few documents removed as duplicates, at most `SAMPLES`."""


def _check_arguments(paragraph_separator: str, buckets: int | None) -> None:
    if not isinstance(paragraph_separator, str) or not paragraph_separator:
        raise ValueError(f"{STAGE}: paragraph_separator must be a non-empty string, got {paragraph_separator!r}")
    if buckets is not None and not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"{STAGE}: buckets must be between 1 and {MAX_BUCKETS}, got {buckets}")


def _hash_path(output_path: str, shard_key: str) -> str:
    return work_path(output_path, HASH_PHASE, f"{shard_key}.hashes")


def _removal_path(output_path: str, buckets: int, bucket: int) -> str:
    return work_path(output_path, f"duplicates-{buckets}", f"bucket-{bucket:05d}.removals")


def _read_range(path: str, start: int, stop: int, what: str) -> bytes:
    """Bytes `[start, stop)` of a bookkeeping file (one ranged read, also on object stores)."""
    fs, local = fsspec.core.url_to_fs(path)
    try:
        data: bytes = fs.cat_file(local, start=start, end=stop) if stop > start else b""
    except FileNotFoundError:
        raise CurationError(f"{STAGE}: {what} {path} is missing (was `_work` removed part-way through a run?)"
                            ) from None
    if len(data) != stop - start:
        raise CurationError(f"{STAGE}: {what} {path} ends at byte {start + len(data)}, before {stop} (was it rewritten"
                            " part-way through a run?); delete the _work folder to start over")
    return data


def _index_bits(entries: int) -> int:
    """Prefix bits of a hash file's index: about `ENTRIES_PER_CELL` entries a cell, at most `MAX_INDEX_BITS`."""
    return min(MAX_INDEX_BITS, max(0, (entries // ENTRIES_PER_CELL).bit_length() - 1))


def _document_digests(path: str, texts: pa.ChunkedArray) -> list[bytes]:
    """xxh3-128 digest of every text's UTF-8 bytes, read from Arrow's buffers (no Python strings)."""
    digest = xxhash.xxh3_128_digest
    out: list[bytes] = []
    for chunk in texts.chunks:
        width: type[np.signedinteger[Any]]
        if pa.types.is_large_string(chunk.type):
            width = np.int64
        elif pa.types.is_string(chunk.type):
            width = np.int32
        else:
            raise CurationError(f"{STAGE}: shard {path}: text is {chunk.type}, not a string column")
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=width)[chunk.offset:chunk.offset + len(chunk) + 1].tolist()
        data = memoryview(data_buffer if data_buffer is not None else b"")
        out += [digest(data[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return out


def _hash_shard(output_path: str, paragraphs: bool, separator: str, item: tuple[int, Shard]) -> dict[str, Any]:
    """Phase 1: one shard's hashes, sorted by their high half under a prefix index, in one file; its counts."""
    ordinal, shard = item
    texts = read_shard(STAGE, shard.path, ["text"]).column("text")
    digests = _document_digests(shard.path, texts)
    rows = list(range(len(digests)))
    where = [WHOLE] * len(digests)
    if paragraphs:
        digest = xxhash.xxh3_128_digest
        for row, text in enumerate(texts.to_pylist()):
            for index, piece in enumerate(text.split(separator)):
                if piece.strip():
                    digests.append(digest(piece.encode("utf-8", "surrogatepass")))
                    rows.append(row)
                    where.append(index)
    halves = np.frombuffer(b"".join(digests), dtype=">u8").reshape(-1, 2)
    entries = np.empty(len(digests), dtype=ENTRY)
    entries["hi"], entries["lo"] = halves[:, 0], halves[:, 1]
    entries["shard"], entries["row"], entries["paragraph"] = ordinal, rows, where
    entries = entries[np.argsort(entries["hi"], kind="stable")]
    bits = _index_bits(len(entries))
    prefixes = entries["hi"] >> np.uint64(64 - bits) if bits else np.zeros(len(entries), np.uint64)
    cells = np.searchsorted(prefixes, np.arange((1 << bits) + 1, dtype=np.uint64)).astype(OFFSET)
    atomic_write(_hash_path(output_path, shard.key), cells.tobytes() + entries.tobytes())
    return {"documents": len(texts), "paragraphs": len(digests) - len(texts), "entries": len(entries),
            "index_bits": bits}


def _bucket_entries(output_path: str, shard_key: str, entries: int, bits: int, low: int, high: int) -> np.ndarray:
    """The entries of one shard's hash file whose high half is in `[low, high)`: one ranged read of its index,
    one of the entries the index cells cover (then only those in range)."""
    path = _hash_path(output_path, shard_key)
    first, last = low >> (64 - bits), (high - 1) >> (64 - bits)
    cells = np.frombuffer(_read_range(path, first * OFFSET.itemsize, (last + 2) * OFFSET.itemsize, "hash file"),
                          OFFSET)
    start, stop = int(cells[0]), int(cells[-1])
    if not 0 <= start <= stop <= entries:
        raise CurationError(f"{STAGE}: hash file {path} has a broken index ({start}..{stop} of {entries} entries);"
                            " delete the _work folder to start over")
    header = ((1 << bits) + 1) * OFFSET.itemsize
    found = np.frombuffer(_read_range(path, header + start * ENTRY.itemsize, header + stop * ENTRY.itemsize,
                                      "hash file"), ENTRY)
    hi = found["hi"]
    return found[(hi >= np.uint64(low)) & (hi <= np.uint64(high - 1))]


def _dedup_bucket(output_path: str, buckets: int, shards: Sequence[tuple[str, int, int]], bucket: int
                  ) -> dict[str, Any]:
    """Phase 2: one bucket of every shard (`shards`: key, entries, index bits), sorted by (kind, hash, position):
    every entry after the first of its hash is a duplicate. Writes the removals, grouped by shard, to one file;
    returns each shard's row range in it, group sizes and samples."""
    low, high = bucket * TWO_64 // buckets, (bucket + 1) * TWO_64 // buckets
    entries = np.concatenate([_bucket_entries(output_path, key, count, bits, low, high)
                              for key, count, bits in shards] or [np.empty(0, ENTRY)])
    paragraph = entries["paragraph"]
    is_paragraph = paragraph != WHOLE
    order = np.lexsort((paragraph, entries["row"], entries["shard"], entries["lo"], entries["hi"], is_paragraph))
    entries, is_paragraph = entries[order], is_paragraph[order]
    repeat = np.zeros(len(entries), dtype=bool)
    repeat[1:] = ((entries["hi"][1:] == entries["hi"][:-1]) & (entries["lo"][1:] == entries["lo"][:-1])
                  & (is_paragraph[1:] == is_paragraph[:-1]))
    starts = np.flatnonzero(~repeat)
    sizes = np.diff(np.append(starts, len(entries)))
    group_is_paragraph = is_paragraph[starts]
    outcome: dict[str, Any] = {"entries": len(entries), "shards": []}
    for name, mask in (("", ~group_is_paragraph), ("paragraph_", group_is_paragraph)):
        chosen = sizes[mask]
        outcome[f"{name}groups"] = int((chosen > 1).sum())
        outcome[f"largest_{name}group"] = int(chosen.max()) if len(chosen) else 0

    group = np.cumsum(~repeat) - 1
    whole = np.flatnonzero(repeat & ~is_paragraph)
    kept = starts[group[whole]]
    by_place = np.lexsort((entries["row"][whole], entries["shard"][whole]))[:SAMPLES]
    outcome["samples"] = [[int(entries["shard"][whole[i]]), int(entries["row"][whole[i]]),
                           int(entries["shard"][kept[i]]), int(entries["row"][kept[i]]), int(sizes[group[whole[i]]])]
                          for i in by_place]

    removed = entries[repeat]
    removed = removed[np.lexsort((removed["paragraph"], removed["row"], removed["shard"]))]
    if len(removed):
        rows = np.empty(len(removed), dtype=REMOVAL)
        rows["row"], rows["paragraph"] = removed["row"], removed["paragraph"]
        atomic_write(_removal_path(output_path, buckets, bucket), rows.tobytes())
        ordinals, first = np.unique(removed["shard"], return_index=True)
        bounds = np.append(first, len(removed)).tolist()
        outcome["shards"] = [[o, a, b] for o, a, b in zip(ordinals.tolist(), bounds[:-1], bounds[1:], strict=True)]
    return outcome


def removal_verdicts(path: str, separator: str, removals: np.ndarray, table: pa.Table) -> Verdicts:
    """Phase 3's verdicts on one shard (`path`, for messages) from its `REMOVAL` rows."""
    rows = table.num_rows
    removed: list[str | None] = [None] * rows
    if not len(removals):
        return Verdicts(removed)
    if int(removals["row"].max()) >= rows:
        raise CurationError(f"{STAGE}: shard {path} row {int(removals['row'].max())}: hashed in phase 1 but the shard"
                            f" has {rows} rows now (was the input rewritten during the run?)")
    whole = removals["paragraph"] == WHOLE
    for row in removals["row"][whole].tolist():
        removed[row] = DUPLICATE
    cut: dict[int, set[int]] = {}
    for row, index in removals[~whole].tolist():
        if removed[row] is None:
            cut.setdefault(row, set()).add(index)
    if not cut:
        return Verdicts(removed)
    texts = table.column("text").to_pylist()
    modified: list[str | None] = [None] * rows
    paragraphs_removed = 0
    for row, indices in sorted(cut.items()):
        pieces = texts[row].split(separator)
        if max(indices) >= len(pieces) or not all(pieces[i].strip() for i in indices):
            raise CurationError(f"{STAGE}: shard {path} row {row}: its paragraphs differ from those hashed in phase 1"
                                " (was the input rewritten during the run?)")
        rest = [piece for i, piece in enumerate(pieces) if i not in indices]
        paragraphs_removed += len(indices)
        if any(piece.strip() for piece in rest):
            texts[row] = separator.join(rest)
            modified[row] = DUPLICATE_PARAGRAPH
        else:
            removed[row] = ALL_PARAGRAPHS
    return Verdicts(removed, texts=texts, modified=modified, counters={"paragraphs_removed": paragraphs_removed})


def _key(item: tuple[Any, ...]) -> str:
    return item[1].key


def _samples(shards: Sequence[Shard], outcomes: Sequence[dict[str, Any]]) -> list[DuplicateSample]:
    """The first SAMPLES removed duplicates in input order (each bucket sent its first few), with their sources."""
    chosen = sorted(tuple(s) for o in outcomes for s in o["samples"])[:SAMPLES]
    columns: dict[int, tuple[list[str], list[str]]] = {}
    for ordinal in sorted({s[0] for s in chosen} | {s[2] for s in chosen}):
        table = read_shard(STAGE, shards[ordinal].path, ["id", "source"])
        columns[ordinal] = (table.column("id").to_pylist(), table.column("source").to_pylist())
    return [DuplicateSample(columns[shard][0][row], columns[shard][1][row], columns[kept_shard][1][kept_row], copies)
            for shard, row, kept_shard, kept_row, copies in chosen]


@dataclass(frozen=True)
class Found:
    """What the hashing and bucket phases (`ExactDedup.prepare`) found."""

    output_path: str
    buckets: int
    """The bucket count the second phase ran with (names its folder)."""
    removals: dict[str, tuple[tuple[int, int, int], ...]]
    """Per shard key: (bucket, first, stop) row ranges of the buckets' removal files that are its removals
    (shards with none are absent)."""
    paragraphs: int
    groups: int
    largest_group: int
    paragraph_groups: int
    largest_paragraph_group: int
    samples: list[DuplicateSample]


def default_buckets(entries: int, workers: int) -> int:
    """Enough buckets for at most `ENTRIES_PER_BUCKET` hashes each, and one per worker: a small corpus is one
    bucket (each bucket costs its own files), a large one never loads more than a bucket at once."""
    return min(MAX_BUCKETS, max(1, workers, -(-entries // ENTRIES_PER_BUCKET)))


@dataclass(frozen=True)
class ExactDedup(CurationFilter):
    """Removes every document (and with `paragraphs`, every paragraph) whose exact text occurred earlier."""

    paragraphs: bool = False
    paragraph_separator: str = "\n"
    buckets: int | None = None
    """How the hashes are split for the global pass (None: `default_buckets`): changes how the work is split,
    not the output."""
    found: Found | None = None
    """Set by `prepare`: where the removals are."""
    name = STAGE

    def identity(self) -> dict[str, Any]:
        return {"paragraphs": self.paragraphs,
                "paragraph_separator": self.paragraph_separator if self.paragraphs else None, "hash": HASH}

    def prepare(self, output_path: str, shards: Sequence[Shard], workers: int) -> ExactDedup:
        """Phases 1 and 2: every shard hashed into one sorted file, every bucket's repeats found."""
        hashed = run_phase(output_path, HASH_PHASE, list(enumerate(shards)),
                           functools.partial(_hash_shard, output_path, self.paragraphs, self.paragraph_separator),
                           key_of=_key, workers=workers, name=f"{STAGE}: hash {len(shards)} shards")
        buckets = self.buckets or default_buckets(sum(o["entries"] for o in hashed), workers)
        found = run_phase(output_path, f"duplicates-{buckets}", list(range(buckets)),
                          functools.partial(_dedup_bucket, output_path, buckets,
                                            [(s.key, o["entries"], o["index_bits"])
                                             for s, o in zip(shards, hashed, strict=True)]),
                          key_of=lambda bucket: f"bucket-{bucket:05d}", workers=workers,
                          name=f"{STAGE}: find duplicates in {buckets} buckets")
        removals: dict[str, list[tuple[int, int, int]]] = {}
        for bucket, outcome in enumerate(found):
            for ordinal, first, stop in outcome["shards"]:
                removals.setdefault(shards[ordinal].key, []).append((bucket, first, stop))
        return dataclasses.replace(self, found=Found(
            output_path, buckets, {key: tuple(r) for key, r in removals.items()},
            sum(o["paragraphs"] for o in hashed),
            groups=sum(o["groups"] for o in found),
            largest_group=max((o["largest_group"] for o in found), default=0),
            paragraph_groups=sum(o["paragraph_groups"] for o in found),
            largest_paragraph_group=max((o["largest_paragraph_group"] for o in found), default=0),
            samples=_samples(shards, found)))

    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        """Phase 3: the shard's removals, its row ranges of the buckets' removal files."""
        found = self.found
        if found is None:
            raise CurationError(f"{STAGE}: the duplicates are found by prepare(), before any shard is decided")
        size = REMOVAL.itemsize
        parts = [_read_range(_removal_path(found.output_path, found.buckets, bucket), first * size, stop * size,
                             "removal list") for bucket, first, stop in found.removals.get(shard.key, ())]
        removals = np.frombuffer(b"".join(parts), REMOVAL)
        return removal_verdicts(shard.path, self.paragraph_separator, removals, table)

    def result(self, summary: CurationResult) -> ExactDedupResult:
        found = self.found
        assert found is not None
        if self.paragraphs:
            summary = dataclasses.replace(summary, counters={
                "paragraphs": found.paragraphs, "paragraphs_removed": summary.counters.get("paragraphs_removed", 0)})
        return ExactDedupResult.of(summary, paragraphs=self.paragraphs, duplicate_groups=found.groups,
                                   largest_group=found.largest_group, paragraph_groups=found.paragraph_groups,
                                   largest_paragraph_group=found.largest_paragraph_group, samples=found.samples)


def exact_dedup(output_path: str, dataset_path: str, paragraphs: bool = False, paragraph_separator: str = "\n",
                buckets: int | None = None, workers: int = 1) -> ExactDedupResult:
    """Remove every document (and with `paragraphs`, every paragraph) whose exact text occurred earlier in the
    normalized dataset at `dataset_path`, across all its shards and splits; the first occurrence stays."""
    _check_arguments(paragraph_separator, buckets)
    result = run_filter(output_path, dataset_path, ExactDedup(paragraphs, paragraph_separator, buckets), workers)
    assert isinstance(result, ExactDedupResult)
    return result


def exact_dedup_step(name: str, dataset: Step, paragraphs: bool = False, paragraph_separator: str = "\n",
                     buckets: int | None = None, workers: int = 1, max_removed_fraction: float = 0.5) -> Step:
    """`dataset` (normalized) without repeated documents (and paragraphs); `buckets` and `workers` only change how
    the work is split, not the output, so they are not part of the step's identity.

    Identity: `paragraphs`, `paragraph_separator` (when `paragraphs`) and the hash (and `dataset`); not `buckets`,
    `workers` nor `max_removed_fraction`.
    """
    _check_arguments(paragraph_separator, buckets)
    return filter_step(name, dataset, ExactDedup(paragraphs, paragraph_separator, buckets), workers=workers,
                       max_removed_fraction=max_removed_fraction, description=made_by(exact_dedup))
