"""Dataset readers on real files: every format reads back what was written, `skip` resumes
exactly, parquet is read a row group at a time, split layouts are found, and every bad input
is an error naming the file and the line or row."""

import bz2
import gzip
import json
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_assets.pipeline.data.text_files import (
    DatasetError,
    expand_files,
    find_splits,
    iter_documents,
    iter_text_batches,
)
from tests.support.helpers import ROOT, subprocess_env

TEXTS = ["plain", "with \"quotes\" and \\ backslash", "multi\nline\ttext", "ünïcödé — 日本語 🙂", "", "  padded  ",
         *(f"document {i} " + "word " * (i % 7) for i in range(200))]
LINE_TEXTS = [t for t in TEXTS if t.strip() and "\n" not in t]

COMPRESS = {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
            ".zst": lambda b: zstandard.ZstdCompressor().compress(b)}


def json_lines(texts, blank_every: int = 0) -> bytes:
    lines = []
    for i, text in enumerate(texts):
        lines.append(orjson.dumps({"id": i, "text": text, "meta": {"n": i}}))
        if blank_every and i % blank_every == 0:
            lines.append(b"   ")  # blank lines are no documents
    return b"\n".join(lines) + b"\n"


def write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(COMPRESS[path.suffix if path.suffix in COMPRESS else ""](data))
    return str(path)


def write_parquet(path: Path, texts, row_group_size: int = 37, **columns) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts, **columns}), path,
                   row_group_size=row_group_size)
    return str(path)


def read_all(file: str, **kwargs) -> list[str]:
    return [t for batch in iter_text_batches(file, **kwargs) for t in batch]


@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.jsonl.gz", "a.json.gz", "a.jsonl.zst", "a.jsonl.bz2",
                                  "a.jsonl.xz"])
def test_json_lines_read_back_what_was_written_in_every_compression(tmp_path, name):
    file = write(tmp_path / name, json_lines(TEXTS, blank_every=50))
    documents = list(iter_documents([file]))
    assert [t for _, _, t in documents] == TEXTS
    lines = [n for _, n, _ in documents]
    assert lines[:3] == [1, 3, 4] and len(set(lines)) == len(TEXTS)  # line numbers count the blank lines
    batches = list(iter_text_batches(file, batch_size=16))
    assert max(len(b) for b in batches) == 16 and [t for b in batches for t in b] == TEXTS


def test_concatenated_members_and_frames_are_read_in_turn(tmp_path):
    first, second = json_lines(TEXTS[:100]), json_lines(TEXTS[100:])
    gz = tmp_path / "cat.jsonl.gz"
    gz.write_bytes(gzip.compress(first) + gzip.compress(second) + b"\0" * 16)  # zero padding, as gzip allows
    zst = tmp_path / "cat.jsonl.zst"
    compressor = zstandard.ZstdCompressor()
    zst.write_bytes(compressor.compress(first) + compressor.compress(second))
    assert read_all(str(gz)) == TEXTS and read_all(str(zst)) == TEXTS


def test_a_utf8_byte_order_mark_and_crlf_line_ends_are_read(tmp_path):
    file = tmp_path / "bom.jsonl"
    file.write_bytes(b"\xef\xbb\xbf" + json_lines(TEXTS[:5]).replace(b"\n", b"\r\n"))
    assert read_all(str(file)) == TEXTS[:5]
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"one\r\ntwo\r\n\r\nthree")
    assert read_all(str(lines), text_format="text-lines") == ["one", "two", "three"]


def test_parquet_reads_only_the_text_column_across_row_groups(tmp_path):
    file = write_parquet(tmp_path / "a.parquet", TEXTS, body=[f"not this {i}" for i in range(len(TEXTS))])
    assert pq.ParquetFile(file).num_row_groups == 6
    documents = list(iter_documents([file]))
    assert [t for _, _, t in documents] == TEXTS
    assert [n for _, n, _ in documents] == list(range(1, len(TEXTS) + 1))  # row numbers, 1-based
    assert max(len(b) for b in iter_text_batches(file, batch_size=10)) == 10
    large = tmp_path / "large.parquet"
    pq.write_table(pa.table({"text": pa.array(TEXTS, pa.large_string())}), large)
    assert read_all(str(large)) == TEXTS


