"""Hub upload: a step's output folder (an export, a tokenized cache) to a Hugging Face repository
branch, in commits of bounded size.

One commit of thousands of files or hundreds of GB is slow, times out, and is all lost when it
fails; so files go, in path order, in commits of at most `max_commit_files` files and
`max_commit_bytes` bytes (a larger file goes alone). A re-run after a crash skips every file the
branch already holds with the same content (its LFS sha256 or git blob id, from one listing of
the branch), so it makes only the commits that are missing and never repeats one; content an
interrupted attempt sent without committing is not sent again (with `hf_xet` installed the client
uploads through Xet storage, which already holds its chunks; without it, the hub's LFS batch API
says it has the objects). Hidden files (`.artifact.json`, `.status.json`, unfinished `.part`
files) are bookkeeping, not output, and stay behind.

The token comes from `HF_TOKEN` or the `hf auth login` store, as for every Hugging Face client,
and is never recorded: not in the result, a log line or an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.estimate import bytes_read_estimate
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by

logger = logging.getLogger(__name__)

DEFAULT_MAX_COMMIT_BYTES = 5 * 2**30
"""Bytes per commit: a failed commit costs at most this much to redo."""
DEFAULT_MAX_COMMIT_FILES = 100
"""Files per commit: the Hub's advice for large uploads (`upload_large_folder` commits 20-1000)."""
REPO_TYPES = ("model", "dataset", "space")
CHUNK = 8 * 2**20


class HubUploadError(RuntimeError):
    """An upload cannot go on: no token, no write access, the hub unreachable or refusing a commit."""


@dataclass(frozen=True)
class UploadedFile:
    """One file of an upload: where it is in the repository, its size and content digests."""

    path: str
    """In the repository."""
    size: int
    sha256: str
    git_oid: str
    """sha1 of `blob <size>\\0<content>`: the id the hub reports for a file not stored with LFS."""
    skipped: bool = False
    """The branch already held it with this content (an earlier attempt, or an earlier upload)."""


@record_type("hub_upload")
@dataclass(frozen=True)
class HubUpload:
    """What an upload put where: the repository, branch, the commits made and every file."""

    repo_id: str
    repo_type: str
    branch: str
    path_in_repo: str
    endpoint: str
    revision: str
    """The branch's commit after the upload: pin a download to it."""
    commits: list[str]
    """Commits this upload made, oldest first (none when the branch already held everything)."""
    commit_urls: list[str]
    files: list[UploadedFile]
    files_uploaded: int
    bytes_uploaded: int
    files_skipped: int
    bytes_skipped: int
    seconds: float


def file_digests(fs: Any, path: str) -> tuple[str, str]:
    """(sha256, git blob id) of a file, in one read."""
    sha256 = hashlib.sha256()
    git = hashlib.sha1(f"blob {fs.size(path)}\0".encode())
    with fs.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


def commit_batches(sizes: Sequence[int], max_commit_files: int, max_commit_bytes: int) -> list[range]:
    """Consecutive runs of files, each within both bounds; a file over `max_commit_bytes` goes alone."""
    batches: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_commit_files or total + size > max_commit_bytes):
            batches.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        batches.append(range(start, len(sizes)))
    return batches


def _source_files(source_path: str) -> tuple[Any, str, list[tuple[str, int]]]:
    """The folder's files that are output (no hidden bookkeeping), as (relative path, size), sorted."""
    fs, root = fsspec.core.url_to_fs(source_path)
    if not fs.isdir(root):
        raise HubUploadError(f"{source_path}: not a folder (nothing to upload)")
    root = root.rstrip("/")
    files = []
    for path, info in sorted(fs.find(root, detail=True).items()):
        relative = path[len(root):].lstrip("/")
        if not any(part.startswith(".") for part in relative.split("/")):
            files.append((relative, int(info["size"])))
    if not files:
        raise HubUploadError(f"{source_path}: no files to upload")
    return fs, root, files


def _scrub(text: str) -> str:
    """The text with the token, should a server or library ever echo it, replaced."""
    from huggingface_hub import get_token

    token = get_token()
    return text.replace(token, "hf_***") if token else text


