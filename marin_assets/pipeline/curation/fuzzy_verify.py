"""fuzzy_dedup's verification: which candidate pairs are near duplicates on the text, and which documents go.

Phase 3 (`gather_sets`, per shard holding candidates): their texts read once (only the row groups holding
them), their n-gram hash sets (or, with windows, the n-grams in order) sent to the verification task of
each pair's later document: `_work/sets/{shard}/for-{shard}.parquet`, so no task reads another's shards.
Phase 4 (`verify_shard`, per shard of the pairs' later documents, reading one earlier shard's sets at a time
beside its own): the exact Jaccard of each pair's sets and, with a `window`, its least window containment
(`window_containment`); pairs at or above the threshold on both, with ids, sources and snippets:
`_work/verified/{shard}.parquet`. Phase 5 (`cluster`, once, over
verified pairs only — as many as there are duplicates, not documents): in key order a document is removed
iff it has a verified pair with an earlier kept document: removal lists `_work/clusters/{shard}.npy`,
cluster statistics, an audit sample.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.core.files import atomic_write
from marin_assets.pipeline.curation import same_document
from marin_assets.pipeline.curation.fuzzy_candidates import (
    ROW_BITS,
    ROW_MASK,
    STAGE,
    missing_work,
    read_work_table,
    save_array,
    text_batches,
    unique_pairs,
)
from marin_assets.pipeline.curation.ngrams import mix
from marin_assets.pipeline.curation.shards import CurationError, Shard, work_path, write_shard
from marin_assets.pipeline.curation.shingles import Shingling

SAMPLE = 20
"""Removed pairs kept in the result for a person to audit: half the least similar, half spread."""
SNIPPET = 200


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


def ngram_sets(texts: Sequence[str], shingling: Shingling, in_order: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(distinct n-gram hashes of each text, sorted, concatenated; offsets): what Jaccard is computed on.
    `in_order`: every n-gram of each text in text order instead (what window containment reads)."""
    values, counts = [], []
    for start, stop in text_batches(pa.chunked_array([pa.array(texts, pa.string())])):
        hashes, offsets = shingling.hashes(texts[start:stop])
        if in_order:
            values.append(hashes)
            counts.append(np.diff(offsets))
            continue
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


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (a sort and a comparison: faster than `np.unique` on uint64 hashes)."""
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])]


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


def window_containment(sequence: np.ndarray, other: np.ndarray, window: int) -> float:
    """The least, over windows of `window` to 2 × `window` - 1 consecutive n-grams of `sequence` (all of it when
    shorter), of the fraction of the window's n-grams found in `other` (sorted distinct hashes). A copy with
    noise spread through it keeps every window mostly contained; a distinct document sharing only a long
    boilerplate has windows (its own text) that are not, whatever its Jaccard."""
    if not sequence.size:
        return 1.0 if not other.size else 0.0
    if not other.size:
        return 0.0
    found = other[np.minimum(np.searchsorted(other, sequence), other.size - 1)] == sequence
    count = max(sequence.size // window, 1)
    starts = (np.arange(count) * sequence.size) // count
    sizes = np.diff(np.append(starts, sequence.size))
    return float((np.add.reduceat(found.astype(np.int64), starts) / sizes).min())


def gather_sets(output_path: str, shards: Sequence[Shard], shingling: Shingling, in_order: bool, with_text: bool,
                item: tuple[int, np.ndarray]) -> dict[str, Any]:
    """Phase 3: one shard's documents that take part in candidate pairs, read and hashed once, their n-gram
    sets (`in_order`: sequences; `with_text`: and their texts, for `same_document`) sent to each verification task
    that needs them (the task of the pair's later document's shard)."""
    ordinal, needs = item  # (document, destination shard ordinal) rows
    docs = np.unique(needs[:, 0])
    table = _read_rows(shards[ordinal].path, (docs & ROW_MASK).astype(np.int64), ["id", "text", "source"])
    texts = table.column("text").to_pylist()
    values, offsets = ngram_sets(texts, shingling, in_order)
    sets = pa.table({"doc": pa.array(docs, pa.uint64()), "id": table.column("id"), "source": table.column("source"),
                     "snippet": pa.array([_snippet(t) for t in texts], pa.string()),
                     "ngrams": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint64())),
                     **({"text": table.column("text")} if with_text else {})})
    destinations = split_by(needs[:, 0], needs[:, 1])
    for destination, wanted_docs in destinations:
        wanted = np.searchsorted(docs, wanted_docs)
        buffer = io.BytesIO()
        pq.write_table(sets.take(pa.array(wanted)), buffer, compression="none", use_dictionary=False,
                       write_statistics=False)
        atomic_write(_sets_path(output_path, shards[ordinal].key, shards[destination].key), buffer.getvalue())
    return {"documents": len(docs), "destinations": len(destinations)}


def _verified_path(output_path: str, shard_key: str) -> str:
    return work_path(output_path, "verified", f"{shard_key}.parquet")


@dataclass(frozen=True)
class _Sets:
    """One sets file of phase 3 (`gather_sets`), loaded: its documents (sorted) and their n-grams."""

    path: str
    table: pa.Table
    docs: np.ndarray
    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def load(cls, output_path: str, source_key: str, destination_key: str) -> _Sets:
        path = _sets_path(output_path, source_key, destination_key)
        table = read_work_table(output_path, path)
        ngrams = table.column("ngrams").combine_chunks()  # one chunk: one file
        return cls(path, table, table.column("doc").to_numpy(), ngrams.values.to_numpy(), ngrams.offsets.to_numpy())

    def find(self, output_path: str, docs: np.ndarray, also: str) -> np.ndarray:
        """Where `docs` are, or `missing_work` (naming this file and `also`) if any is not."""
        at = np.searchsorted(self.docs, docs)
        if len(docs) and not (self.docs[np.minimum(at, len(self.docs) - 1)] == docs).all():
            raise missing_work(output_path, ", ".join(dict.fromkeys([self.path, also])))
        return at

    def ngrams(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]


def verify_shard(output_path: str, keys: list[str], threshold: float, window: int, align: bool,
                 item: tuple[int, np.ndarray, list[int]]) -> dict[str, Any]:
    """Phase 4: the candidate pairs whose later document is in one shard, checked on their n-gram sets: Jaccard
    >= `threshold` and, with a `window` (> 0), each document's `window_containment` in the other too; with
    `align`, the same document by `same_document.compare` too (its figures kept beside each verified pair). The pairs
    are taken by their earlier document's shard, one sets file at a time beside this shard's own: memory holds
    two shards' sets, however many shards send theirs."""
    ordinal, pairs, _ = item
    own = _Sets.load(output_path, keys[ordinal], keys[ordinal])
    own_distinct: dict[int, np.ndarray] = {}
    parts = [_verify_from(output_path, keys, ordinal, source, pairs[rows], own, own_distinct, threshold, window,
                          align)
             for source, rows in split_by(np.arange(len(pairs)), pairs[:, 0] >> ROW_BITS)]  # rows stay in order
    write_shard(pa.concat_tables(parts), _verified_path(output_path, keys[ordinal]))
    return {"candidates": len(pairs), "verified": sum(p.num_rows for p in parts)}


