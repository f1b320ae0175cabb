"""exact_dedup on the planted corpus: every planted copy found across shards, nothing else removed, the first
copy kept; paragraphs; the same output however it is split or fanned out, after a kill, and through the protocol."""

import collections
import functools
import json
import re
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from marin_assets import Step, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.pipeline.curation.exact_dedup import (
    ALL_PARAGRAPHS,
    DUPLICATE,
    DUPLICATE_PARAGRAPH,
    ENTRIES_PER_BUCKET,
    MAX_BUCKETS,
    SAMPLES,
    ExactDedupResult,
    default_buckets,
    exact_dedup,
    exact_dedup_step,
)
from marin_assets.pipeline.curation.shards import CurationError, document_id, list_shards, write_shard
from marin_assets.pipeline.curation.stage import Removed
from tests.support.curation import documents, id_counts, kill_when
from tests.support.helpers import FAST, subprocess_env


def reference(dataset: str, paragraphs: bool, separator: str = "\n") -> list[tuple[str, str]]:
    """(id, text) that exact deduplication must keep, computed the obvious way: all in memory, by text equality."""
    seen: set[str] = set()
    seen_paragraphs: set[str] = set()
    kept = []
    for row in documents(dataset):
        text = row["text"]
        if text in seen:
            continue
        seen.add(text)
        if paragraphs:
            pieces = []
            for piece in text.split(separator):
                if piece.strip() and piece in seen_paragraphs:
                    continue
                seen_paragraphs.add(piece)
                pieces.append(piece)
            if not any(p.strip() for p in pieces):
                continue
            text = separator.join(pieces)
        kept.append((row["id"], text))
    return kept


def shard_rows(path: str) -> list[dict]:
    return pq.read_table(path, columns=["id", "text", "source"]).to_pylist()


def id_and_text(dataset: str) -> list[tuple[str, str]]:
    return [(row["id"], row["text"]) for row in documents(dataset)]


@pytest.fixture(scope="module")
def deduped(planted, tmp_path_factory):
    """Whole-document dedup of the planted corpus, run once for the module: (output path, result)."""
    out = str(tmp_path_factory.mktemp("exact-dedup") / "out")
    return out, exact_dedup(out, planted.normalized)


def test_every_planted_copy_is_removed_across_shards_and_nothing_else(planted, deduped):
    out, result = deduped
    truth = planted.truth
    placed = [(ordinal, row) for ordinal, shard in enumerate(list_shards("test", planted.normalized))
              for row in shard_rows(shard.path)]
    shards_of = collections.defaultdict(set)
    for ordinal, row in placed:
        shards_of[row["id"]].add(ordinal)
    assert any(len(shards_of[i]) >= 2 for i in truth.exact_duplicates), "the planted copies span shards"

    counts = id_counts(out)
    assert all(counts[i] == 1 for i in truth.exact_duplicates), "recall: one copy of each planted duplicate"
    assert all(counts[i] == 1 for i in truth.base_ids + truth.validation_ids), "precision: every base document kept"
    assert counts == collections.Counter({row["id"]: 1 for _, row in placed}), "no other document removed"
    planted_copies = sum(c - 1 for c in truth.exact_duplicates.values())
    removed_bytes = sum(len(row["text"].encode()) for _, row in placed) - sum(
        len(r["text"].encode()) for r in documents(out))
    assert result.removed == {DUPLICATE: Removed(planted_copies, removed_bytes, 0)}
    assert result.documents_out == result.documents_in - planted_copies == len(counts)
    assert result.duplicate_groups == len(truth.exact_duplicates)
    assert result.largest_group == max(truth.exact_duplicates.values())
    assert (result.paragraph_groups, result.largest_paragraph_group, result.counters) == (0, 0, {})
    assert id_and_text(out) == reference(planted.normalized, paragraphs=False)


