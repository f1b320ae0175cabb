"""normalize and what every curation stage shares: shards, per-shard resumption, counts, the removal check."""

import gzip
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_assets import materialize_step
from marin_assets.core.record import read_record
from marin_assets.pipeline.curation.normalize import normalize, normalize_step
from marin_assets.pipeline.curation.shards import CurationError, document_id, list_shards, read_shard, write_shard
from marin_assets.pipeline.curation.stage import Removed, ShardStats, removed_fraction_within, summarize
from tests.support.curation import documents, kill_when
from tests.support.helpers import subprocess_env


def raw_lines(raw: str) -> dict[str, list[str]]:
    """Every raw JSONL file of the planted corpus (relative path → texts, by line)."""
    found = {}
    for path in sorted(Path(raw).glob("*/*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            found[str(path.relative_to(raw))] = [json.loads(line)["text"] for line in f]
    return found


def test_normalize_keeps_every_document_with_its_content_id_and_source(planted):
    rows = documents(planted.normalized)
    raw = raw_lines(planted.raw)
    assert len(rows) == sum(len(texts) for texts in raw.values()) == planted.truth.documents + 24
    for row in rows:
        file, line = row["source"].rsplit(":", 1)
        assert raw[file][int(line) - 1] == row["text"], row["source"]
        assert row["id"] == document_id(row["text"]) and len(row["id"]) == 32
    result = planted.normalize_result
    assert result.documents_in == result.documents_out == len(rows) and result.removed == {}
    assert set(result.splits) == {"train", "validation"}
    assert result.bytes_out == sum(len(r["text"].encode()) for r in rows)


def test_shards_are_cut_at_the_target_size_within_each_input_file(planted):
    shards = list_shards("test", planted.normalized)
    train = planted.normalize_result.splits["train"]
    assert [s.index for s in shards if s.split == "train"] == list(range(train.shards))
    assert len([s for s in shards if s.split == "train"]) >= 4  # 100 kB shards of ~550 kB of text in two files
    for shard in shards:
        texts = pq.read_table(shard.path, columns=["text"]).column("text").to_pylist()
        size = sum(len(t.encode()) for t in texts)
        assert size - len(texts[-1].encode()) < 100_000, "a shard closes as soon as it reaches the target"
    assert not any(p.name.startswith("part") for p in Path(planted.normalized).glob("_work/files/*/*"))


def test_formats_give_the_same_ids_and_empty_documents_are_removed_with_a_reason(tmp_path):
    texts = ["Ünïcode text\nwith two lines.", "   \n\t", "", "plain ascii", "Ünïcode text\nwith two lines."]
    (tmp_path / "a" / "train").mkdir(parents=True)
    (tmp_path / "b" / "data").mkdir(parents=True)
    lines = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts)
    (tmp_path / "a" / "train" / "x.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.table({"text": texts, "other": list(range(5))}),
                   tmp_path / "b" / "data" / "train-00000-of-00001.parquet")
    results = [normalize(str(tmp_path / f"{n}-out"), str(tmp_path / n)) for n in "ab"]
    ids = [[r["id"] for r in documents(str(tmp_path / f"{n}-out"))] for n in "ab"]
    assert ids[0] == ids[1] == [document_id(t) for t in texts if t.strip()]
    for result in results:
        assert result.removed["empty"].documents == 2 and result.removed["empty"].bytes == len("   \n\t")
        assert (result.documents_in, result.documents_out) == (5, 3)
    assert [r["source"] for r in documents(str(tmp_path / "b-out"))] == [
        "data/train-00000-of-00001.parquet:1", "data/train-00000-of-00001.parquet:4",
        "data/train-00000-of-00001.parquet:5"]


def test_a_killed_normalize_resumes_without_redoing_finished_files(planted, tmp_path):
    out = str(tmp_path / "out")
    code = ("import sys; from marin_assets.pipeline.curation.normalize import normalize;"
            f" normalize({out!r}, {planted.raw!r}, target_shard_bytes=20_000)")
    first = tmp_path / "out" / "_work" / "normalized" / "train-00000.json"
    kill_when([sys.executable, "-c", code], str(first), env=subprocess_env())
    assert not (tmp_path / "out" / "_work" / "normalized" / "validation-00000.json").exists(), "killed part-way"
    before = os.stat(first).st_mtime_ns
    resumed = normalize(out, planted.raw, target_shard_bytes=20_000)
    assert os.stat(first).st_mtime_ns == before, "the finished file was not read again"
    whole = normalize(str(tmp_path / "whole"), planted.raw, target_shard_bytes=20_000)
    assert documents(out) == documents(str(tmp_path / "whole"))
    assert (resumed.documents_out, resumed.splits) == (whole.documents_out, whole.splits)


def test_stage_inputs_that_are_not_normalized_shards_are_errors_naming_stage_and_file(tmp_path):
    with pytest.raises(CurationError, match=r"some_stage: .*raw holds no normalized shards"):
        (tmp_path / "raw" / "train").mkdir(parents=True)
        list_shards("some_stage", str(tmp_path / "raw"))
    with pytest.raises(CurationError, match=r"some_stage: input .*missing does not exist"):
        list_shards("some_stage", str(tmp_path / "missing"))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(CurationError, match=r"some_stage: shard .*bad\.parquet is unreadable"):
        read_shard("some_stage", str(bad))
    write_shard(pa.table({"id": ["a"], "text": ["x"]}), str(tmp_path / "cols.parquet"))
    with pytest.raises(CurationError, match=r"shard .*cols\.parquet has no column 'source' \(it has id, text\)"):
        read_shard("some_stage", str(tmp_path / "cols.parquet"))
    write_shard(pa.table({"id": ["a", "b"], "text": ["x", None], "source": ["f:1", "f:2"]}),
                str(tmp_path / "n.parquet"))
    with pytest.raises(CurationError, match=r"shard .*n\.parquet row 1: text is null"):
        read_shard("some_stage", str(tmp_path / "n.parquet"))


def test_a_stage_that_removes_everything_fails_and_the_check_guards_a_catastrophic_removal():
    gone = [ShardStats("train", 3, 30, 0, 0, {"rule": Removed(3, 30)})]
    with pytest.raises(CurationError, match=r"filter: removed every one of 3 documents \(rule: 3\)"):
        summarize("filter", "/out", gone)
    check = removed_fraction_within(0.5)
    kept = summarize("filter", "/out", [ShardStats("train", 10, 100, 6, 60, {"rule": Removed(4, 40)})])
    ok = check.fn("/out", json.loads(json.dumps(kept, default=lambda o: o.__dict__)))
    assert ok.passed and "removed 40.0% of 10 documents" in ok.message and "rule 4" in ok.message
    many = summarize("filter", "/out", [ShardStats("train", 10, 100, 4, 40, {"rule": Removed(6, 60)})])
    failed = check.fn("/out", json.loads(json.dumps(many, default=lambda o: o.__dict__)))
    assert not failed.passed and failed.metadata["removed_fraction"] == 0.6


def test_normalize_step_through_the_protocol_records_counts_and_passes_its_check(planted, prefix):
    raw = planted.step
    step = normalize_step("curated/planted-normalized", raw, target_shard_bytes=100_000)
    assert normalize_step("curated/planted-normalized", raw, target_shard_bytes=50_000).hash != step.hash
    assert normalize_step("curated/planted-normalized", raw, target_shard_bytes=100_000, workers=4).hash == step.hash
    materialize_step(step, prefix=prefix)
    record = read_record(step.output_path_under(prefix))
    assert record is not None
    result = record.result
    assert result["documents_out"] == planted.normalize_result.documents_out
    assert result["splits"]["train"]["shards"] == planted.normalize_result.splits["train"].shards
    assert [c.name for c in step.checks] == ["removed_fraction_within"]
    assert step.checks[0].fn(step.output_path_under(prefix), result).passed


def test_the_tokenize_step_reads_a_curated_output_like_any_dataset(planted, tmp_path):
    from marin_assets.pipeline.data.text_files import find_splits
    from marin_assets.pipeline.tokens.tokenize import tokenize
    from marin_assets.pipeline.tokens.tokenizer import train_tokenizer

    assert find_splits(planted.normalized) == {"train": ["train/*"], "validation": ["validation/*"]}
    tokenizer = train_tokenizer(str(tmp_path / "tok"), planted.normalized, vocab_size=300).path
    cache = tokenize(str(tmp_path / "cache"), planted.normalized, tokenizer)
    assert cache.splits["train"].documents == planted.normalize_result.splits["train"].documents
    assert cache.splits["validation"].documents == 24

