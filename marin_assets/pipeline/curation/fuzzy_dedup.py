"""fuzzy_dedup: remove near-duplicate documents (MinHash LSH), every removal verified on the text.

Marin's recipe: MinHash over word n-grams (286 permutations in 26 bands of 11 rows) proposes
candidate pairs, and a pair counts only once the two documents' actual n-gram Jaccard similarity
reaches `threshold`: LSH buckets chained without that check once collapsed a whole source to 2
documents (marin#6854). A document is removed only for a verified pair with an *earlier* document
that is kept, so every removed document has a kept near-twin and a chain of small edits never
takes its far end with it.

A document is `(shard ordinal, row)` packed in a uint64 (ordinals in `list_shards` order: key
order is split, shard index, row). Phases (`stage.run_phase`: resumable per item, fanned out),
each item's outcome at `_work/{phase}/{key}.json` beside its data:

1. `bands`, per shard: n-gram hashes (`ngrams`), MinHash rows (rensa), one uint64 per band. Its
   records (band, band hash, shard ordinal, row) go to one file, `_work/bands/{shard}.records`,
   ordered by hash bucket, so a bucket's slice is read alone.
2. `candidates`, per bucket: records sharing (band, hash) become pairs (all pairs in a small
   group, each member with the group's first in a large one): `_work/candidates/bucket-NNNNN.npy`.
3. `sets`, per shard holding candidates: their texts read once (only the row groups holding them),
   their n-gram hash sets sent to the verification task of each pair's later document:
   `_work/sets/{shard}/for-{shard}.parquet`. So no task reads another's shards.
4. `verified`, per shard of the pairs' later documents: the exact Jaccard of each pair's sets;
   pairs at or above `threshold`, with ids, sources and snippets: `_work/verified/{shard}.parquet`.
5. `clusters`, once, in this process, over verified pairs only (as many as there are duplicates,
   not documents): removal lists `_work/clusters/{shard}.npy`, cluster statistics, an audit sample.
6. `shards`: every shard rewritten without its removed rows (reason `near-duplicate`).
"""

from __future__ import annotations

import functools
import io
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.ngrams import mix, ngram_hashes
from marin_assets.pipeline.curation.shards import CurationError, Shard, list_shards, read_shard, work_path, write_shard
from marin_assets.pipeline.curation.stage import (
    CurationResult,
    Verdicts,
    curation_step,
    filter_shards,
    run_phase,
)

STAGE = "fuzzy_dedup"
REASON = "near-duplicate"
PAIRWISE_GROUP = 8
"""A band group of up to this many documents is paired all with all (a group's first member may be the
one its others are not similar to); a larger one each with its first, so pairs stay linear in duplicates."""
SAMPLE = 20
"""Removed pairs kept in the result for a person to audit: half the least similar, half spread."""
SNIPPET = 200
BATCH_BYTES = 1 << 18
"""Text hashed at once: bounds memory whatever the shard size (`ngrams` keeps tables of 16 bytes per byte of
its largest batch); larger batches are no faster."""
BAND_RECORD = np.dtype([("band", "<u4"), ("hash", "<u8"), ("shard", "<u4"), ("row", "<u4")])
_ROW_BITS = np.uint64(32)
_ROW_MASK = np.uint64(0xFFFFFFFF)
_Q = np.uint64(0x9E3779B97F4A7C15)
ALGORITHM = {"ngrams": "ngrams.ngram_hashes-v1", "signature": "rensa.RMinHash", "band": "polynomial-splitmix64",
             "candidates": f"pairwise-up-to-{PAIRWISE_GROUP}-else-first", "verify": "ngram-set-jaccard",
             "keep": "earliest-kept-verified-twin"}
"""What decides the output besides the numbers: enters the step's identity (with rensa's algorithm version)."""


@dataclass(frozen=True)
class RemovedPair:
    """One removed document and the kept document it duplicates, for a person to audit."""

    removed_id: str
    """Content id of the removed document (equal to `kept_id` for an exact copy)."""
    removed_source: str
    """Where the removed document came from (`file:line`)."""
    kept_id: str
    """Content id of the earlier, kept document it is verified similar to."""
    kept_source: str
    """Where the kept document came from."""
    jaccard: float
    """Exact Jaccard similarity of the two documents' n-gram sets (>= the threshold)."""
    removed_snippet: str
    """The start of the removed text, whitespace collapsed (at most `SNIPPET` characters)."""
    kept_snippet: str
    """The start of the kept text, likewise: the two side by side show what the edit was."""