def test_the_first_copy_is_kept_and_samples_name_it(planted, deduped):
    out, result = deduped
    first_source: dict[str, str] = {}
    later_sources = collections.defaultdict(list)
    for row in documents(planted.normalized):
        if row["id"] in first_source:
            later_sources[row["id"]].append(row["source"])
        else:
            first_source[row["id"]] = row["source"]
    kept = {row["id"]: row["source"] for row in documents(out)}
    for i in planted.truth.exact_duplicates:
        assert kept[i] == first_source[i], f"{i}: kept {kept[i]}, first at {first_source[i]}"
    removals_in_order = [(i, s) for row in documents(planted.normalized)
                         for i, s in [(row["id"], row["source"])] if s in later_sources[i]]
    assert len(result.samples) == min(SAMPLES, len(removals_in_order))
    assert [(s.id, s.source) for s in result.samples] == removals_in_order[:SAMPLES], "the first removals, in order"
    for sample in result.samples:
        assert sample.kept_source == first_source[sample.id]
        assert sample.copies == planted.truth.exact_duplicates[sample.id]


def test_paragraphs_leave_the_repeated_paragraph_once_and_the_rest_of_each_document(planted, tmp_path):
    out = str(tmp_path / "out")
    result = exact_dedup(out, planted.normalized, paragraphs=True, buckets=5)
    truth = planted.truth
    boilerplate = truth.repeated_paragraph
    rows = documents(out)
    assert sum(r["text"].split("\n").count(boilerplate) for r in rows) == 1
    assert id_and_text(out) == reference(planted.normalized, paragraphs=True)

    before = {r["id"]: r["text"] for r in documents(planted.normalized)}
    after = {r["id"]: r["text"] for r in rows}
    seen: set[str] = set()
    lost_it = 0
    for row in documents(planted.normalized):
        pieces = row["text"].split("\n")
        new = [p for p in pieces if not p.strip() or p not in seen and not seen.add(p)]
        if row["id"] in truth.repeated_paragraph_ids and boilerplate not in new:
            lost_it += 1
            assert after[row["id"]].split("\n") == new, "the rest of the document stays: only repeats are cut"
            assert len(after[row["id"]]) > len(before[row["id"]]) / 2
    assert lost_it == len(truth.repeated_paragraph_ids) - 1
    modified = sum(1 for i, text in after.items() if text != before[i])
    assert result.removed[DUPLICATE_PARAGRAPH].modified == modified >= lost_it
    assert result.removed[DUPLICATE].documents == sum(c - 1 for c in truth.exact_duplicates.values())
    assert result.documents_out == len(rows)
    assert result.counters["paragraphs_removed"] >= modified and result.counters["paragraphs"] > len(before)
    assert result.paragraph_groups > 0 and result.largest_paragraph_group >= len(truth.repeated_paragraph_ids)
    assert all(r["id"] in before for r in rows), "ids stay those of the original text (truth survives)"


def test_paragraph_rules_on_small_documents(tmp_path):
    """Separators, blank pieces, a paragraph repeated inside one document, and the three reasons."""
    texts = ["intro\n\nshared part\n\n  \n\nown A",          # first: kept whole
             "shared part\n\nown B\n\nown B",                # loses the shared part and its own second `own B`
             "intro\n\nshared part",                         # every paragraph seen before: removed
             "intro\n\nshared part\n\n  \n\nown A",          # the whole first document again
             "  \n\nown C\n\n\n\nshared part\n\n"]           # blank pieces stay, the repeat goes
    data = tmp_path / "data"
    write_shard(pa.table({"id": [document_id(t) for t in texts], "text": texts,
                          "source": [f"f:{i + 1}" for i in range(5)]}), str(data / "train" / "part-00000.parquet"))
    result = exact_dedup(str(tmp_path / "out"), str(data), paragraphs=True, paragraph_separator="\n\n", buckets=3)
    assert [r["text"] for r in documents(str(tmp_path / "out"))] == [texts[0], "own B", "  \n\nown C\n\n\n\n"]
    assert id_and_text(str(tmp_path / "out")) == reference(str(data), True, "\n\n")
    assert {k: v.documents for k, v in result.removed.items()} == {ALL_PARAGRAPHS: 1, DUPLICATE: 1,
                                                                   DUPLICATE_PARAGRAPH: 0}
    assert result.removed[DUPLICATE_PARAGRAPH].modified == 2
    assert result.counters == {"paragraphs": 13, "paragraphs_removed": 5}
    assert result.samples[0].source == "f:4" and result.samples[0].kept_source == "f:1"


