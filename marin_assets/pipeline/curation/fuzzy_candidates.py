"""fuzzy_dedup's candidates: MinHash over word or character n-grams, LSH bands, and the pairs that share a band.

Phase 1 (`band_shard`, per shard): n-gram hashes (`shingles`), MinHash rows (rensa), one uint64 per band.
Its records (band, band hash, shard ordinal, row) go to one file, `_work/bands/{shard}.records`, ordered by
hash bucket, so a bucket's slice is read alone. Phase 2 (`pair_bucket`, per bucket): records sharing (band,
hash) become pairs (all pairs in a small group, each member with the group's first in a large one):
`_work/candidates/bucket-NNNNN.npy`. A document is `(shard ordinal, row)` packed in a uint64 (`ROW_BITS`).
Candidates are only proposals: `fuzzy_verify` checks each on the text.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.pipeline.curation.ngrams import mix
from marin_assets.pipeline.curation.shards import CurationError, Shard, read_shard, work_path
from marin_assets.pipeline.curation.shingles import Shingling

STAGE = "fuzzy_dedup"
PAIRWISE_GROUP = 8
"""A band group of up to this many documents is paired all with all (a group's first member may be the
one its others are not similar to); a larger one each with its first, so pairs stay linear in duplicates."""
BATCH_BYTES = 1 << 18
"""Text hashed at once: bounds memory whatever the shard size (`ngrams` keeps tables of 16 bytes per byte of
its largest batch); larger batches are no faster."""
BAND_RECORD = np.dtype([("band", "<u4"), ("hash", "<u8"), ("shard", "<u4"), ("row", "<u4")])
ROW_BITS = np.uint64(32)
ROW_MASK = np.uint64(0xFFFFFFFF)
_Q = np.uint64(0x9E3779B97F4A7C15)


def band_hashes(texts: Sequence[str], shingling: Shingling, num_perm: int, bands: int,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the texts that have n-grams, their band hashes: len × bands uint64). Texts whose MinHash
    rows agree in a band agree in that band's hash; texts without a word (a character) take no part."""
    import rensa

    hashes, offsets = shingling.hashes(texts)
    present = np.flatnonzero(offsets[1:] > offsets[:-1])
    if not len(present):
        return present, np.zeros((0, bands), dtype=np.uint64)
    bounds = np.append(offsets[present], offsets[-1]).astype(np.uint64)
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(hashes, bounds, num_perm, seed)
    rows = matrix.to_rows()
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.uint64, count=len(rows) * num_perm)
    digests = flat.reshape(len(present), bands, num_perm // bands)
    combined = np.zeros((len(present), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(digests.shape[2]):
            combined = combined * _Q + digests[:, :, k]
    return present, mix(combined)


def save_array(path: str, array: np.ndarray) -> None:
    """An array as one `.npy` file, written whole (a phase's work survives a crash only complete)."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    atomic_write(path, buffer.getvalue())


def missing_work(output_path: str, path: str) -> CurationError:
    """The error for a work file a finished phase should have left (a damaged work folder)."""
    return CurationError(f"{STAGE}: work file {path} is missing or short though its phase finished; delete"
                         f" {work_path(output_path)} to start the stage over")


def load_array(output_path: str, path: str) -> np.ndarray:
    """An array a finished phase saved (`save_array`), or `missing_work`."""
    data = read_bytes(path)
    if data is None:
        raise missing_work(output_path, path)
    return np.load(io.BytesIO(data), allow_pickle=False)


def read_work_table(output_path: str, path: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A parquet work file a finished phase wrote (only `columns`, if given), or `missing_work`."""
    data = read_bytes(path)
    if data is None:
        raise missing_work(output_path, path)
    return pq.read_table(pa.BufferReader(data), columns=list(columns) if columns is not None else None)


def _records_path(output_path: str, shard_key: str) -> str:
    return work_path(output_path, "bands", f"{shard_key}.records")


def text_batches(texts: pa.ChunkedArray) -> list[tuple[int, int]]:
    """[start, stop) row ranges of about `BATCH_BYTES` of text each."""
    sizes = np.cumsum(pc.binary_length(texts).to_numpy(zero_copy_only=False).astype(np.int64))
    bounds, start = [], 0
    while start < len(sizes):
        before = sizes[start - 1] if start else 0
        stop = max(int(np.searchsorted(sizes, before + BATCH_BYTES, side="right")), start + 1)
        bounds.append((start, min(stop, len(sizes))))
        start = stop
    return bounds


def band_shard(output_path: str, shingling: Shingling, num_perm: int, bands: int, seed: int, buckets: int,
               item: tuple[int, Shard]) -> dict[str, Any]:
    """Phase 1: one shard's band records in one file, ordered by bucket; how many each bucket got."""
    ordinal, shard = item
    texts = read_shard(STAGE, shard.path, ["id", "text", "source"]).column("text")  # phase 3 reads id and source
    parts = []
    for start, stop in text_batches(texts):
        rows, hashes = band_hashes(texts.slice(start, stop - start).to_pylist(), shingling, num_perm, bands, seed)
        records = np.empty(hashes.size, dtype=BAND_RECORD)
        records["band"] = np.tile(np.arange(bands, dtype=np.uint32), len(rows))
        records["hash"] = hashes.ravel()
        records["shard"] = ordinal
        records["row"] = np.repeat(rows + start, bands)
        parts.append(records)
    records = np.concatenate(parts) if parts else np.empty(0, dtype=BAND_RECORD)
    bucket = (records["hash"] % np.uint64(buckets)).astype(np.int64)
    atomic_write(_records_path(output_path, shard.key), records[np.argsort(bucket, kind="stable")].tobytes())
    return {"documents": len(texts), "with_ngrams": len(records) // bands,
            "bucket_records": np.bincount(bucket, minlength=buckets).tolist()}


def _read_records(output_path: str, shard_key: str, start: int, count: int) -> np.ndarray:
    """`count` band records from `start` of one shard's file: a bucket's slice, read alone."""
    path = _records_path(output_path, shard_key)
    fs, local = fsspec.core.url_to_fs(path)
    size = BAND_RECORD.itemsize
    try:
        data = fs.cat_file(local, start=start * size, end=(start + count) * size)
    except FileNotFoundError:
        raise missing_work(output_path, path) from None
    if len(data) != count * size:
        raise missing_work(output_path, path)
    return np.frombuffer(data, dtype=BAND_RECORD)


def unique_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distinct (a, b) rows, sorted, as an n × 2 uint64 array."""
    pairs = np.stack([a, b], axis=1).astype(np.uint64)
    if not len(pairs):
        return pairs.reshape(0, 2)
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    keep = np.ones(len(pairs), dtype=bool)
    keep[1:] = (pairs[1:] != pairs[:-1]).any(axis=1)
    return pairs[keep]


def pair_bucket(output_path: str, item: tuple[int, list[tuple[str, int, int]]]) -> dict[str, Any]:
    """Phase 2: one bucket's records grouped by (band, hash); the groups' pairs, earlier document first."""
    bucket, slices = item
    parts = [_read_records(output_path, key, start, count) for key, start, count in slices]
    records = np.concatenate(parts) if parts else np.empty(0, dtype=BAND_RECORD)
    doc = (records["shard"].astype(np.uint64) << ROW_BITS) | records["row"].astype(np.uint64)
    order = np.lexsort((doc, records["hash"], records["band"]))
    band, hashes, doc = records["band"][order], records["hash"][order], doc[order]
    first = np.ones(len(doc), dtype=bool)
    first[1:] = (band[1:] != band[:-1]) | (hashes[1:] != hashes[:-1])
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, len(doc)))
    found_a, found_b = [], []
    for size in np.unique(sizes[(sizes >= 2) & (sizes <= PAIRWISE_GROUP)]).tolist():
        combos = np.array(list(itertools.combinations(range(size), 2)))
        at = starts[sizes == size][:, None]
        found_a.append(doc[at + combos[:, 0]].ravel())
        found_b.append(doc[at + combos[:, 1]].ravel())
    member = ~first & (np.repeat(sizes, sizes) > PAIRWISE_GROUP)
    found_a.append(np.repeat(doc[starts], sizes)[member])
    found_b.append(doc[member])
    pairs = unique_pairs(np.concatenate(found_a), np.concatenate(found_b))
    save_array(candidates_path(output_path, bucket), pairs)
    return {"records": len(doc), "groups": int((sizes >= 2).sum()), "pairs": len(pairs)}


def candidates_path(output_path: str, bucket: int) -> str:
    """Where phase 2 keeps the candidate pairs of one hash bucket."""
    return work_path(output_path, "candidates", f"bucket-{bucket:05d}.npy")
