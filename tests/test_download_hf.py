"""download_hf against a local Hugging Face Hub emulator (tests/hub_server.py), offline.

The real `huggingface_hub` client does the work: HfApi.repo_info resolves the revision and
lists files, `hf://` (HfFileSystem) streams them with Range requests, LFS files through a 302.
"""

import dataclasses
import gzip
import hashlib
import json
import os
import random

import pytest

from marin_assets.pipeline.data.download import DownloadError, download_hf
from tests.support.hub_server import HubRepo, release_hub, serve_hub, use_hub

REPO = "user/tiny-stories"
TOKEN = "hf_emulatorSecretToken0123456789"


def jsonl_gz(prefix: str, n: int) -> bytes:
    return gzip.compress("".join(json.dumps({"text": f"{prefix} story {i}"}) + "\n" for i in range(n)).encode(),
                         mtime=0)


FILES = {
    "README.md": "# Tiny stories\n",
    "data/train-00000.jsonl.gz": jsonl_gz("train0", 200),
    "data/train-00001.jsonl.gz": jsonl_gz("train1", 300),
    # Larger than download.CHUNK plus fsspec's read-ahead block: read with several Range requests.
    "data/train-00002.jsonl.gz": random.Random(0).randbytes(20 * 2**20 + 123),
    "data/validation.jsonl": '{"text": "valid"}\n',
    "data/extra/nested.jsonl.gz": jsonl_gz("nested", 5),
}
GZ = sorted(p for p in FILES if p.startswith("data/") and p.endswith(".jsonl.gz"))  # fnmatch's * crosses /


def sha256(data) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def content(path: str) -> bytes:
    data = FILES[path]
    return data.encode() if isinstance(data, str) else data


@pytest.fixture
def repo():
    return HubRepo(REPO, FILES)


@pytest.fixture
def hub(repo, monkeypatch):
    """The emulator, with huggingface_hub pointed at it.

    `huggingface_hub.constants` reads HF_ENDPOINT and HF_HUB_OFFLINE (which the Makefile sets to 1)
    once, at import, and by now something has imported it; so `use_hub` sets the environment
    variables (for subprocesses and a fresh import) AND monkeypatches the module-level copies
    (constants.ENDPOINT, constants.HF_HUB_OFFLINE, the resolve-URL template), which the client
    reads on every call. fsspec caches HfFileSystem instances, each holding the endpoint it was
    created with, so the cache is cleared before and after: otherwise `hf://` in a later test
    would call the previous test's (stopped) server.
    """
    with serve_hub(repo) as server:
        use_hub(monkeypatch, server.url)
        yield server
        assert not server.errors, server.errors[0]
    release_hub()


def test_download_main_with_include_patterns(tmp_path, repo, hub):
    out = tmp_path / "out"
    result = download_hf(str(out), REPO, include=("data/*.jsonl.gz",))

    assert result.revision == repo.head and len(result.revision) == 40
    assert all(c in "0123456789abcdef" for c in result.revision)
    assert result.source == f"hf://datasets/{REPO}"
    assert [f.path for f in result.files] == GZ
    for f in result.files:
        assert f.size == len(content(f.path)) == os.path.getsize(out / f.path)
        assert f.sha256 == sha256(content(f.path)) == sha256((out / f.path).read_bytes())
        assert not f.skipped
    assert result.bytes == sum(len(content(p)) for p in GZ)
    assert not (out / "README.md").exists() and not (out / "data" / "validation.jsonl").exists()
    assert not [n for _, _, names in os.walk(out) for n in names if n.endswith(".part")]

    # Files are read at the resolved commit (never at the moving branch), the big one in ranges.
    reads = [r for r in hub.requests if "/resolve/" in r.path]
    assert reads and all(f"/resolve/{repo.head}/" in r.path for r in reads)
    big = [r for r in hub.requests_to("/resolve/") + hub.requests_to("/cdn-lfs/")
           if "range" in r.headers]
    assert len(big) >= 2


def test_pinned_tag_sha_and_branch_follow_commits(tmp_path, repo, hub):
    old = repo.head
    repo.tag("v1.0")
    repo.create_branch("release/2024")  # a slash: one percent-encoded path segment on the wire
    include = ("data/train-0000[01].jsonl.gz",)
    for revision in ("v1.0", old, "release/2024", "refs/heads/main"):
        got = download_hf(str(tmp_path / revision.replace("/", "_")), REPO, revision=revision, include=include)
        assert got.revision == old, revision

    changed = jsonl_gz("train0-v2", 250)
    new = repo.commit({"data/train-00000.jsonl.gz": changed, "data/train-00001.jsonl.gz": None},
                      message="Regenerate shard 0, drop shard 1")
    assert new != old and repo.head == new

    at_main = download_hf(str(tmp_path / "main-now"), REPO, revision="main", include=include)
    assert at_main.revision == new
    assert [(f.path, f.sha256) for f in at_main.files] == [("data/train-00000.jsonl.gz", sha256(changed))]

    for revision in (old, "v1.0"):
        pinned = download_hf(str(tmp_path / f"pinned-{revision}"), REPO, revision=revision, include=include)
        assert pinned.revision == old
        assert {f.path: f.sha256 for f in pinned.files} == {p: sha256(content(p)) for p in
                                                           ("data/train-00000.jsonl.gz", "data/train-00001.jsonl.gz")}
        assert (tmp_path / f"pinned-{revision}" / "data/train-00000.jsonl.gz").read_bytes() == content(
            "data/train-00000.jsonl.gz")