def test_text_files_and_text_lines(tmp_path):
    files = [write(tmp_path / f"doc{i}.txt", t.encode()) for i, t in enumerate(TEXTS[:6])]
    files.append(write(tmp_path / "doc.txt.gz", b"compressed\ndocument"))
    expected = [t for t in TEXTS[:6] if t.strip()] + ["compressed\ndocument"]
    assert [t for _, _, t in iter_documents(files, text_format="text-file")] == expected
    lines = write(tmp_path / "lines.txt.zst", ("\n\n".join(LINE_TEXTS) + "\n").encode())
    documents = list(iter_documents([lines], text_format="text-lines"))
    assert [t for _, _, t in documents] == LINE_TEXTS and documents[1][1] == 3


@pytest.mark.parametrize("fmt, name", [("jsonl", "a.jsonl.gz"), ("jsonl", "a.jsonl.zst"), ("parquet", "a.parquet"),
                                       ("text-lines", "a.txt")])
def test_skip_resumes_at_exactly_the_next_document(tmp_path, fmt, name):
    if fmt == "parquet":
        file, texts = write_parquet(tmp_path / name, TEXTS, row_group_size=25), TEXTS
    elif fmt == "jsonl":
        file, texts = write(tmp_path / name, json_lines(TEXTS, blank_every=3)), TEXTS
    else:
        file, texts = write(tmp_path / name, ("\n \n".join(LINE_TEXTS)).encode()), LINE_TEXTS
    for skip in (0, 1, 24, 25, 26, 100, len(texts) - 1, len(texts), len(texts) + 5):
        assert read_all(file, text_format=fmt, skip=skip, batch_size=7) == texts[skip:], skip


def test_parquet_skip_does_not_decode_the_skipped_row_groups(tmp_path):
    file = Path(write_parquet(tmp_path / "a.parquet", [f"doc {i:04d} " + "x" * 200 for i in range(100)],
                              row_group_size=50))
    corrupt_row_group(file, 0)
    with pytest.raises(DatasetError, match=r"a\.parquet, row 1: unreadable parquet data"):
        read_all(str(file))
    assert read_all(str(file), skip=50)[0].startswith("doc 0050")
    assert read_all(str(file), skip=60)[0].startswith("doc 0060")


def test_parquet_row_groups_are_read_one_at_a_time(tmp_path):
    file = Path(write_parquet(tmp_path / "a.parquet", [f"doc {i:04d} " + "y" * 200 for i in range(1000)],
                              row_group_size=100))
    corrupt_row_group(file, 9)
    read: list[str] = []
    with pytest.raises(DatasetError, match=r"a\.parquet, row 901: unreadable parquet data"):
        for batch in iter_text_batches(str(file), batch_size=64):
            read.extend(batch)
    assert len(read) == 900 and read[-1].startswith("doc 0899")  # the good groups came out first


def corrupt_row_group(file: Path, index: int) -> None:
    """Overwrite the data pages of one row group's text column, leaving the footer intact."""
    column = pq.ParquetFile(file).metadata.row_group(index).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(file.read_bytes())
    data[start:start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    file.write_bytes(bytes(data))


MEMORY_PROBE = """
import sys, tracemalloc
import pyarrow as pa, pyarrow.compute, pyarrow.parquet  # imported before tracing: only the reading counts
from marin_assets.pipeline.data.readers import iter_text_batches
tracemalloc.start()
n = longest = 0
for batch in iter_text_batches(sys.argv[1], batch_size=256):
    n += len(batch)
    longest = max(longest, len(batch))
print(n, longest, pa.default_memory_pool().max_memory(), tracemalloc.get_traced_memory()[1])
"""


@pytest.mark.parametrize("name", ["big.parquet", "big.jsonl.zst", "big.jsonl.gz"])
def test_a_large_file_is_read_in_bounded_memory(tmp_path, name):
    rows, text_bytes = 40_000, 1000
    texts = [f"{i:08d} " + os.urandom((text_bytes - 9) // 2).hex() for i in range(rows)]
    decoded = sum(map(len, texts))  # 40 MB of text (a parquet file read whole peaks at 44 MB)
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"text": texts}), tmp_path / name, row_group_size=500)  # 80 row groups
    else:
        write(tmp_path / name, json_lines(texts))
    proc = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(tmp_path / name)], env=subprocess_env(),
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    n, longest, arrow_peak, python_peak = map(int, proc.stdout.split())
    assert n == rows and longest == 256
    assert arrow_peak < decoded / 8, arrow_peak  # about one row group (~1.3 MB), never the whole column
    assert python_peak < decoded / 8, python_peak  # a batch of Python strings and a read buffer (~2 MB)