@dataclass(frozen=True)
class FuzzyDedupResult(CurationResult):
    """A curation result with what MinHash proposed, what the text confirmed, and the clusters."""

    candidate_pairs: int
    """Distinct pairs sharing at least one band: what LSH proposed."""
    verified_pairs: int
    """Candidate pairs whose exact n-gram Jaccard reached the threshold: the only pairs acted on."""
    clusters: int
    """Connected components of verified pairs with 2 or more documents."""
    largest_cluster: int
    """Documents in the largest cluster (0 when none): a huge one deserves a look."""
    cluster_sizes: dict[str, int]
    """Cluster size (as text) → how many clusters have it."""
    removed_sample: list[RemovedPair]
    """Up to `SAMPLE` removed documents with their kept twin: the least similar half and a spread half."""


def _parameter_problem(ngram: int, num_perm: int, bands: int, threshold: float, buckets: int) -> str | None:
    if ngram < 1:
        return f"ngram must be at least 1, got {ngram}"
    if bands < 1 or num_perm < bands or num_perm % bands:
        return f"num_perm {num_perm} must be a positive multiple of bands {bands} (each band takes num_perm/bands rows)"
    if not 0 < threshold <= 1:
        return f"threshold must be in (0, 1], got {threshold}"
    if buckets < 1:
        return f"buckets must be at least 1, got {buckets}"
    return None


