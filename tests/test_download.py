"""Download from fsspec URLs: a local HTTP server, local folders, globs, resume, errors."""

import hashlib
import os

import pytest

from marin_assets.pipeline.data.download import DownloadError, download_urls
from tests.support.servers import serve_directory


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src" / "data"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"part-{i}.jsonl").write_text("".join(f'{{"text": "doc {i}-{j}"}}\n' for j in range(50)))
    (src / "README.md").write_text("not data")
    return src


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_http_glob_download_records_sizes_and_checksums(tmp_path, source):
    out = str(tmp_path / "out")
    with serve_directory(source.parent) as url:
        result = download_urls(out, [f"{url}/data/*.jsonl"])
    assert [f.path for f in result.files] == ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    for f in result.files:
        assert f.size == os.path.getsize(source / f.path) == os.path.getsize(os.path.join(out, f.path))
        assert f.sha256 == sha(source / f.path) and not f.skipped
    assert result.bytes == sum(f.size for f in result.files)
    assert not [n for n in os.listdir(out) if n.endswith(".part")]


def test_rerun_skips_complete_files_and_replaces_partial_ones(tmp_path, source):
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-0.jsonl").write_bytes((source / "part-0.jsonl").read_bytes())  # finished before a crash
    (out / ".part-1.jsonl.abcd1234.part").write_text('{"text": "half')  # a crash left this
    before = os.stat(out / "part-0.jsonl").st_mtime_ns
    result = download_urls(str(out), [str(source / "*.jsonl")])
    assert [f.skipped for f in result.files] == [True, False, False]
    assert os.stat(out / "part-0.jsonl").st_mtime_ns == before
    assert sha(out / "part-1.jsonl") == sha(source / "part-1.jsonl")
    assert not [n for n in os.listdir(out) if n.endswith(".part")]  # the killed attempt's partial is gone


def test_a_single_file_and_a_folder(tmp_path, source):
    one = download_urls(str(tmp_path / "one"), [f"file://{source}/README.md"])
    assert [f.path for f in one.files] == ["README.md"]
    folder = download_urls(str(tmp_path / "folder"), [str(source)])
    assert sorted(f.path for f in folder.files) == ["README.md", "part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]


def test_missing_and_unreachable_sources_are_clear_errors(tmp_path, source):
    with pytest.raises(DownloadError, match="does-not-exist: not found"):
        download_urls(str(tmp_path / "a"), [str(tmp_path / "does-not-exist")])
    with pytest.raises(DownloadError, match="matches no files"):
        download_urls(str(tmp_path / "b"), [str(source / "*.parquet")])
    with serve_directory(source.parent) as url:
        with pytest.raises(DownloadError, match="missing.jsonl: not found"):
            download_urls(str(tmp_path / "c"), [f"{url}/data/missing.jsonl"])
    with pytest.raises(DownloadError, match="unreachable"):
        download_urls(str(tmp_path / "d"), ["http://127.0.0.1:9/nothing-listens-here.jsonl"])
    assert not os.path.exists(tmp_path / "c" / "missing.jsonl")