@contextlib.contextmanager
def _hub_errors(where: str, doing: str) -> Iterator[None]:
    """Hub and network failures as one `HubUploadError` saying where, what was being done and why."""
    import httpx  # huggingface_hub's HTTP client: a refused connection is an httpx.ConnectError, not an OSError
    from huggingface_hub.utils import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        cause = (e.server_message or str(e).splitlines()[0]).strip().replace("\n", " ")
        hint = ("; the token (HF_TOKEN or `hf auth login`) may not write there" if status in (401, 403) else
                "; run the step again to resume: files already on the branch are skipped" if doing.startswith("commit")
                else "")
        raise HubUploadError(_scrub(f"{where}: {doing}: the hub answered {status} ({cause}){hint}")) from None
    except HubUploadError:
        raise
    except (httpx.HTTPError, OSError, ValueError, RuntimeError) as e:  # network (httpx), files, malformed answers
        raise HubUploadError(_scrub(f"{where}: {doing}: {type(e).__name__}: {e}")) from None


def _branch_files(api: Any, repo_id: str, repo_type: str, branch: str, folder: str) -> dict[str, Any]:
    """The files the branch holds under `folder`, by path: one (paginated) listing."""
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import EntryNotFoundError

    try:
        entries = list(api.list_repo_tree(repo_id, path_in_repo=folder or None, revision=branch, repo_type=repo_type,
                                          recursive=True))
    except EntryNotFoundError:
        return {}
    return {e.path: e for e in entries if isinstance(e, RepoFile)}


def _holds(remote: Any, size: int, sha256: str, git_oid: str) -> bool:
    """A listed hub file has this content: its LFS sha256, or (not in LFS) its git blob id."""
    if remote is None or remote.size != size:
        return False
    return remote.lfs.sha256 == sha256 if remote.lfs is not None else remote.blob_id == git_oid


def upload_to_hub(output_path: str, source_path: str, repo_id: str, branch: str = "main", repo_type: str = "model",
                  path_in_repo: str = "", max_commit_bytes: int = DEFAULT_MAX_COMMIT_BYTES,
                  max_commit_files: int = DEFAULT_MAX_COMMIT_FILES, endpoint: str | None = None) -> HubUpload:
    """Upload a folder to `repo_id` at `branch` (both created if missing) in bounded commits; resumable.

    Nothing is written to `output_path`: the result (commits, files, digests) is the record.
    `endpoint`: the hub (None: `HF_ENDPOINT`, else huggingface.co).
    """
    from huggingface_hub import CommitOperationAdd, HfApi, get_token

    started = time.monotonic()
    folder = path_in_repo.strip("/")
    where = f"{repo_type} {repo_id}@{branch}"
    if repo_type not in REPO_TYPES or max_commit_bytes <= 0 or max_commit_files <= 0:
        raise HubUploadError(f"{where}: repo_type must be one of {REPO_TYPES} and the commit bounds positive"
                             f" (got {repo_type!r}, {max_commit_bytes} bytes, {max_commit_files} files)")
    fs, root, files = _source_files(source_path)
    if get_token() is None:
        raise HubUploadError(f"{where}: no Hugging Face token; set HF_TOKEN (or run `hf auth login`) to a token that"
                             " may write to the repository")
    api = HfApi(endpoint=endpoint)
    with _hub_errors(where, "creating the repository"):
        api.create_repo(repo_id, repo_type=repo_type, exist_ok=True)
    if branch != "main":
        with _hub_errors(where, "creating the branch"):
            api.create_branch(repo_id, branch=branch, repo_type=repo_type, exist_ok=True)
    with _hub_errors(where, "listing the branch"):
        remote = _branch_files(api, repo_id, repo_type, branch, folder)

    local = isinstance(fs, LocalFileSystem)
    recorded: dict[str, UploadedFile] = {}
    pending: list[tuple[str, int]] = []
    for relative, size in files:
        target = f"{folder}/{relative}" if folder else relative
        existing = remote.get(target)
        if existing is not None and existing.size == size:
            sha256, git_oid = file_digests(fs, f"{root}/{relative}")
            if _holds(existing, size, sha256, git_oid):
                recorded[relative] = UploadedFile(target, size, sha256, git_oid, skipped=True)
                continue
        pending.append((relative, size))

    batches = commit_batches([size for _, size in pending], max_commit_files, max_commit_bytes)
    commits: list[str] = []
    urls: list[str] = []
    name = root.rsplit("/", 1)[-1]
    for number, batch in enumerate(batches, 1):
        chosen = [pending[i] for i in batch]
        size = sum(s for _, s in chosen)
        with tempfile.TemporaryDirectory(prefix="hub-upload-") as staging:
            operations = []
            for relative, file_size in chosen:
                path = f"{root}/{relative}"
                if not local:  # a remote source is staged one commit at a time
                    path = os.path.join(staging, relative)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    fs.get_file(f"{root}/{relative}", path)
                sha256, git_oid = file_digests(fsspec.filesystem("file"), path)
                target = f"{folder}/{relative}" if folder else relative
                recorded[relative] = UploadedFile(target, file_size, sha256, git_oid)
                operations.append(CommitOperationAdd(path_in_repo=target, path_or_fileobj=path))
            title = f"Upload {name} ({number}/{len(batches)}): {len(chosen)} files, {size:,} bytes"
            logger.info(f"{where}: commit {number}/{len(batches)}: {len(chosen)} files, {size:,} bytes")
            with _hub_errors(where, f"commit {number} of {len(batches)} ({len(chosen)} files, {size:,} bytes)"):
                info = api.create_commit(repo_id, operations, commit_message=title, repo_type=repo_type,
                                         revision=branch, commit_description=f"From {source_path}")
        commits.append(info.oid)
        urls.append(info.commit_url)
    if commits:
        head = commits[-1]
    else:
        with _hub_errors(where, "reading the branch"):
            head = api.repo_info(repo_id, repo_type=repo_type, revision=branch).sha or branch
    ordered = [recorded[relative] for relative, _ in files]
    uploaded = [f for f in ordered if not f.skipped]
    skipped = [f for f in ordered if f.skipped]
    return HubUpload(repo_id, repo_type, branch, folder, api.endpoint, head, commits, urls, ordered,
                     len(uploaded), sum(f.size for f in uploaded), len(skipped), sum(f.size for f in skipped),
                     round(time.monotonic() - started, 3))