def test_the_output_does_not_depend_on_buckets_and_a_rerun_reads_the_finished_work(planted, deduped, tmp_path):
    out, result = deduped
    other = str(tmp_path / "one-bucket")
    again = exact_dedup(other, planted.normalized, buckets=1)
    for shard in list_shards("test", out):
        assert Path(shard.output_under(other)).read_bytes() == Path(shard.path).read_bytes(), shard.key
    assert again == ExactDedupResult(**{**result.__dict__, "path": other})
    mtimes = {p: p.stat().st_mtime_ns for p in Path(out).rglob("*") if p.is_file()}
    assert exact_dedup(out, planted.normalized) == result
    assert {p: p.stat().st_mtime_ns for p in Path(out).rglob("*") if p.is_file()} == mtimes, "nothing redone"


def hashed_reference(dataset: str) -> list[tuple[str, str]]:
    """(id, text) that paragraph dedup must keep, from plain Python sets of xxh3-128 digests of the texts and of
    their paragraphs, one pass in input order (independent of the stage's files, sorting and buckets)."""
    seen: set[bytes] = set()
    seen_paragraphs: set[bytes] = set()
    kept = []
    for row in documents(dataset):
        digest = xxhash.xxh3_128_digest(row["text"].encode())
        if digest in seen:
            continue
        seen.add(digest)
        pieces = []
        for piece in row["text"].split("\n"):
            if piece.strip():
                digest = xxhash.xxh3_128_digest(piece.encode())
                if digest in seen_paragraphs:
                    continue
                seen_paragraphs.add(digest)
            pieces.append(piece)
        if any(p.strip() for p in pieces):
            kept.append((row["id"], "\n".join(pieces)))
    return kept


def test_any_bucket_count_keeps_what_a_set_of_hashes_keeps_and_reuses_the_hashes(planted, tmp_path):
    """The hashes are written once per shard, sorted under a prefix index; buckets are hash ranges read from it
    (1; 7: ranges cutting index cells; 100: more buckets than any shard has cells), so changing the bucket count
    redoes only the bucket and shard phases, and the output is the same."""
    out = tmp_path / "out"
    expected = hashed_reference(planted.normalized)
    assert len(expected) < len(documents(planted.normalized))
    hashes = out / "_work" / "hashes"
    results, mtimes = [], None
    for buckets in (1, 7, 100):
        shutil.rmtree(out / "_work" / "shards", ignore_errors=True)
        for shard in list_shards("test", planted.normalized):
            Path(shard.output_under(str(out))).unlink(missing_ok=True)
        results.append(exact_dedup(str(out), planted.normalized, paragraphs=True, buckets=buckets))
        assert id_and_text(str(out)) == expected, f"{buckets} buckets"
        assert len(list((out / "_work" / f"duplicates-{buckets}").glob("*.json"))) == buckets
        now = {p: p.stat().st_mtime_ns for p in hashes.iterdir()}
        assert mtimes is None or now == mtimes, "the hashes of the first run are read again, not redone"
        mtimes = now
    assert results[0] == results[1] == results[2]
    outcomes = [json.loads(p.read_text()) for p in hashes.glob("*.json")]
    assert 4 <= max(o["index_bits"] for o in outcomes) <= 6, "the prefix index is exercised, with under 100 cells"
    assert sum(o["entries"] for o in outcomes) == len(documents(planted.normalized)) + results[0].counters["paragraphs"]