def test_unknown_revision_repo_or_pattern_is_a_clear_error(tmp_path, hub):
    with pytest.raises(DownloadError, match="revision 'no-such-branch' not found"):
        download_hf(str(tmp_path / "a"), REPO, revision="no-such-branch")
    with pytest.raises(DownloadError, match=f"revision '{'0' * 40}' not found"):
        download_hf(str(tmp_path / "b"), REPO, revision="0" * 40)
    with pytest.raises(DownloadError, match="user/no-such-repo: repository not found"):
        download_hf(str(tmp_path / "c"), "user/no-such-repo")
    with pytest.raises(DownloadError, match=r"no files match \['\*\.csv'\]"):
        download_hf(str(tmp_path / "d"), REPO, include=("*.csv",))
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


def test_an_unreachable_hub_is_a_clear_error(tmp_path, monkeypatch):
    with serve_hub() as stopped:
        url = stopped.url  # nothing listens there once it stops
    use_hub(monkeypatch, url)
    try:
        with pytest.raises(DownloadError, match=rf"dataset {REPO}: hub unreachable \(ConnectError: "):
            download_hf(str(tmp_path / "a"), REPO)
    finally:
        release_hub()


def test_rerun_skips_complete_files_and_redoes_broken_ones(tmp_path, hub):
    out = tmp_path / "out"
    include = ("data/train-0000[01].jsonl.gz", "README.md")
    first = download_hf(str(out), REPO, include=include)
    assert not any(f.skipped for f in first.files)

    reads_before = len(hub.requests_to("/resolve/"))
    again = download_hf(str(out), REPO, include=include)
    assert [f.skipped for f in again.files] == [True, True, True]
    assert [(f.path, f.size, f.sha256) for f in again.files] == [(f.path, f.size, f.sha256) for f in first.files]
    assert len(hub.requests_to("/resolve/")) == reads_before  # nothing was fetched again

    # A crash left a truncated copy and a temporary file: both are replaced on the next run.
    (out / "data/train-00001.jsonl.gz").write_bytes(content("data/train-00001.jsonl.gz")[:100])
    (out / "data/.train-00000.jsonl.gz.deadbeef.part").write_bytes(b"half")
    (out / "data/train-00000.jsonl.gz").unlink()
    third = download_hf(str(out), REPO, include=include)
    assert {f.path: f.skipped for f in third.files} == {
        "README.md": True, "data/train-00000.jsonl.gz": False, "data/train-00001.jsonl.gz": False}
    for f in third.files:
        assert (out / f.path).read_bytes() == content(f.path)


def test_token_is_sent_but_never_recorded(tmp_path, monkeypatch, hub):
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # read per request, so setting it now is enough
    out = tmp_path / "out"
    result = download_hf(str(out), REPO, include=("README.md", "data/train-00000.jsonl.gz"))

    for r in hub.requests_to("/api/") + hub.requests_to("/resolve/"):
        assert r.headers.get("authorization") == f"Bearer {TOKEN}", r.path
    cdn = hub.requests_to("/cdn-lfs/")  # the LFS file's bytes, on another host: the token stays on the hub
    assert cdn and all("authorization" not in r.headers for r in cdn)
    assert TOKEN not in repr(result)
    assert TOKEN not in json.dumps(dataclasses.asdict(result))
    for root, _, names in os.walk(out):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                assert TOKEN.encode() not in f.read()


def test_anonymous_requests_carry_no_token(tmp_path, hub):
    download_hf(str(tmp_path / "out"), REPO, include=("README.md",))
    assert hub.requests and not any("authorization" in r.headers for r in hub.requests)


def test_resume_after_the_branch_moved_redownloads_changed_files(tmp_path, repo, hub):
    # An attempt at main@A completed shard 0, then failed; main moves to B, where shard 0 has new
    # bytes of the same size; the retry (same output path: the step's identity says "main") must
    # produce B's bytes, not keep A's nor fail on the checksum forever.
    out = tmp_path / "out"
    path = "data/train-00000.jsonl.gz"
    download_hf(str(out), REPO, include=(path,))
    old = content(path)
    new = bytes(b ^ 0xFF for b in old)  # same size, other bytes
    b = repo.commit({path: new})
    result = download_hf(str(out), REPO, include=(path,))
    assert result.revision == b
    assert (out / path).read_bytes() == new and result.files[0].sha256 == sha256(new)
