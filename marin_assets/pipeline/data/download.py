"""Download: a Hugging Face dataset at a pinned revision, or files from any fsspec URL.

Each file is streamed to a hidden temporary name and renamed into place when complete, so
a file that exists is whole; a re-run after a crash skips files already there with the
expected size. Sizes and sha256 checksums go into the record; a Hugging Face revision is
resolved to its commit sha first, so the record says exactly what was downloaded.
Credentials (`HF_TOKEN`, cloud credentials) come from the environment and are never recorded.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by

CHUNK = 8 * 2**20


class DownloadError(RuntimeError):
    """A source cannot be read: unreachable, missing, unknown revision, size mismatch."""


@dataclass(frozen=True)
class DownloadedFile:
    """One file of a download: its path in the output, size and sha256."""

    path: str
    """Relative to the output."""
    size: int
    sha256: str
    skipped: bool = False
    """Already complete from an earlier attempt."""


@record_type("download")
@dataclass(frozen=True)
class Download:
    """What a download copied: the source, the resolved revision, and every file."""

    source: str
    revision: str | None
    """The commit sha a Hugging Face revision resolved to; None for plain URLs."""
    files: list[DownloadedFile]
    bytes: int


@dataclass(frozen=True)
class Expected:
    """What the source says a file is; a file already there is kept only if it matches."""

    size: int | None = None
    sha256: str | None = None
    git_blob_id: str | None = None
    """sha1 of `blob <size>\0<content>`: what a git host publishes for a non-LFS file."""


class _Digests:
    def __init__(self, size: int | None):
        self.sha256 = hashlib.sha256()
        self.blob = hashlib.sha1(f"blob {size}\0".encode()) if size is not None else None

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        if self.blob is not None:
            self.blob.update(chunk)

    def mismatch(self, size: int, expected: Expected) -> str | None:
        if expected.size is not None and size != expected.size:
            return f"{size} bytes, expected {expected.size}"
        if expected.sha256 and self.sha256.hexdigest() != expected.sha256:
            return f"sha256 {self.sha256.hexdigest()}, expected {expected.sha256}"
        if expected.git_blob_id and self.blob is not None and self.blob.hexdigest() != expected.git_blob_id:
            return f"git blob {self.blob.hexdigest()}, expected {expected.git_blob_id}"
        return None


def _digest_file(fs, path: str, size: int) -> _Digests:
    digests = _Digests(size)
    with fs.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digests.update(chunk)
    return digests


def copy_file(source_url: str, output_path: str, relative: str, expected: Expected = Expected(),
              storage_options: dict | None = None) -> DownloadedFile:
    """Stream one file into `output_path/relative`, atomically; skip it if already complete and intact."""
    out_fs, target = fsspec.core.url_to_fs(join_path(output_path, relative))
    if out_fs.exists(target):
        size = out_fs.size(target)
        if expected.size is None or size == expected.size:
            digests = _digest_file(out_fs, target, size)
            if digests.mismatch(size, expected) is None:
                return DownloadedFile(relative, size, digests.sha256.hexdigest(), skipped=True)
    parent, name = target.rsplit("/", 1)
    partial = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.part"
    out_fs.makedirs(parent, exist_ok=True)
    try:
        siblings = out_fs.ls(parent, detail=False)
    except FileNotFoundError:  # an object store's "folder" with nothing in it yet
        siblings = []
    for stale in siblings:  # left by an attempt killed mid-copy (we hold the lease)
        stale_name = stale.rstrip("/").rsplit("/", 1)[-1]
        if stale_name.startswith(f".{name}.") and stale_name.endswith(".part"):
            out_fs.rm(stale)
    digests, size = _Digests(expected.size), 0
    try:
        with fsspec.open(source_url, "rb", **(storage_options or {})) as src, out_fs.open(partial, "wb") as dst:
            while chunk := src.read(CHUNK):
                digests.update(chunk)
                dst.write(chunk)
                size += len(chunk)
        problem = digests.mismatch(size, expected)
        if problem:
            raise DownloadError(f"{source_url}: got {problem}")
        out_fs.mv(partial, target)
    except FileNotFoundError:
        raise DownloadError(f"{source_url}: not found") from None
    except OSError as e:
        raise DownloadError(f"{source_url}: cannot read ({type(e).__name__}: {e})") from None
    except Exception as e:
        if type(e).__module__.startswith(("aiohttp", "httpx", "requests", "urllib3")):  # hf:// reads use httpx
            raise DownloadError(f"{source_url}: unreachable ({type(e).__name__}: {e})") from None
        raise
    finally:
        if out_fs.exists(partial):
            out_fs.rm(partial)
    return DownloadedFile(relative, size, digests.sha256.hexdigest())


def download_urls(output_path: str, urls: Sequence[str]) -> Download:
    """Copy files from fsspec URLs (https://, gs://, s3://, file://, hf://, local paths; globs expand)."""
    files: list[DownloadedFile] = []
    planned: dict[str, str] = {}
    for url in urls:
        for source, relative, _ in _sources(url):
            if relative in planned:  # two folders' `val/part-0.jsonl` would overwrite each other
                raise DownloadError(f"{planned[relative]} and {source} would both be copied to {relative!r}; use one"
                                    " glob over their common parent (a glob keeps the path below its fixed part)")
            planned[relative] = source
    for url in urls:
        for source, relative, _ in _sources(url):
            files.append(copy_file(source, output_path, relative))
    if not files:
        raise DownloadError(f"nothing to download: {list(urls)} matched no files")
    return Download(", ".join(urls), None, files, sum(f.size for f in files))


_STAMPS = ("ETag", "etag", "generation", "md5Hash", "Last-Modified", "LastModified", "mtime", "updated")
"""Listing fields that change when a file does, by store (HTTP, S3, GCS, local), first found wins."""


def url_source_version(urls: Sequence[str]) -> str:
    """What `urls` name now, as a digest of each file's path, size and etag or mtime.

    One listing per URL (a glob, a folder's `find`, or one HEAD for a file): cheap enough for
    a sensor tick, and it changes when a file is added, removed, resized or rewritten.
    """
    entries = []
    for url in urls:
        for source, _, info in _sources(url, detail=True):
            stamp = next((str(info[k]) for k in _STAMPS if info.get(k) is not None), None)
            entries.append([source, info.get("size"), stamp])
    return hashlib.sha256(json.dumps(sorted(entries)).encode()).hexdigest()[:16]


def _sources(url: str, detail: bool = False) -> list[tuple[str, str, dict]]:
    """(source URL, relative output path, listing info) triples; a glob keeps the path below its
    fixed part. `info` is filled only with `detail` (listings are read fresh, not from a cache)."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise DownloadError(f"{url}: unsupported URL ({e})") from None
    protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
    if protocol == "file://":
        protocol = ""
    if detail:
        fs.invalidate_cache()
    try:
        if any(c in path for c in "*?["):
            base = path[: min(path.index(c) for c in "*?[" if c in path)].rsplit("/", 1)[0]
            matches = fs.glob(path, detail=True)
            files = {m: info for m, info in matches.items() if info.get("type") != "directory"}
            if not files:
                raise DownloadError(f"{url}: the pattern matches no files")
            return [(_with_protocol(protocol, m), m[len(base):].lstrip("/"), files[m] if detail else {})
                    for m in sorted(files)]
        if not fs.exists(path):
            fs.cat_file(path, start=0, end=1)  # exists() hides why; a connection error surfaces here
            raise DownloadError(f"{url}: not found")
        if fs.isdir(path):
            found = fs.find(path, detail=True)
            return [(_with_protocol(protocol, m), m[len(path.rstrip("/")):].lstrip("/"), found[m] if detail else {})
                    for m in sorted(found)]
        info = fs.info(path) if detail else {}
    except DownloadError:
        raise
    except FileNotFoundError:
        raise DownloadError(f"{url}: not found") from None
    except Exception as e:
        raise DownloadError(f"{url}: unreachable ({type(e).__name__}: {e})") from None
    return [(url, path.rstrip("/").rsplit("/", 1)[-1], info)]


def _with_protocol(protocol: str, path: str) -> str:
    return path if not protocol or path.startswith(protocol) else protocol + path


def download_hf(output_path: str, repo_id: str, revision: str = "main", include: Sequence[str] = ("*",),
                repo_type: str = "dataset") -> Download:
    """Download a Hugging Face dataset at a revision, resolved to its commit, through `huggingface_hub`.

    The hub endpoint comes from `HF_ENDPOINT` and the token from `HF_TOKEN`, as for every
    Hugging Face client.
    """
    info = _repo_info(repo_id, revision, repo_type, files_metadata=True)
    sha = info.sha
    wanted = [s for s in info.siblings if any(fnmatch.fnmatch(s.rfilename, p) for p in include)]
    if not wanted:
        raise DownloadError(f"{repo_type} {repo_id}@{sha}: no files match {list(include)}")
    prefix = {"dataset": "datasets/", "space": "spaces/"}.get(repo_type, "")
    files = []
    for sibling in wanted:
        lfs = sibling.lfs
        expected = Expected(size=sibling.size, sha256=lfs.sha256 if lfs else None,
                            git_blob_id=None if lfs else sibling.blob_id)
        files.append(copy_file(f"hf://{prefix}{repo_id}@{sha}/{sibling.rfilename}", output_path,
                               sibling.rfilename, expected))
    _remove_files_not_in(output_path, {f.path for f in files})
    return Download(f"hf://{prefix}{repo_id}", sha, files, sum(f.size for f in files))


def hf_source_version(repo_id: str, revision: str = "main", repo_type: str = "dataset") -> str:
    """The commit a Hugging Face revision points at now: one hub API call."""
    return _repo_info(repo_id, revision, repo_type, files_metadata=False).sha


def _repo_info(repo_id: str, revision: str, repo_type: str, files_metadata: bool):
    import httpx  # huggingface_hub's HTTP client: its HfHubHTTPError is an httpx.HTTPError, and so is ConnectError
    from huggingface_hub import HfApi
    from huggingface_hub.utils import RepositoryNotFoundError, RevisionNotFoundError

    try:
        return HfApi().repo_info(repo_id, revision=revision, repo_type=repo_type, files_metadata=files_metadata)
    except RevisionNotFoundError:
        raise DownloadError(f"{repo_type} {repo_id}: revision {revision!r} not found") from None
    except RepositoryNotFoundError:
        raise DownloadError(f"{repo_type} {repo_id}: repository not found (or not accessible)") from None
    except (httpx.HTTPError, OSError) as e:
        raise DownloadError(f"{repo_type} {repo_id}: hub unreachable ({type(e).__name__}: {e})") from None


def is_commit_sha(revision: str) -> bool:
    """True for a full 40-hex-digit git commit sha (a pinned revision that cannot move)."""
    return re.fullmatch(r"[0-9a-f]{40}", revision) is not None


def _remove_files_not_in(output_path: str, keep: set[str]) -> None:
    """Files an attempt at an older commit left behind (not hidden bookkeeping files)."""
    fs, root = fsspec.core.url_to_fs(output_path)
    for path in fs.find(root):
        relative = path[len(root.rstrip("/")):].lstrip("/")
        if relative not in keep and not any(part.startswith(".") for part in relative.split("/")):
            fs.rm(path)


def files_match_record(output_path: str, result: dict) -> CheckOutcome:
    """Every recorded file is there with its recorded size: one listing of the output."""
    fs, root = fsspec.core.url_to_fs(output_path)
    fs.invalidate_cache(root)
    found = {p[len(root.rstrip("/")):].lstrip("/"): info.get("size") for p, info in fs.find(root, detail=True).items()}
    wrong = [f"{f['path']}: " + (f"{found[f['path']]} bytes" if f["path"] in found else "missing")
             + f", recorded {f['size']}" for f in result["files"] if found.get(f["path"]) != f["size"]]
    n = len(result["files"])
    message = f"{n} files match their recorded sizes" if not wrong else f"{len(wrong)} of {n} files differ: " + (
        "; ".join(wrong[:5]))
    return CheckOutcome(not wrong, message, {"files": n, "mismatched": len(wrong)})


FILES_MATCH_RECORD = Check("files_match_record", files_match_record,
                           "Every downloaded file exists with the size recorded when it was downloaded.")


def hf_download_step(name: str, repo_id: str, revision: str, include: Sequence[str] = ("*",),
                     repo_type: str = "dataset") -> Step:
    """A copy of a Hugging Face repository's `include` files at `revision`, resumable.
    Pin `revision` to a commit sha for a reproducible identity; a branch is followed by the
    source sensor (its commit is the step's source version), a pinned commit never changes.

    Identity: `repo_id`, `revision`, `include`, `repo_type`.
    """
    return Step(
        name=name,
        fn=lambda out: download_hf(out, repo_id, revision, include, repo_type),
        hash_attrs={"repo_id": repo_id, "revision": revision, "include": list(include), "repo_type": repo_type},
        kind="download",
        description=made_by(download_hf),
        source_version=None if is_commit_sha(revision) else lambda: hf_source_version(repo_id, revision, repo_type),
        kinds=["huggingface"],
        checks=[FILES_MATCH_RECORD],
    )


def url_download_step(name: str, urls: Sequence[str]) -> Step:
    """A copy of any fsspec URLs (`https://`, `gs://`, `s3://`, `hf://`, local paths, globs), resumable.

    Identity: `urls`.
    """
    return Step(
        name=name,
        fn=lambda out: download_urls(out, urls),
        hash_attrs={"urls": list(urls)},
        kind="download",
        description=made_by(download_urls),
        source_version=lambda: url_source_version(urls),
        checks=[FILES_MATCH_RECORD],
    )


__all__ = ["Download", "DownloadError", "download_hf", "download_urls", "hf_download_step", "hf_source_version",
           "url_download_step", "url_source_version"]
