"""Tokenize's pipeline (issue 28): one reader, tokenizer and writer across a split's files, framing by a mask,
fastokens' refusal remembered. Its caches must be what they were: checked on real text (the Python standard
library's sources) with the real cl100k — the form fastokens loads and the real one with id gaps, which it
refuses — against references that share no code with the pipeline (`tokenizers` one document at a time, framed
in Python, written by Levanter's own `TreeStore`), with batches, writes and commits small enough that every
file spans many of each."""

import json
import os
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.tokens import cache_writer, encoders
from marin_assets.pipeline.tokens import levanter_cache as lc
from marin_assets.pipeline.tokens.encoders import Framing, choose_backend, frame
from marin_assets.pipeline.tokens.tokenize import tokenize
from marin_assets.pipeline.tokens.tokenizer import adopt_tokenizer
from tests.support.real_tokenizers import CL100K_MAX_ID, cl100k_contiguous_folder, cl100k_folder

MODULES = ["json/decoder.py", "textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "keyword.py", "bisect.py",
           "this.py", "string.py", "glob.py", "heapq.py", "numbers.py"]
"""Real documents of several sizes (1-30 KB), code, comments, docstrings and a ROT13 text (`this.py`)."""


def stdlib_documents() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / m).read_text(encoding="utf-8") for m in MODULES]
    return texts + ["", "   \n", "naïve café — 東京 🤖 Ωμέγα <|endoftext|> in the middle"]  # two empties: dropped


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """Three train files (documents split across them, empties among them) and one validation file."""
    root = tmp_path_factory.mktemp("stdlib-raw")
    texts = stdlib_documents()
    parts = {"train/a.jsonl": texts[0::3], "train/b.jsonl": texts[1::3], "train/c.jsonl": texts[2::3],
             "validation/v.jsonl": texts[:2]}
    for name, part in parts.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    return str(root)