def band_hashes(texts: Sequence[str], ngram: int, num_perm: int, bands: int, seed: int) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """(indices of the texts that have n-grams, their band hashes: len × bands uint64). Texts whose MinHash
    rows agree in a band agree in that band's hash; texts without a word take no part."""
    import rensa

    hashes, offsets = ngram_hashes(texts, ngram)
    present = np.flatnonzero(offsets[1:] > offsets[:-1])
    if not len(present):
        return present, np.zeros((0, bands), dtype=np.uint64)
    bounds = np.append(offsets[present], offsets[-1]).astype(np.uint64)
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(hashes, bounds, num_perm, seed)
    rows = matrix.to_rows()
    digests = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.uint64, count=len(rows) * num_perm)
    digests = digests.reshape(len(present), bands, num_perm // bands)
    combined = np.zeros((len(present), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(digests.shape[2]):
            combined = combined * _Q + digests[:, :, k]
    return present, mix(combined)


def _save(path: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    atomic_write(path, buffer.getvalue())


def _missing(output_path: str, path: str) -> CurationError:
    return CurationError(f"{STAGE}: work file {path} is missing or short though its phase finished; delete"
                         f" {work_path(output_path)} to start the stage over")


def _load(output_path: str, path: str) -> np.ndarray:
    data = read_bytes(path)
    if data is None:
        raise _missing(output_path, path)
    return np.load(io.BytesIO(data), allow_pickle=False)


def _read_work_table(output_path: str, path: str, columns: Sequence[str] | None = None) -> pa.Table:
    data = read_bytes(path)
    if data is None:
        raise _missing(output_path, path)
    return pq.read_table(pa.BufferReader(data), columns=list(columns) if columns is not None else None)


def _records_path(output_path: str, shard_key: str) -> str:
    return work_path(output_path, "bands", f"{shard_key}.records")


def _text_batches(texts: pa.ChunkedArray) -> list[tuple[int, int]]:
    """[start, stop) row ranges of about `BATCH_BYTES` of text each."""
    sizes = np.cumsum(pc.binary_length(texts).to_numpy(zero_copy_only=False).astype(np.int64))
    bounds, start = [], 0
    while start < len(sizes):
        before = sizes[start - 1] if start else 0
        stop = max(int(np.searchsorted(sizes, before + BATCH_BYTES, side="right")), start + 1)
        bounds.append((start, min(stop, len(sizes))))
        start = stop
    return bounds


def _band_shard(output_path: str, ngram: int, num_perm: int, bands: int, seed: int, buckets: int,
                item: tuple[int, Shard]) -> dict[str, Any]:
    """Phase 1: one shard's band records in one file, ordered by bucket; how many each bucket got."""
    ordinal, shard = item
    texts = read_shard(STAGE, shard.path, ["id", "text", "source"]).column("text")  # phase 3 reads id and source
    parts = []
    for start, stop in _text_batches(texts):
        rows, hashes = band_hashes(texts.slice(start, stop - start).to_pylist(), ngram, num_perm, bands, seed)
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
        raise _missing(output_path, path) from None
    if len(data) != count * size:
        raise _missing(output_path, path)
    return np.frombuffer(data, dtype=BAND_RECORD)


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distinct (a, b) rows, sorted, as an n × 2 uint64 array."""
    pairs = np.stack([a, b], axis=1).astype(np.uint64)
    if not len(pairs):
        return pairs.reshape(0, 2)
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    keep = np.ones(len(pairs), dtype=bool)
    keep[1:] = (pairs[1:] != pairs[:-1]).any(axis=1)
    return pairs[keep]


def _pair_bucket(output_path: str, item: tuple[int, list[tuple[str, int, int]]]) -> dict[str, Any]:
    """Phase 2: one bucket's records grouped by (band, hash); the groups' pairs, earlier document first."""
    bucket, slices = item
    parts = [_read_records(output_path, key, start, count) for key, start, count in slices]
    records = np.concatenate(parts) if parts else np.empty(0, dtype=BAND_RECORD)
    doc = (records["shard"].astype(np.uint64) << _ROW_BITS) | records["row"].astype(np.uint64)
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
    pairs = _unique_pairs(np.concatenate(found_a), np.concatenate(found_b))
    _save(_candidates_path(output_path, bucket), pairs)
    return {"records": len(doc), "groups": int((sizes >= 2).sum()), "pairs": len(pairs)}


def _candidates_path(output_path: str, bucket: int) -> str:
    return work_path(output_path, "candidates", f"bucket-{bucket:05d}.npy")


def _read_rows(path: str, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
    """`rows` (sorted, distinct) of a shard, in that order, reading only the row groups that hold them."""
    try:
        with fsspec.open(path, "rb") as f:
            parquet = pq.ParquetFile(f)
            sizes = np.array([parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)],
                             dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(sizes)])
            if len(rows) and rows[-1] >= starts[-1]:
                raise CurationError(f"{STAGE}: shard {path} row {int(rows[-1])}: no such row (it has {starts[-1]});"
                                    " the input changed while the stage ran")
            group_of = np.searchsorted(starts, rows, side="right") - 1
            groups = np.unique(group_of)
            table = parquet.read_row_groups(groups.tolist(), columns=list(columns))
    except FileNotFoundError:
        raise CurationError(f"{STAGE}: shard {path} is missing") from None
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise CurationError(f"{STAGE}: shard {path} is unreadable: {e}") from None
    base = np.concatenate([[0], np.cumsum(sizes[groups])])[:-1]
    local = base[np.searchsorted(groups, group_of)] + rows.astype(np.int64) - starts[group_of]
    return table.take(pa.array(local))


def _snippet(text: str) -> str:
    return " ".join(text[:SNIPPET * 4].split())[:SNIPPET]


def ngram_sets(texts: Sequence[str], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct n-gram hashes of each text, sorted, concatenated; offsets): what Jaccard is computed on."""
    values, counts = [], []
    for start, stop in _text_batches(pa.chunked_array([pa.array(texts, pa.string())])):
        hashes, offsets = ngram_hashes(texts[start:stop], ngram)
        sizes = np.diff(offsets)
        ordered = np.concatenate([np.sort(hashes[lo:hi]) for lo, hi in itertools.pairwise(offsets.tolist())])
        keep = np.ones(len(ordered), dtype=bool)
        keep[1:] = ordered[1:] != ordered[:-1]
        keep[offsets[:-1][sizes > 0]] = True  # each document's first n-gram, even if the one before ends the same
        values.append(ordered[keep])
        counts.append(np.bincount(np.repeat(np.arange(stop - start), sizes)[keep], minlength=stop - start))
    if not values:
        return np.zeros(0, dtype=np.uint64), np.zeros(1, dtype=np.int64)
    return np.concatenate(values), np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int64)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted arrays of distinct hashes."""
    if not a.size or not b.size:
        return 1.0 if a.size == b.size else 0.0
    if a.size > b.size:
        a, b = b, a
    common = int(np.count_nonzero(b[np.minimum(np.searchsorted(b, a), b.size - 1)] == a))
    return common / (a.size + b.size - common)


def _sets_path(output_path: str, source_key: str, destination_key: str) -> str:
    return work_path(output_path, "sets", source_key, f"for-{destination_key}.parquet")


def _gather_sets(output_path: str, shards: list[Shard], ngram: int, item: tuple[int, np.ndarray]) -> dict[str, Any]:
    """Phase 3: one shard's documents that take part in candidate pairs, read and hashed once, their n-gram
    sets sent to each verification task that needs them (the task of the pair's later document's shard)."""
    ordinal, needs = item  # (document, destination shard ordinal) rows
    docs = np.unique(needs[:, 0])
    table = _read_rows(shards[ordinal].path, (docs & _ROW_MASK).astype(np.int64), ["id", "text", "source"])
    texts = table.column("text").to_pylist()
    values, offsets = ngram_sets(texts, ngram)
    sets = pa.table({"doc": pa.array(docs, pa.uint64()), "id": table.column("id"), "source": table.column("source"),
                     "snippet": pa.array([_snippet(t) for t in texts], pa.string()),
                     "ngrams": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint64()))})
    destinations = _split_by(needs[:, 0], needs[:, 1])
    for destination, wanted_docs in destinations:
        wanted = np.searchsorted(docs, wanted_docs)
        buffer = io.BytesIO()
        pq.write_table(sets.take(pa.array(wanted)), buffer, compression="none", use_dictionary=False,
                       write_statistics=False)
        atomic_write(_sets_path(output_path, shards[ordinal].key, shards[destination].key), buffer.getvalue())
    return {"documents": len(docs), "destinations": len(destinations)}


def _verified_path(output_path: str, shard_key: str) -> str:
    return work_path(output_path, "verified", f"{shard_key}.parquet")


def _verify_shard(output_path: str, keys: list[str], threshold: float,
                  item: tuple[int, np.ndarray, list[int]]) -> dict[str, Any]:
    """Phase 4: the candidate pairs whose later document is in one shard, checked on their n-gram sets."""
    ordinal, pairs, sources = item
    paths = [_sets_path(output_path, keys[s], keys[ordinal]) for s in sources]
    sets = pa.concat_tables([_read_work_table(output_path, p) for p in paths])
    docs = sets.column("doc").to_numpy()
    ngrams = sets.column("ngrams").combine_chunks()
    values, offsets = ngrams.values.to_numpy(), ngrams.offsets.to_numpy()
    at_a, at_b = np.searchsorted(docs, pairs[:, 0]), np.searchsorted(docs, pairs[:, 1])
    if len(pairs) and not ((docs[np.minimum(at_a, len(docs) - 1)] == pairs[:, 0]).all()
                           and (docs[np.minimum(at_b, len(docs) - 1)] == pairs[:, 1]).all()):
        raise _missing(output_path, ", ".join(paths))
    similarity = np.array([jaccard(values[offsets[i]:offsets[i + 1]], values[offsets[j]:offsets[j + 1]])
                           for i, j in zip(at_a.tolist(), at_b.tolist(), strict=True)], dtype=np.float64)
    keep = similarity >= threshold
    kept = {side: pa.array(at[keep]) for side, at in (("a", at_a), ("b", at_b))}
    table = pa.table({
        "a": pa.array(pairs[keep, 0], pa.uint64()), "b": pa.array(pairs[keep, 1], pa.uint64()),
        "jaccard": pa.array(similarity[keep], pa.float64()),
        **{f"{side}_{name}": sets.column(name).take(kept[side])
           for side in "ab" for name in ("id", "source", "snippet")}})
    write_shard(table, _verified_path(output_path, keys[ordinal]))
    return {"candidates": len(pairs), "verified": int(keep.sum())}


def _components(a: list[int], b: list[int]) -> list[int]:
    """Sizes of the connected components of the graph with edges (a[i], b[i]) (union-find)."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x, y in zip(a, b, strict=True):
        rx, ry = root(x), root(y)
        if rx != ry:
            parent[max(rx, ry)] = min(rx, ry)
    sizes: dict[int, int] = {}
    for x in parent:
        r = root(x)
        sizes[r] = sizes.get(r, 0) + 1
    return list(sizes.values())


def _cluster(output_path: str, keys: list[str], verified_ordinals: list[int], item: str) -> dict[str, Any]:
    """Phase 5: in key order, a document is removed iff it has a verified pair with an earlier kept document."""
    parts = [_read_work_table(output_path, _verified_path(output_path, keys[o]), ["a", "b", "jaccard"])
             for o in verified_ordinals]
    table = pa.concat_tables(parts) if parts else pa.table({"a": pa.array([], pa.uint64()),
                                                            "b": pa.array([], pa.uint64()),
                                                            "jaccard": pa.array([], pa.float64())})
    a, b, similarity = (table.column(n).to_numpy() for n in ("a", "b", "jaccard"))
    order = np.lexsort((a, -similarity, b))  # each document's earlier twins, the most similar first
    removed: dict[int, tuple[int, float]] = {}
    for x, y, s in zip(a[order].tolist(), b[order].tolist(), similarity[order].tolist(), strict=True):
        if y not in removed and x not in removed:
            removed[y] = (x, s)
    gone = np.array(sorted(removed), dtype=np.uint64)
    counts: dict[str, int] = {}
    for ordinal in np.unique(gone >> _ROW_BITS).tolist():
        rows = (gone[(gone >> _ROW_BITS) == ordinal] & _ROW_MASK).astype(np.int64)
        _save(work_path(output_path, "clusters", f"{keys[ordinal]}.npy"), rows)
        counts[keys[ordinal]] = len(rows)
    sizes = _components(a.tolist(), b.tolist())
    histogram: dict[str, int] = {}
    for size in sorted(sizes):
        histogram[str(size)] = histogram.get(str(size), 0) + 1
    return {"removed": counts, "verified_pairs": len(a), "clusters": len(sizes),
            "largest_cluster": max(sizes, default=0), "cluster_sizes": histogram,
            "sample": _sample(output_path, keys, removed)}


def _sample(output_path: str, keys: list[str], removed: dict[int, tuple[int, float]]) -> list[dict[str, Any]]:
    """Up to `SAMPLE` removed pairs: the least similar half (where a wrong removal would be), then a spread
    (by a hash of the document key), read back from the verified pairs of their shards."""
    least = sorted(removed, key=lambda y: (removed[y][1], y))[:SAMPLE // 2]
    rest = np.array(sorted(set(removed) - set(least)), dtype=np.uint64)
    spread = rest[np.argsort(mix(rest), kind="stable")][:SAMPLE - len(least)].tolist()
    chosen = sorted(least + spread)
    found = []
    for ordinal, group in itertools.groupby(chosen, key=lambda y: y >> 32):
        wanted = {(removed[y][0], y) for y in group}
        table = _read_work_table(output_path, _verified_path(output_path, keys[ordinal])).to_pylist()
        found += [row for row in table if (row["a"], row["b"]) in wanted]
    return [{"removed_id": r["b_id"], "removed_source": r["b_source"], "kept_id": r["a_id"],
             "kept_source": r["a_source"], "jaccard": round(r["jaccard"], 4), "removed_snippet": r["b_snippet"],
             "kept_snippet": r["a_snippet"]} for r in found]


def _decide(output_path: str, path: str | None, expected: int, table: pa.Table) -> Verdicts:
    """Phase 6's verdicts for one shard: its rows in the removal list go."""
    rows = _load(output_path, path) if path else np.zeros(0, np.int64)
    if len(rows) != expected or (len(rows) and rows.max() >= table.num_rows):
        raise CurationError(f"{STAGE}: removal list {path} holds {len(rows)} rows up to row"
                            f" {int(rows.max()) if len(rows) else -1}, expected {expected} rows of a shard of"
                            f" {table.num_rows}; delete its _work folder to start over")
    removed: list[str | None] = [None] * table.num_rows
    for row in rows.tolist():
        removed[row] = REASON
    return Verdicts(removed)


def _decider(output_path: str, counts: dict[str, int], shard: Shard) -> Callable[[Any], Verdicts]:
    """Phase 6: the verdicts of one shard, from its removal list."""
    count = counts.get(shard.key, 0)
    path = work_path(output_path, "clusters", f"{shard.key}.npy") if count else None
    return functools.partial(_decide, output_path, path, count)


def _split_by(rows: np.ndarray, group: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """`rows` split by `group` (one value per row), groups in ascending order, rows in their order."""
    if not len(rows):
        return []
    order = np.argsort(group, kind="stable")
    values, first = np.unique(group[order], return_index=True)
    return list(zip(values.tolist(), np.split(rows[order], first[1:]), strict=True))


def _verification_plan(pairs: np.ndarray) -> tuple[list[tuple[int, np.ndarray]], list[tuple[int, np.ndarray,
                                                                                                 list[int]]]]:
    """The items of phases 3 and 4. A pair is verified by the task of its later document's shard; each document's n-gram
    set is made once, by the task of its own shard, and sent to every verification task that needs it."""
    destination = pairs[:, 1] >> _ROW_BITS
    needs = _unique_pairs(np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([destination, destination]))
    gather = _split_by(needs, needs[:, 0] >> _ROW_BITS)
    verify = [(d, mine, np.unique(mine >> _ROW_BITS).tolist()) for d, mine in _split_by(pairs, destination)]
    return gather, verify


def fuzzy_dedup(output_path: str, dataset_path: str, ngram: int = 5, num_perm: int = 286, bands: int = 26,
                threshold: float = 0.8, seed: int = 1, buckets: int = 16, workers: int = 1) -> FuzzyDedupResult:
    """Remove the near-duplicates of a normalized dataset: MinHash LSH over word `ngram`s proposes pairs,
    their exact n-gram Jaccard (>= `threshold`) confirms them, and each document with a confirmed pair
    to an earlier kept one goes. `buckets`: how the band hashes are split for the global grouping."""
    problem = _parameter_problem(ngram, num_perm, bands, threshold, buckets)
    if problem:
        raise ValueError(f"{STAGE}: {problem}")
    shards = list_shards(STAGE, dataset_path)
    keys = [s.key for s in shards]
    banded = run_phase(output_path, "bands", list(enumerate(shards)),
                       functools.partial(_band_shard, output_path, ngram, num_perm, bands, seed, buckets),
                       key_of=lambda item: item[1].key, workers=workers, name=f"{STAGE} bands of {len(shards)} shards")
    counts = np.array([o["bucket_records"] for o in banded], dtype=np.int64).reshape(len(shards), buckets)
    starts = np.cumsum(counts, axis=1) - counts
    per_bucket = [(b, [(keys[i], int(starts[i, b]), int(counts[i, b])) for i in np.flatnonzero(counts[:, b])])
                  for b in range(buckets)]
    run_phase(output_path, "candidates", per_bucket, functools.partial(_pair_bucket, output_path),
              key_of=lambda item: f"bucket-{item[0]:05d}", workers=workers, name=f"{STAGE} {buckets} buckets")
    pairs = _unique_pairs(*np.concatenate([_load(output_path, _candidates_path(output_path, b))
                                           for b in range(buckets)]).T)
    gather, verify = _verification_plan(pairs)
    run_phase(output_path, "sets", gather, functools.partial(_gather_sets, output_path, shards, ngram),
              key_of=lambda item: keys[item[0]], workers=workers, name=f"{STAGE} n-gram sets of {len(gather)} shards")
    run_phase(output_path, "verified", verify, functools.partial(_verify_shard, output_path, keys, threshold),
              key_of=lambda item: keys[item[0]], workers=workers, name=f"{STAGE} verification of {len(pairs)} pairs")
    clustered = run_phase(output_path, "clusters", ["all"],
                          functools.partial(_cluster, output_path, keys, [item[0] for item in verify]),
                          key_of=str, workers=1)[0]
    summary = filter_shards(STAGE, output_path, shards, workers=workers,
                            decide_for=functools.partial(_decider, output_path, clustered["removed"]))
    return FuzzyDedupResult(**summary, candidate_pairs=len(pairs), verified_pairs=clustered["verified_pairs"],
                            clusters=clustered["clusters"], largest_cluster=clustered["largest_cluster"],
                            cluster_sizes=clustered["cluster_sizes"],
                            removed_sample=[RemovedPair(**p) for p in clustered["sample"]])


def fuzzy_dedup_step(name: str, dataset: Step, ngram: int = 5, num_perm: int = 286, bands: int = 26,
                     threshold: float = 0.8, seed: int = 1, buckets: int = 16, workers: int = 1,
                     max_removed_fraction: float = 0.5) -> Step:
    """`dataset` (normalized shards) without its near-duplicates; `buckets` and `workers` only change how."""
    import rensa

    problem = _parameter_problem(ngram, num_perm, bands, threshold, buckets)
    if problem:
        raise StepDefinitionError(f"fuzzy_dedup step {name!r}: {problem}")
    algorithm = {**ALGORITHM, "signature": f"{ALGORITHM['signature']}-v{rensa.RMinHash.ALGORITHM_VERSION}"}
    return curation_step(
        name, STAGE,
        lambda out: fuzzy_dedup(out, dataset.output_path, ngram, num_perm, bands, threshold, seed, buckets, workers),
        dataset, {"ngram": ngram, "num_perm": num_perm, "bands": bands, "threshold": threshold, "seed": seed,
                  "algorithm": algorithm},
        description=made_by(fuzzy_dedup), max_removed_fraction=max_removed_fraction, cpu=1)