def _verify_from(output_path: str, keys: list[str], ordinal: int, source: int, pairs: np.ndarray, own: _Sets,
                 own_distinct: dict[int, np.ndarray], threshold: float, window: int, align: bool) -> pa.Table:
    """The verified pairs among `pairs`, whose earlier documents are all in shard `source` (its sets file is
    loaded here, and let go on return)."""
    earlier = own if source == ordinal else _Sets.load(output_path, keys[source], keys[ordinal])
    at_a = earlier.find(output_path, pairs[:, 0], own.path)
    at_b = own.find(output_path, pairs[:, 1], earlier.path)
    passed, similarity = _verified(earlier, at_a, own, at_b, own_distinct if earlier is own else {}, own_distinct,
                                   threshold, window)
    evidence: list[dict[str, float]] | None = None
    if align:
        evidence = []
        texts_a, texts_b = earlier.table.column("text"), own.table.column("text")
        for k in np.flatnonzero(passed).tolist():
            comparison = same_document.compare(texts_a[int(at_a[k])].as_py(), texts_b[int(at_b[k])].as_py())
            passed[k] = comparison.same()
            if passed[k]:
                evidence.append(comparison.as_dict())
    return _verified_table(pairs, passed, similarity, earlier.table, at_a, own.table, at_b, evidence)