def test_reading_through_an_fsspec_url(tmp_path):
    fs = fsspec.filesystem("memory")
    with fs.open("/ds/a.jsonl.zst", "wb") as f:
        f.write(zstandard.ZstdCompressor().compress(json_lines(TEXTS)))
    with fs.open("/ds/b.parquet", "wb") as f:
        pq.write_table(pa.table({"text": TEXTS}), f, row_group_size=50)
    try:
        zst, parquet = expand_files("memory://ds", ["*"])
        assert zst.startswith("memory://") and zst.endswith("/ds/a.jsonl.zst")
        assert read_all(zst) == TEXTS
        assert read_all(parquet, skip=60) == TEXTS[60:]
        fs.pipe("/ds/cfg/data/train-00000-of-00001.parquet", Path(parquet.split("://", 1)[1]).name.encode())
        assert find_splits("memory://ds") == {"train": ["cfg/data/train-*.parquet"]}
    finally:
        fs.rm("/ds", recursive=True)


def test_no_documents_is_an_empty_read_for_the_caller_to_refuse(tmp_path):
    files = [write(tmp_path / "a.jsonl", b"\n \n"), write(tmp_path / "b.jsonl.gz", b""),
             write_parquet(tmp_path / "c.parquet", pa.array([], pa.string())),
             write(tmp_path / "d.txt", b"  \n")]
    assert list(iter_documents(files[:3])) == []
    assert list(iter_documents(files[3:], text_format="text-file")) == []


# --- split layouts ------------------------------------------------------------------------------


def layout(root: Path, files: list[str]) -> str:
    for name in files:
        if name.endswith(".parquet"):
            write_parquet(root / name, [f"{name} {i}" for i in range(3)])
        else:
            write(root / name, json_lines([name]))
    return str(root)


def test_split_folders(tmp_path):
    root = layout(tmp_path, ["train/a.jsonl.gz", "train/b.jsonl.gz", "validation/v.jsonl", "test/t.jsonl",
                             "other/x.jsonl", ".hidden/train.jsonl", "README.md"])
    assert find_splits(root) == {"train": ["train/*"], "validation": ["validation/*"], "test": ["test/*"]}


def test_hugging_face_parquet_shards(tmp_path):
    root = layout(tmp_path, ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
                             "data/validation-00000-of-00001.parquet", "data/test-00000-of-00001.parquet",
                             "README.md"])
    splits = find_splits(root)
    assert splits == {"train": ["data/train-*.parquet"], "validation": ["data/validation-*.parquet"],
                      "test": ["data/test-*.parquet"]}
    files = expand_files(root, splits["train"])
    assert [Path(f).name for f in files] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert len(list(iter_documents(files))) == 6


def test_split_names_that_share_a_prefix_get_exact_shard_patterns(tmp_path):
    root = layout(tmp_path, ["data/train-00000-of-00001.parquet", "data/train-clean-00000-of-00001.parquet"])
    splits = find_splits(root)
    assert set(splits) == {"train", "train-clean"}
    assert [Path(f).name for f in expand_files(root, splits["train"])] == ["train-00000-of-00001.parquet"]
    assert [Path(f).name for f in expand_files(root, splits["train-clean"])] == [
        "train-clean-00000-of-00001.parquet"]


def test_data_split_folders_and_split_files(tmp_path):
    root = layout(tmp_path, ["data/train/0.jsonl", "data/validation/0.jsonl"])
    assert find_splits(root) == {"train": ["data/train/*"], "validation": ["data/validation/*"]}
    other = layout(tmp_path / "files", ["train.jsonl.gz", "test.jsonl"])
    assert find_splits(other) == {"train": ["train.jsonl.gz"], "test": ["test.jsonl"]}


def test_config_folders(tmp_path):
    root = layout(tmp_path, ["en/train-00000-of-00001.parquet", "en/validation-00000-of-00001.parquet",
                             "de/data/train-00000-of-00001.parquet", "fr/train/0000.parquet"])
    with pytest.raises(DatasetError, match=r"holds several configs \(de, en, fr\); choose one with config="):
        find_splits(root)
    assert find_splits(root, "en") == {"train": ["en/train-*.parquet"], "validation": ["en/validation-*.parquet"]}
    assert find_splits(root, "de") == {"train": ["de/data/train-*.parquet"]}
    assert find_splits(root, "fr") == {"train": ["fr/train/*"]}
    assert len(list(iter_documents(expand_files(root, find_splits(root, "de")["train"])))) == 3
    with pytest.raises(DatasetError, match=r"no config folder 'es' \(it contains: de/, en/, fr/\)"):
        find_splits(root, "es")
    single = layout(tmp_path / "single", ["default/train-00000-of-00001.parquet"])
    assert find_splits(single) == {"train": ["default/train-*.parquet"]}