def test_default_buckets_hold_a_bounded_number_of_hashes_and_one_per_worker():
    assert default_buckets(0, 1) == default_buckets(ENTRIES_PER_BUCKET, 1) == 1
    assert default_buckets(ENTRIES_PER_BUCKET + 1, 1) == 2
    assert default_buckets(10, 4) == 4
    assert default_buckets(ENTRIES_PER_BUCKET * MAX_BUCKETS * 2, 1) == MAX_BUCKETS


def test_a_hash_file_lost_between_phases_is_named(tmp_path):
    texts = ["alpha", "beta", "alpha", "gamma"]
    data = tmp_path / "data"
    for index in range(2):
        write_shard(pa.table({"id": [document_id(t) for t in texts], "text": texts,
                              "source": [f"f{index}:{i + 1}" for i in range(4)]}),
                    str(data / "train" / f"part-{index:05d}.parquet"))
    out = tmp_path / "out"
    assert exact_dedup(str(out), str(data), buckets=2).documents_out == 3
    lost = out / "_work" / "hashes" / "train-00001.hashes"
    lost.unlink()
    with pytest.raises(CurationError, match=rf"^exact_dedup: hash file {re.escape(str(lost))} is missing \(was"
                                            r" `_work` removed part-way through a run\?\)"):
        exact_dedup(str(out), str(data), buckets=3)


def test_identity_follows_paragraph_settings_not_buckets_or_workers(planted):
    data = Step(name="curated/data", fn=lambda out: None, hash_attrs={"v": 1})
    base = exact_dedup_step("curated/dedup", data)
    assert exact_dedup_step("curated/dedup", data, buckets=64, workers=8).hash == base.hash
    assert exact_dedup_step("curated/dedup", data, paragraph_separator="\n\n").hash == base.hash, "unused"
    paragraphs = exact_dedup_step("curated/dedup", data, paragraphs=True)
    assert paragraphs.hash != base.hash
    assert exact_dedup_step("curated/dedup", data, paragraphs=True, paragraph_separator="\n\n").hash != paragraphs.hash
    assert exact_dedup_step("curated/dedup", data, max_removed_fraction=0.1).hash == base.hash
    with pytest.raises(ValueError, match=r"exact_dedup: paragraph_separator must be a non-empty string"):
        exact_dedup_step("curated/dedup", data, paragraphs=True, paragraph_separator="")
    with pytest.raises(ValueError, match=r"exact_dedup: buckets must be between 1 and 65536, got 0"):
        exact_dedup_step("curated/dedup", data, buckets=0)


def test_two_workers_on_ray_give_the_same_output(planted, deduped, local_ray, tmp_path):
    out, result = deduped
    fanned = str(tmp_path / "fanned")
    assert exact_dedup(fanned, planted.normalized, workers=2) == ExactDedupResult(**{**result.__dict__,
                                                                                      "path": fanned})
    assert documents(fanned) == documents(out)
    assert list(Path(fanned, "_work", "hashes").glob("*.claim")), "the items went through Ray's fan-out claims"
    assert len(list(Path(fanned, "_work", "duplicates-2").glob("*.json"))) == 2, "by default a bucket per worker"
    assert not list(Path(out, "_work").rglob("*.claim")), "one worker runs in process, without claims"


SLOW_REWRITE = """
import time
from marin_assets.pipeline.curation import exact_dedup as ed
decide = ed.ExactDedup.decide
def slow(*args):
    verdicts = decide(*args)
    time.sleep(0.3)  # a slow worker: the kill lands between shards of the last phase
    return verdicts
ed.ExactDedup.decide = slow
ed.exact_dedup({out!r}, {data!r})
"""