def _verified(earlier: _Sets, at_a: np.ndarray, later: _Sets, at_b: np.ndarray, earlier_distinct: dict[int, np.ndarray],
              later_distinct: dict[int, np.ndarray], threshold: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(which pairs pass, their Jaccard) for pairs (earlier document `at_a[k]`, later `at_b[k]`); `*_distinct`: the
    documents' distinct n-grams, made once per document (with windows the files hold n-grams in order)."""

    def distinct(sets: _Sets, made: dict[int, np.ndarray], i: int) -> np.ndarray:
        if not window:
            return sets.ngrams(i)
        if i not in made:
            made[i] = _distinct(sets.ngrams(i))
        return made[i]

    similarity = np.array([_jaccard_from(distinct(earlier, earlier_distinct, i), distinct(later, later_distinct, j),
                                         threshold) for i, j in zip(at_a.tolist(), at_b.tolist(), strict=True)],
                          dtype=np.float64)
    keep = similarity >= threshold
    for k in np.flatnonzero(keep).tolist() if window else ():
        i, j = int(at_a[k]), int(at_b[k])
        keep[k] = min(window_containment(earlier.ngrams(i), distinct(later, later_distinct, j), window),
                      window_containment(later.ngrams(j), distinct(earlier, earlier_distinct, i), window)) >= threshold
    return keep, similarity


def _verified_table(pairs: np.ndarray, keep: np.ndarray, similarity: np.ndarray, earlier: pa.Table, at_a: np.ndarray,
                    later: pa.Table, at_b: np.ndarray, evidence: list[dict[str, float]] | None = None) -> pa.Table:
    """The verified pairs with both documents' ids, sources and snippets (phase 5 and the audit sample read them),
    and what the alignment found (`evidence`, one per kept pair, when the texts were aligned)."""
    kept = {"a": (earlier, pa.array(at_a[keep])), "b": (later, pa.array(at_b[keep]))}
    aligned = {} if evidence is None else {"evidence": pa.array(evidence, pa.map_(pa.string(), pa.float64()))}
    return pa.table({**aligned,
        "a": pa.array(pairs[keep, 0], pa.uint64()), "b": pa.array(pairs[keep, 1], pa.uint64()),
        "jaccard": pa.array(similarity[keep], pa.float64()),
        **{f"{side}_{name}": kept[side][0].column(name).take(kept[side][1])
           for side in "ab" for name in ("id", "source", "snippet")}})


def _jaccard_from(a: np.ndarray, b: np.ndarray, threshold: float) -> float:
    """`jaccard(a, b)`, or 0 without comparing when the sizes alone keep it below `threshold` (Jaccard is at most
    the smaller set's size over the larger's; the margin keeps a pair exactly at the threshold compared)."""
    small, large = sorted((a.size, b.size))
    if small < threshold * large * (1 - 1e-9):
        return 0.0
    return jaccard(a, b)


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


def cluster(output_path: str, keys: list[str], verified_ordinals: list[int], item: str) -> dict[str, Any]:
    """Phase 5: in key order, a document is removed iff it has a verified pair with an earlier kept document."""
    parts = [read_work_table(output_path, _verified_path(output_path, keys[o]), ["a", "b", "jaccard"])
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
    for ordinal in np.unique(gone >> ROW_BITS).tolist():
        rows = (gone[(gone >> ROW_BITS) == ordinal] & ROW_MASK).astype(np.int64)
        save_array(work_path(output_path, "clusters", f"{keys[ordinal]}.npy"), rows)
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
        table = read_work_table(output_path, _verified_path(output_path, keys[ordinal])).to_pylist()
        found += [row for row in table if (row["a"], row["b"]) in wanted]
    return [{"removed_id": r["b_id"], "removed_source": r["b_source"], "kept_id": r["a_id"],
             "kept_source": r["a_source"], "jaccard": round(r["jaccard"], 4), "removed_snippet": r["b_snippet"],
             "kept_snippet": r["a_snippet"], **({"evidence": dict(r["evidence"])} if r.get("evidence") else {})}
            for r in found]


def split_by(rows: np.ndarray, group: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """`rows` split by `group` (one value per row), groups in ascending order, rows in their order."""
    if not len(rows):
        return []
    order = np.argsort(group, kind="stable")
    values, first = np.unique(group[order], return_index=True)
    return list(zip(values.tolist(), np.split(rows[order], first[1:]), strict=True))


def verification_plan(pairs: np.ndarray) -> tuple[list[tuple[int, np.ndarray]], list[tuple[int, np.ndarray,
                                                                                                 list[int]]]]:
    """The items of phases 3 and 4. A pair is verified by the task of its later document's shard; each document's n-gram
    set is made once, by the task of its own shard, and sent to every verification task that needs it."""
    destination = pairs[:, 1] >> ROW_BITS
    needs = unique_pairs(np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([destination, destination]))
    gather = split_by(needs, needs[:, 0] >> ROW_BITS)
    verify = [(d, mine, np.unique(mine >> ROW_BITS).tolist()) for d, mine in split_by(pairs, destination)]
    return gather, verify