def branch_holds_files(output_path: str, result: dict) -> CheckOutcome:
    """The branch holds every uploaded file with its content (size and LFS sha256 or git blob id)."""
    from huggingface_hub import HfApi

    where = f"{result['repo_type']} {result['repo_id']}@{result['branch']}"
    api = HfApi(endpoint=result["endpoint"])
    with _hub_errors(where, "listing the branch"):
        remote = _branch_files(api, result["repo_id"], result["repo_type"], result["branch"], result["path_in_repo"])
    wrong = [f["path"] + (": missing" if f["path"] not in remote else ": other content")
             for f in result["files"] if not _holds(remote.get(f["path"]), f["size"], f["sha256"], f["git_oid"])]
    n = len(result["files"])
    message = (f"{where} holds all {n} files" if not wrong
               else f"{where} lacks {len(wrong)} of {n} files: " + "; ".join(wrong[:5]))
    return CheckOutcome(not wrong, message, {"files": n, "missing_or_different": len(wrong)})


BRANCH_HOLDS_FILES = Check("branch_holds_files", branch_holds_files,
                           "The hub branch holds every uploaded file with the uploaded content.")


def hub_upload_step(name: str, source: Step, repo_id: str, branch: str = "main", repo_type: str = "model",
                    path_in_repo: str = "", max_commit_bytes: int = DEFAULT_MAX_COMMIT_BYTES,
                    max_commit_files: int = DEFAULT_MAX_COMMIT_FILES, endpoint: str | None = None) -> Step:
    """`source`'s output uploaded to a hub branch. The commit bounds shape the commits, not what the
    branch ends up holding, so they are not identity.

    Identity: `repo_id`, `branch`, `repo_type`, `path_in_repo`, `endpoint` (and `source`, its dependency).
    """
    if repo_type not in REPO_TYPES or max_commit_bytes <= 0 or max_commit_files <= 0:
        raise StepDefinitionError(f"step {name!r}: repo_type must be one of {REPO_TYPES} and the commit bounds"
                                  f" positive (got {repo_type!r}, {max_commit_bytes} bytes, {max_commit_files} files)")
    return Step(
        name=name,
        fn=lambda out: upload_to_hub(out, source.output_path, repo_id, branch, repo_type, path_in_repo,
                                     max_commit_bytes, max_commit_files, endpoint),
        deps=[source],
        hash_attrs={"repo_id": repo_id, "branch": branch, "repo_type": repo_type,
                    "path_in_repo": path_in_repo.strip("/"), "endpoint": endpoint},
        kind="upload",
        description=made_by(upload_to_hub),
        kinds=["huggingface"],
        checks=[BRANCH_HOLDS_FILES],
        estimate=bytes_read_estimate("upload", lambda: [source]),
    )


__all__ = ["BRANCH_HOLDS_FILES", "HubUpload", "HubUploadError", "UploadedFile", "branch_holds_files",
           "commit_batches", "hub_upload_step", "upload_to_hub"]