@pytest.fixture(scope="module")
def cl100k(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cl100k")
    return {"fastokens": adopt_tokenizer(str(root / "adopted"), cl100k_contiguous_folder(root / "c")).path,
            "tokenizers": adopt_tokenizer(str(root / "adopted-gaps"), cl100k_folder(root / "g")).path}


def reference_rows(tokenizer_path: str, dataset: str, split: str) -> dict[str, list[list[int]]]:
    """{file: rows}: every non-blank document encoded alone by `tokenizers` (no batch, no flat buffer), its EOS
    id appended in Python (cl100k has no BOS)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_path) / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    rows = {}
    for file in sorted((Path(dataset) / split).iterdir()):
        texts = [json.loads(line)["text"] for line in file.read_text().splitlines()]
        rows[file.name] = [tok.encode(t, add_special_tokens=False).ids + [eos] for t in texts if t.strip()]
    return rows


def store_arrays(cache_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """The cache's raw arrays as written: the flat tokens and Levanter's offsets array (row count first)."""
    store = lc.open_store({"input_ids": np.zeros((0,), dtype=np.int32)}, cache_dir, mode="r")
    array = store.tree["input_ids"]
    size, rows = int(array.data_size), int(array.num_rows)
    return array.data[:size].read().result(), array.offsets[:rows + 1].read().result()


def levanter_written(rows: list[list[int]], cache_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """The same rows written by Levanter's `TreeStore` in one append of Levanter's own `PreparedBatch`."""
    from levanter.store.jagged_array import PreparedBatch
    from levanter.store.tree_store import TreeStore

    store = TreeStore.open({"input_ids": np.zeros((0,), dtype=np.int32)}, cache_dir, mode="w", cache_metadata=False)
    store.extend_with_batch({"input_ids": PreparedBatch.from_batch([np.asarray(r, dtype=np.int32) for r in rows])})
    return store_arrays(cache_dir)


@pytest.mark.parametrize("backend", ["fastokens", "tokenizers"])
def test_the_pipeline_writes_exactly_the_reference_cache(dataset, cl100k, tmp_path, monkeypatch, backend):
    # small batches, appends and commits: every file spans several of each, and appends cross commits
    monkeypatch.setattr(cache_writer, "BATCH_CHARACTERS", 20_000)
    monkeypatch.setattr(cache_writer, "COMPACT_BATCH_CHARACTERS", 20_000)
    monkeypatch.setattr(cache_writer, "WRITE_TOKENS", 3_000)
    tok = cl100k[backend]
    result = tokenize(str(tmp_path / "c"), dataset, tok, rows_per_commit=2)
    assert result.backend == backend  # auto: fastokens where it loads, `tokenizers` where it refuses the id gaps
    if backend == "tokenizers":
        assert "fastokens cannot load this tokenizer" in result.backend_reason
        assert result.vocab_size == CL100K_MAX_ID + 1
    for split in ("train", "validation"):
        by_file = reference_rows(tok, dataset, split)
        rows = [r for file_rows in by_file.values() for r in file_rows]
        cache_dir = str(tmp_path / "c" / split)
        data, offsets = store_arrays(cache_dir)
        want_data, want_offsets = levanter_written(rows, str(tmp_path / f"levanter-{split}"))
        assert np.array_equal(offsets, want_offsets) and np.array_equal(data, want_data)
        ledger = lc.load_ledger(cache_dir)
        assert ledger.is_finished and ledger.total_num_rows == len(rows) == result.splits[split].documents
        assert list(ledger.shard_rows.values()) == [len(r) for r in by_file.values()]
        assert ledger.finished_shards == list(ledger.shard_rows)
        assert ledger.field_counts["input_ids"] == sum(map(len, rows)) == result.splits[split].tokens
    assert result.splits["train"].empty_documents_dropped == 2


def framed_in_python(ids: list[int], lengths: list[int], bos: int | None, eos: int | None) -> list[int]:
    out, at = [], 0
    for n in lengths:
        out += ([bos] if bos is not None else []) + ids[at:at + n] + ([eos] if eos is not None else [])
        at += n
    return out


@pytest.mark.parametrize(("bos", "eos"), [(1, 2), (None, 2), (7, None), (None, None)])
def test_framing_puts_the_ids_where_python_does(bos, eos):
    rng = np.random.default_rng(0)
    lengths = [0, 3, 1, 0, 50, 2, 0]  # zero-length documents at the start, middle and end
    ids = rng.integers(0, CL100K_MAX_ID, sum(lengths)).astype("<u4")  # fastokens' buffer type
    out, ends = frame(ids, np.cumsum(lengths, dtype=np.int64), Framing("bos_eos", bos, eos))
    assert out.dtype == np.int32 and out.tolist() == framed_in_python(ids.tolist(), lengths, bos, eos)
    per = (bos is not None) + (eos is not None)
    assert ends.tolist() == np.cumsum([n + per for n in lengths]).tolist()
    empty, empty_ends = frame(np.empty(0, "<u4"), np.empty(0, np.int64), Framing("bos_eos", bos, eos))
    assert len(empty) == 0 and len(empty_ends) == 0


def test_a_refusal_is_remembered_and_raised_again(cl100k, monkeypatch):
    import fastokens

    loads, real = [], fastokens.Tokenizer

    class Counting:
        @staticmethod
        def from_json_str(text):
            loads.append(1)
            return real.from_json_str(text)

    encoders._fastokens_or_refusal.cache_clear()
    monkeypatch.setattr(fastokens, "Tokenizer", Counting)
    try:
        choices = [choose_backend(cl100k["tokenizers"], ["a sample"]) for _ in range(3)]
        with pytest.raises(Exception) as first:
            encoders._fastokens(cl100k["tokenizers"])
        with pytest.raises(Exception) as second:
            encoders._fastokens(cl100k["tokenizers"])
    finally:
        encoders._fastokens_or_refusal.cache_clear()  # nothing counted stays cached for the next test
    assert len(loads) == 1  # parsed once; the refusal costs nothing after
    assert {c.backend for c in choices} == {"tokenizers"} and len({c.reason for c in choices}) == 1
    assert str(first.value) == str(second.value) and str(first.value) in choices[0].reason


def test_a_bad_line_in_a_later_file_names_it_and_the_files_before_stay_committed(dataset, cl100k, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for file in (Path(dataset) / "train").iterdir():
        (raw / file.name).write_text(file.read_text())
    files = sorted(str(p) for p in raw.iterdir())
    good = (raw / "b.jsonl").read_text()
    lines = good.splitlines(keepends=True)
    (raw / "b.jsonl").write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    tok, cache = cl100k["fastokens"], str(tmp_path / "c")
    with pytest.raises(DatasetError, match=r"b\.jsonl, line 2: malformed JSON"):
        cache_writer.tokenize_files(files, cache, tok, rows_per_commit=1, backend="fastokens")
    ledger = lc.load_ledger(cache)
    assert not ledger.is_finished and ledger.finished_shards == ["00000-a_jsonl"]
    assert ledger.shard_rows.get("00001-b_jsonl", 0) <= 1  # at most the line before the bad one
    (raw / "b.jsonl").write_text(good)
    resumed = cache_writer.tokenize_files(files, cache, tok, rows_per_commit=1, backend="fastokens")
    clean = cache_writer.tokenize_files(files, str(tmp_path / "clean"), tok, backend="fastokens")
    assert resumed == clean
    assert all(np.array_equal(a, b) for a, b in zip(store_arrays(cache), store_arrays(str(tmp_path / "clean")),
                                                    strict=True))


@pytest.mark.parametrize("where", ["writer", "tokenizer"])
def test_a_failure_in_the_writer_or_the_tokenizer_is_raised_not_hung(dataset, cl100k, tmp_path, monkeypatch, where):
    monkeypatch.setattr(cache_writer, "BATCH_CHARACTERS", 5_000)
    monkeypatch.setattr(cache_writer, "COMPACT_BATCH_CHARACTERS", 5_000)
    calls = []
    if where == "writer":
        real = cache_writer._extend

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise OSError("disk full")
            return real(*args, **kwargs)

        monkeypatch.setattr(cache_writer, "_extend", failing)
        monkeypatch.setattr(cache_writer, "WRITE_TOKENS", 1)
    else:
        real_start = encoders.Encoder.start

        def failing_start(self, texts):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("tokenizer crashed")
            return real_start(self, texts)

        monkeypatch.setattr(encoders.Encoder, "start", failing_start)
    with pytest.raises((OSError, RuntimeError), match="disk full|tokenizer crashed"):
        cache_writer.tokenize_files(sorted(str(p) for p in (Path(dataset) / "train").iterdir()),
                                    str(tmp_path / "c"), cl100k["fastokens"], backend="fastokens")
    assert not lc.load_ledger(str(tmp_path / "c")).is_finished


def test_a_split_is_written_in_few_appends_across_file_ends(dataset, cl100k, tmp_path, monkeypatch):
    # every append rewrites the arrays' shard file: three files' rows go in one append and one last commit
    appends, commits = [], []
    real_extend, real_commit = cache_writer._extend, cache_writer._commit
    monkeypatch.setattr(cache_writer, "_extend", lambda *a, **k: appends.append(1) or real_extend(*a, **k))
    monkeypatch.setattr(cache_writer, "_commit", lambda *a, **k: commits.append(a[5]) or real_commit(*a, **k))
    files = sorted(str(p) for p in (Path(dataset) / "train").iterdir())
    tok, cache = cl100k["fastokens"], str(tmp_path / "c")
    counts = cache_writer.tokenize_files(files, cache, tok, backend="fastokens")
    assert len(appends) == 1 and commits == [False, True]  # the first (empty) ledger, then the finished one
    by_file = reference_rows(tok, dataset, "train")
    rows = [r for file_rows in by_file.values() for r in file_rows]
    assert counts == (len(rows), sum(map(len, rows)), 2)
    want = levanter_written(rows, str(tmp_path / "levanter"))
    assert all(np.array_equal(a, b) for a, b in zip(store_arrays(cache), want, strict=True))
    ledger = lc.load_ledger(cache)
    assert ledger.finished_shards == list(ledger.shard_rows) == ["00000-a_jsonl", "00001-b_jsonl", "00002-c_jsonl"]
    assert list(ledger.shard_rows.values()) == [len(r) for r in by_file.values()]


def test_appends_grow_with_the_shard_file_they_rewrite():
    legacy = 1 << 27  # Levanter's own shard files, which caches created before SHARD_TOKENS keep
    sizes = [cache_writer.write_threshold(n, legacy) for n in range(0, legacy, 1 << 20)]
    assert sizes[0] == cache_writer.WRITE_TOKENS and sizes[-1] == cache_writer.MAX_WRITE_TOKENS
    assert sizes == sorted(sizes)  # the fuller the file, the larger the append, up to the cap
    assert cache_writer.write_threshold(legacy, legacy) == cache_writer.WRITE_TOKENS  # a new file
    # in the shard files this writer creates, a quarter of a full file is within the smallest append
    shard = cache_writer.SHARD_TOKENS
    assert {cache_writer.write_threshold(n) for n in range(0, 3 * shard, shard // 16)} == {cache_writer.WRITE_TOKENS}


def zarr_metadata(cache_dir: str) -> dict[str, dict]:
    return {name: json.loads((Path(cache_dir) / "input_ids" / name / "zarr.json").read_text())
            for name in ("offsets", "data")}


def test_a_new_cache_has_small_shard_files_that_levanter_reads_and_an_old_one_keeps_its_own(
        dataset, cl100k, tmp_path, monkeypatch):
    # shard files of 4,096 elements and appends of ~3,000 tokens: appends cross shard files
    monkeypatch.setattr(cache_writer, "SHARD_TOKENS", 4096)
    monkeypatch.setattr(cache_writer, "WRITE_TOKENS", 3_000)
    files = sorted(str(p) for p in (Path(dataset) / "train").iterdir())
    tok = cl100k["fastokens"]
    rows = [r for file_rows in reference_rows(tok, dataset, "train").values() for r in file_rows]
    want = levanter_written(rows, str(tmp_path / "levanter"))
    from levanter.store.tree_store import TreeStore

    exemplar = cache_writer.text_processor(tok).output_exemplar
    TreeStore.open(exemplar, str(tmp_path / "levanter-layout"), mode="a")  # Levanter's own layout
    levanter_layout = zarr_metadata(str(tmp_path / "levanter-layout"))
    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    TreeStore.open(exemplar, old, mode="a")  # a cache begun by Levanter (or by this writer before SHARD_TOKENS)
    for cache in (new, old):
        assert cache_writer.tokenize_files(files, cache, tok, backend="fastokens").tokens == sum(map(len, rows))
        assert all(np.array_equal(a, b) for a, b in zip(store_arrays(cache), want, strict=True))
        # training's reader, whatever the layout: the same rows
        loaded = lc.load_cache(cache, exemplar)
        got = loaded.get_batch_sync(list(range(len(rows))))
        assert [list(r["input_ids"]) for r in got] == rows
    assert zarr_metadata(old) == levanter_layout  # an existing store keeps the layout it was made with
    layout = zarr_metadata(new)
    assert len(list((Path(new) / "input_ids" / "data" / "c").iterdir())) == -(-sum(map(len, rows)) // 4096) > 2
    for name, metadata in layout.items():  # Levanter's codec and metadata; only the shard file's size differs
        assert metadata["chunk_grid"]["configuration"]["chunk_shape"] == [4096]
        assert metadata["codecs"][0]["configuration"]["chunk_shape"] == [4096]  # (Levanter's inner chunks: 2^18)
        same = json.loads(json.dumps(levanter_layout[name]))
        same["chunk_grid"]["configuration"]["chunk_shape"] = [4096]
        same["codecs"][0]["configuration"]["chunk_shape"] = [4096]
        assert metadata == same


def test_the_parity_sample_reads_only_what_it_takes(tmp_path, monkeypatch):
    from marin_assets.pipeline.tokens import tokenize as tokenize_module

    long_docs, short_docs = tmp_path / "long.jsonl", tmp_path / "short.jsonl"
    texts = stdlib_documents()[:12]
    long_docs.write_text("".join(json.dumps({"text": t * 40}) + "\n" for t in texts * 8))  # ≥ 40 KB each
    short_docs.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(200)))
    parsed = []
    real = tokenize_module.iter_text_batches

    def counting(*args, **kwargs):
        for texts in real(*args, **kwargs):
            parsed.append(len(texts))
            yield texts

    monkeypatch.setattr(tokenize_module, "iter_text_batches", counting)
    sample = tokenize_module._parity_sample([str(long_docs), str(short_docs)], "text", "auto")
    limit = tokenize_module.SAMPLE_CHARACTERS
    assert sample[0] == (texts[0] * 40)[:limit]  # one long document fills the first file's share
    assert sample[1:] == [f"doc {i}" for i in range(tokenize_module.SAMPLE_DOCUMENTS)]  # short ones: the first 64
    assert parsed[0] <= 8 and sum(parsed) <= 8 + tokenize_module.SAMPLE_DOCUMENTS  # no file parsed past its share


def test_a_fingerprint_is_hashed_once_per_version_of_the_file(tmp_path, monkeypatch):
    from marin_assets.pipeline.tokens import tokenize as tokenize_module

    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"vocab": {"a": 0}}}')
    os.utime(folder / "tokenizer.json", (1.7e9, 1.7e9))  # written long ago (a file written just now is not kept)
    reads, real = [], tokenize_module.read_bytes
    monkeypatch.setattr(tokenize_module, "read_bytes", lambda url: reads.append(url) or real(url))
    first = [tokenize_module.tokenizer_fingerprint(str(folder)) for _ in range(3)]
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"vocab": {"b": 0}}}')  # same size, inode
    second = [tokenize_module.tokenizer_fingerprint(str(folder)) for _ in range(2)]
    assert len(set(first)) == 1 and len(reads) == 1 + 2  # kept; the rewritten file is hashed while it is new
    assert second[0] == second[1] != first[0]
    assert second[0] == tokenize_module.hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()[:16]


def test_splits_tokenized_together_keep_their_own_failures(dataset, cl100k, tmp_path):
    raw = tmp_path / "raw"
    for split in ("train", "validation"):
        (raw / split).mkdir(parents=True)
        for file in (Path(dataset) / split).iterdir():
            (raw / split / file.name).write_text(file.read_text())
    lines = (raw / "train" / "b.jsonl").read_text().splitlines(keepends=True)
    (raw / "train" / "d.jsonl").write_text((raw / "train" / "a.jsonl").read_text())
    # the fifth file: past the parity sample (the first four files), so the split's own reading meets it
    (raw / "train" / "e.jsonl").write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(DatasetError, match=r"train/e\.jsonl, line 2: malformed JSON"):
        tokenize(str(tmp_path / "c"), str(raw), cl100k["fastokens"])
    assert not lc.load_ledger(str(tmp_path / "c" / "train")).is_finished
    validation = lc.load_ledger(str(tmp_path / "c" / "validation"))  # tokenized beside it, and finished
    assert validation.is_finished and validation.total_num_rows == 2


def test_the_backend_is_checked_once_per_tokenizer_in_a_process(dataset, cl100k, tmp_path, monkeypatch):
    """A second tokenize with the same tokenizer keeps the first one's verdict (no sample read or encoded again) and
    says so; another tokenizer is checked afresh."""
    from marin_assets.pipeline.tokens import tokenize as tokenize_module

    samples, real = [], tokenize_module._parity_sample
    monkeypatch.setattr(tokenize_module, "_parity_sample", lambda *a: samples.append(a) or real(*a))
    folder = tmp_path / "tok"
    shutil.copytree(cl100k["fastokens"], folder)
    first = tokenize(str(tmp_path / "one"), dataset, str(folder))
    second = tokenize(str(tmp_path / "two"), dataset, str(folder))
    assert len(samples) == 1 and first.backend == second.backend == "fastokens"
    assert "checked earlier" not in first.backend_reason
    assert second.backend_reason.startswith(first.backend_reason) and "checked earlier in this process" in \
        second.backend_reason and first.tokenizer_fingerprint in second.backend_reason
    for split in ("train", "validation"):
        assert store_arrays(str(tmp_path / "one" / split))[0].tolist() == \
            store_arrays(str(tmp_path / "two" / split))[0].tolist()
    other = tmp_path / "other-tok"
    shutil.copytree(cl100k["tokenizers"], other)  # the id gaps: fastokens refuses it
    third = tokenize(str(tmp_path / "three"), dataset, str(other))
    assert len(samples) == 2 and third.backend == "tokenizers" and "checked earlier" not in third.backend_reason
