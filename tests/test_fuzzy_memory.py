"""fuzzy_dedup's memory stays bounded by a shard, not the corpus: verification holds two shards' n-gram sets at a
time however many shards send theirs (and still verifies every pair), and shards are read and written on an Arrow
pool that hands freed memory back (`shards.returning_memory`, `FuzzyDedup.returns_memory`), the previous
default restored after."""

import gc
import re
import weakref

import pyarrow as pa
import pytest

from marin_assets.pipeline.curation import fuzzy_verify
from marin_assets.pipeline.curation.filters import CurationFilter
from marin_assets.pipeline.curation.fuzzy_dedup import FuzzyDedup, fuzzy_dedup
from marin_assets.pipeline.curation.shards import document_id, read_shard, returning_memory, shard_path, write_shard
from tests.support.curation import documents
from tests.support.helpers import wait_for

WORD = re.compile(r"[a-z0-9\u0080-\U0010ffff]+")
EARLIER_SHARDS = 5


def five_grams(text: str) -> set[tuple[str, ...]]:
    """Word 5-grams on the words themselves (an independent reference for the stage's hashed Jaccard)."""
    words = WORD.findall(text.lower())
    return {tuple(words[i:i + 5]) for i in range(len(words) - 4)}


def jaccard(a: str, b: str) -> float:
    x, y = five_grams(a), five_grams(b)
    return len(x & y) / len(x | y)


def near_copy(text: str) -> str:
    """`text` with one word in the middle replaced: a near copy (it changes at most 5 of its 5-grams)."""
    words = text.split(" ")
    words[len(words) // 2] = "planted"
    return " ".join(words)


@pytest.fixture(scope="module")
def spread(planted, tmp_path_factory):
    """Real documentation in 5 shards of 3 distinct documents, and a last shard holding a near copy of one
    document of each: its verification needs the sets of every earlier shard. (dataset path, originals, copies)."""
    texts, chosen = [row["text"] for row in documents(planted.normalized)], []
    for text in sorted(texts, key=len, reverse=True):  # long ones: a one-word edit keeps them near
        if len(chosen) == 3 * EARLIER_SHARDS:
            break
        if len(five_grams(text)) > 300 and all(jaccard(text, other) < 0.3 for other in chosen):
            chosen.append(text)
    assert len(chosen) == 3 * EARLIER_SHARDS
    root = str(tmp_path_factory.mktemp("spread") / "data")
    originals = [chosen[3 * shard + 1] for shard in range(EARLIER_SHARDS)]
    copies = [near_copy(text) for text in originals]
    for shard, rows in enumerate([chosen[3 * s:3 * s + 3] for s in range(EARLIER_SHARDS)] + [copies]):
        write_shard(pa.table({"id": [document_id(t) for t in rows], "text": rows,
                              "source": [f"spread-{shard}:{line}" for line in range(len(rows))]}),
                    shard_path(root, "train", shard))
    return root, originals, copies


def test_verification_holds_two_shards_sets_at_a_time_and_verifies_every_pair(spread, tmp_path, monkeypatch):
    root, originals, copies = spread
    loads, refs, most = [], [], [0]
    load = fuzzy_verify._Sets.load.__func__

    def counted(cls, output_path, source_key, destination_key):
        loaded = load(cls, output_path, source_key, destination_key)
        refs.append(weakref.ref(loaded))
        most[0] = max(most[0], sum(ref() is not None for ref in refs))  # sets files held at once
        loads.append((source_key, destination_key))
        return loaded

    monkeypatch.setattr(fuzzy_verify._Sets, "load", classmethod(counted))
    result = fuzzy_dedup(str(tmp_path / "out"), root)

    last = f"train-{EARLIER_SHARDS:05d}"
    assert sorted(s for s, d in loads if d == last) == sorted([f"train-{s:05d}" for s in range(EARLIER_SHARDS)]
                                                             + [last])  # each file once, its own among them
    assert most[0] == 2
    assert result.verified_pairs == EARLIER_SHARDS
    assert result.documents_in - result.documents_out == EARLIER_SHARDS
    kept = {row["text"] for row in documents(result.path, ("text",))}
    assert kept.isdisjoint(copies) and set(originals) <= kept
    for pair in result.removed_sample:
        removed, original = next((c, o) for c, o in zip(copies, originals, strict=True)
                                 if document_id(c) == pair.removed_id)
        assert pair.kept_id == document_id(original)
        assert pair.jaccard == pytest.approx(jaccard(removed, original), abs=1e-4)


def test_fuzzy_dedup_reads_on_a_pool_that_hands_memory_back_and_the_default_comes_back(spread):
    root, _, _ = spread
    assert FuzzyDedup.returns_memory and not CurationFilter.returns_memory  # the others keep Arrow's faster pool
    before = pa.default_memory_pool().backend_name
    with returning_memory():
        pool = pa.default_memory_pool()
        assert pool.backend_name in ("jemalloc", "system")
        held = pool.bytes_allocated()
        table = read_shard("test", shard_path(root, "train", 0))
        text_bytes = sum(len(t.encode()) for t in table.column("text").to_pylist())
        while_held = pool.bytes_allocated()
        assert while_held >= held + text_bytes
        del table
        gc.collect()
        # Arrow's reader threads drop their last references to the buffers a moment after `read` returns (a
        # failed run printed the pool at 0 bytes just after this check saw the table's bytes): wait for it.
        wait_for(lambda: pool.bytes_allocated() <= while_held - text_bytes, "the shard's buffers to be freed", 30)
    assert pa.default_memory_pool().backend_name == before