def test_a_killed_run_resumes_without_redoing_finished_work(planted, deduped, tmp_path):
    whole, result = deduped
    out = tmp_path / "out"
    shards = list_shards("test", planted.normalized)
    ready = out / "_work" / "shards" / f"{shards[1].key}.json"
    kill_when([sys.executable, "-c", SLOW_REWRITE.format(out=str(out), data=planted.normalized)], str(ready),
              env=subprocess_env())
    work = out / "_work"
    assert len(list((work / "hashes").glob("*.json"))) == len(shards)
    assert len(list((work / "hashes").glob("*.hashes"))) == len(shards), "one hash file per shard"
    assert len(list((work / "duplicates-1").glob("*.json"))) == 1, "a small corpus is one bucket by default"
    left = [s for s in shards if not (work / "shards" / f"{s.key}.json").exists()]
    assert left, "killed part-way through the last phase"
    finished = {p: p.stat().st_mtime_ns for p in work.rglob("*") if p.is_file()}
    assert any(p.suffix == ".removals" for p in finished) and any(p.suffix == ".hashes" for p in finished)
    finished.update({p: p.stat().st_mtime_ns for s in shards if s not in left
                     for p in [Path(s.output_under(str(out)))]})

    resumed = exact_dedup(str(out), planted.normalized)
    assert {p: p.stat().st_mtime_ns for p in finished} == finished, "finished outcomes and data were not redone"
    assert all((work / "shards" / f"{s.key}.json").exists() for s in left)
    assert documents(str(out)) == documents(whole)
    assert resumed == ExactDedupResult(**{**result.__dict__, "path": str(out)})


def test_bad_input_names_the_stage_and_the_file(planted, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(planted.normalized, data, ignore=shutil.ignore_patterns("_work"))
    corrupt = list_shards("test", str(data))[1].path
    Path(corrupt).write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CurationError, match=rf"^exact_dedup: shard {re.escape(corrupt)} is unreadable: "):
        exact_dedup(str(tmp_path / "out"), str(data))

    raw = tmp_path / "raw"
    shutil.copytree(planted.raw, raw)
    with pytest.raises(CurationError, match=r"^exact_dedup: .*/raw holds no normalized shards \({split}/part-00000"
                                            r"\.parquet\); curation stages read the output of a normalize step"):
        exact_dedup(str(tmp_path / "out3"), str(raw))

    nulls = tmp_path / "nulls"
    write_shard(pa.table({"id": ["a", "b"], "text": ["x", None], "source": ["f:1", "f:2"]}),
                str(nulls / "train" / "part-00000.parquet"))
    with pytest.raises(CurationError, match=r"^exact_dedup: shard .*nulls/train/part-00000\.parquet row 1: text is"
                                            r" null"):
        exact_dedup(str(tmp_path / "out4"), str(nulls))


def _copy_dataset(source: str, output_path: str) -> None:
    shutil.copytree(source, output_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_work"))


def test_the_step_through_the_protocol_records_its_counts_and_passes_its_check(planted, prefix):
    data = Step(name="curated/planted-copy", fn=functools.partial(_copy_dataset, planted.normalized),
                hash_attrs={"from": planted.normalized})
    step = exact_dedup_step("curated/planted-exact-dedup", data, buckets=4)
    materialize_step(data, prefix=prefix, settings=FAST)
    outcome = materialize_step(step, prefix=prefix, settings=FAST)
    record = read_record(outcome.output_path)
    copies = sum(c - 1 for c in planted.truth.exact_duplicates.values())
    assert record.result["removed"][DUPLICATE]["documents"] == copies
    assert record.result["documents_in"] - record.result["documents_out"] == copies
    assert record.result["duplicate_groups"] == len(planted.truth.exact_duplicates)
    typed = load_result(outcome.output_path, ExactDedupResult)
    assert typed.samples and typed.samples[0].kept_source.startswith("train/")
    check = run_check(step.checks[0], outcome.output_path, record.result)
    assert check.passed and f"of {record.result['documents_in']} documents" in check.message
    strict = exact_dedup_step("curated/planted-exact-dedup", data, max_removed_fraction=0.05)
    assert not run_check(strict.checks[0], outcome.output_path, record.result).passed