def test_no_split_is_an_error_naming_the_root_and_what_it_holds(tmp_path):
    root = layout(tmp_path / "flat", ["documents/a.json.gz", "notes.md"])
    contents = r".*it contains: documents/, notes\.md"
    with pytest.raises(DatasetError, match=re.escape(f"{root}: no split found") + contents):
        find_splits(root)
    with pytest.raises(DatasetError, match=r"no-such-dir: not found"):
        find_splits(str(tmp_path / "no-such-dir"))


# --- errors ---------------------------------------------------------------------------------------


def truncated(compress):
    return lambda path: path.write_bytes(compress(json_lines([f"doc {i}" for i in range(20_000)]))[:-2000])


def invalid_parquet_type(path: Path) -> None:
    pq.write_table(pa.table({"text": [1, 2, 3]}), path)


def bad_gzip_checksum(path: Path) -> None:
    data = bytearray(gzip.compress(json_lines([f"doc {i}" for i in range(20_000)])))
    data[-8] ^= 0xFF  # the CRC-32 of the trailer
    path.write_bytes(bytes(data))


ERRORS = {
    "malformed JSON": ("a.jsonl", lambda p: p.write_text('{"text": "ok"}\n{not json\n'),
                       r"a\.jsonl, line 2: malformed JSON \(unexpected character, expected a string key at column 2\)"),
    "not an object": ("a.jsonl", lambda p: p.write_text('{"text": "ok"}\n\n[1, 2]\n'),
                      r"a\.jsonl, line 3: a JSON array, not an object"),
    "a string record": ("a.jsonl", lambda p: p.write_text('"just text"\n'), r"a\.jsonl, line 1: a JSON string, not"),
    "missing field": ("a.jsonl", lambda p: p.write_text('{"body": "x", "id": 1}\n'),
                      r"a\.jsonl, line 1: no 'text' field \(fields: 'body', 'id'\)"),
    "null field": ("a.jsonl", lambda p: p.write_text('{"text": "a"}\n{"text": null}\n'),
                   r"a\.jsonl, line 2: 'text' is null, not text"),
    "number field": ("a.jsonl", lambda p: p.write_text('{"text": 7.5}\n'), r"a\.jsonl, line 1: 'text' is float, not"),
    "list field": ("a.jsonl", lambda p: p.write_text('{"text": ["a"]}\n'), r"a\.jsonl, line 1: 'text' is list, not"),
    "invalid UTF-8 in JSON": ("a.jsonl", lambda p: p.write_bytes(b'{"text": "ok"}\n{"text": "b\xffd"}\n'),
                              r"a\.jsonl, line 2: invalid UTF-8 at byte 12 of the line"),
    "truncated gzip": ("a.jsonl.gz", truncated(gzip.compress),
                       r"a\.jsonl\.gz, line \d{4,5}: corrupt or truncated gzip data; lines 1-\d+ were read"),
    "truncated zstd": ("a.jsonl.zst", truncated(lambda b: zstandard.ZstdCompressor().compress(b)),
                       r"a\.jsonl\.zst, line \d{4,5}: corrupt or truncated zstd data; lines 1-\d+ were read"),
    "truncated bz2": ("a.jsonl.bz2", truncated(bz2.compress),
                      r"a\.jsonl\.bz2, line \d{4,5}: corrupt or truncated bz2 data; lines 1-\d+ were read"),
    "gzip checksum": ("a.jsonl.gz", bad_gzip_checksum,
                      r"a\.jsonl\.gz, line \d+: corrupt or truncated gzip data; lines 1-\d+ were read \("
                      r"Error -3 while decompressing data: incorrect data check\)"),
    "not gzip": ("a.jsonl.gz", lambda p: p.write_text('{"text": "plain"}\n'),
                 r"a\.jsonl\.gz, line 1: corrupt or truncated gzip data; nothing could be read"),
    "truncated xz": ("a.jsonl.xz", truncated(lzma.compress),
                     r"a\.jsonl\.xz, line \d{4,5}: corrupt or truncated xz data; lines 1-\d+ were read"),
    "not zstd": ("a.jsonl.zst", lambda p: p.write_text('{"text": "plain"}\n'),
                 r"a\.jsonl\.zst, line 1: corrupt or truncated zstd data; nothing could be read \(zstd decompressor"),
    "corrupt bz2": ("a.jsonl.bz2", lambda p: p.write_bytes(b"BZh9" + bytes(100)),
                    r"a\.jsonl\.bz2, line 1: corrupt or truncated bz2 data"),
    "not parquet": ("a.parquet", lambda p: p.write_text("id,text\n1,hello\n"),
                    r"a\.parquet: not a readable parquet file \(.*magic bytes"),
    "truncated parquet": ("a.parquet", lambda p: (write_parquet(p, TEXTS), p.write_bytes(p.read_bytes()[:-100])),
                          r"a\.parquet: not a readable parquet file"),
    "parquet without the column": ("a.parquet", lambda p: pq.write_table(pa.table({"id": [1], "body": ["x"]}), p),
                                   r"a\.parquet: no 'text' column \(columns: id, body\)"),
    "parquet column not text": ("a.parquet", invalid_parquet_type, r"a\.parquet: column 'text' is int64, not text"),
    "parquet null": ("a.parquet", lambda p: write_parquet(p, ["a", "b", "c", "d", None, "f"], row_group_size=2),
                     r"a\.parquet, row 5: 'text' is null, not text"),
    "plain .txt under auto": ("a.txt", lambda p: p.write_text("hello\n"),
                              r"a\.txt: plain text; choose text_format='text-file' .* or 'text-lines'"),
    "unknown suffix": ("a.csv", lambda p: p.write_text("a,b\n"),
                       r"a\.csv: the name does not tell the format .*choose text_format= one of jsonl, parquet"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_bad_input_names_the_file_and_the_line_or_row(tmp_path, case):
    name, make, error = ERRORS[case]
    make(tmp_path / name)
    with pytest.raises(DatasetError) as caught:
        read_all(str(tmp_path / name))
    message = str(caught.value)
    assert message.startswith(str(tmp_path / name)), message
    assert re.search(error, message), message


@pytest.mark.parametrize("fmt, data, error", [
    ("text-lines", b"fine\n\nb\xe9d line\n",
     r"a\.txt, line 3: invalid UTF-8 at byte 2 of the line \(b'\\xe9': invalid continuation"),
    ("text-file", b"fine\nstill fine\nab\xffc\n", r"a\.txt, line 3: invalid UTF-8 at byte 3 of the line \(b'\\xff'"),
])
def test_invalid_utf8_in_text_names_the_line_and_byte(tmp_path, fmt, data, error):
    (tmp_path / "a.txt").write_bytes(data)
    with pytest.raises(DatasetError, match=error):
        read_all(str(tmp_path / "a.txt"), text_format=fmt)


def test_an_error_surfaces_where_it_is_after_the_good_documents(tmp_path):
    texts = [f"doc {i}" for i in range(20_000)]
    file = tmp_path / "a.jsonl.gz"
    truncated(gzip.compress)(file)
    read: list[str] = []
    with pytest.raises(DatasetError) as caught:
        for batch in iter_text_batches(str(file), batch_size=500):
            read.extend(batch)
    line = int(re.search(r"line (\d+):", str(caught.value)).group(1))
    assert 10_000 < len(read) < 20_000 and read == texts[:len(read)]
    assert len(read) <= line - 1 <= len(read) + 500  # the line reached, within the batch that was building
    bad = tmp_path / "late.jsonl"
    bad.write_bytes(json_lines(texts[:5000]) + b"{oops\n" + json_lines(texts[:5000]))
    with pytest.raises(DatasetError, match=r"late\.jsonl, line 5001: malformed JSON"):
        read_all(str(bad))


def test_an_unknown_format_or_bad_batch_size_is_refused():
    with pytest.raises(ValueError, match="text_format 'csv' is not one of auto, jsonl, parquet, text-file"):
        read_all("a.csv", text_format="csv")
    with pytest.raises(ValueError, match="batch_size must be positive"):
        read_all("a.jsonl", batch_size=0)


def test_errors_keep_the_messages_the_old_reader_gave(tmp_path):
    """Callers and docs match on these: line numbers, the field, the Python type name."""
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": 7}) + "\n")
    with pytest.raises(DatasetError, match=r"a\.jsonl, line 1: 'text' is int, not text"):
        read_all(str(tmp_path / "a.jsonl"))
