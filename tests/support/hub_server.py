"""A local stand-in for the Hugging Face Hub HTTP API, for tests (standard library only).

It speaks enough of the Hub's protocol that the real `huggingface_hub` client (1.x: `HfApi`,
`HfFileSystem` / `hf://` URLs, `hf_hub_download`) works against it through `HF_ENDPOINT`:

    repo = HubRepo("user/tiny-stories", files={"data/a.jsonl.gz": b"...", "README.md": b"# hi"})
    with serve_hub(repo) as hub:                 # hub.url == "http://127.0.0.1:PORT"
        use_hub(monkeypatch, hub.url)            # point huggingface_hub at it (see use_hub)
        ...
        new_sha = repo.commit({"data/b.jsonl.gz": b"..."})   # main moves; old shas stay readable

Endpoints (repo type `datasets`, `models` (no URL prefix) or `spaces`; `{repo}` is `ns/name` or `name`):

    GET  /api/{type}s/{repo}                              repo info at main
    GET  /api/{type}s/{repo}/revision/{rev}[?blobs=1]     repo info; `blobs` adds size, blobId, lfs
    GET  /api/{type}s/{repo}/tree/{rev}[/{path}]?recursive=&expand=&cursor=   paginated (Link header)
    POST /api/{type}s/{repo}/paths-info/{rev}             form or JSON body: paths (repeated), expand
    GET  /api/{type}s/{repo}/refs[?include_prs=1]         branches, tags (converts, pullRequests empty)
    GET  /api/{type}s/{repo}/commits/{rev}                history, newest first, paginated
    GET|HEAD /[{type}s/]{repo}/resolve/{rev}/{path}       file bytes, Range requests (206/416), ETag,
                                                          X-Repo-Commit; LFS files add X-Linked-Etag and
                                                          X-Linked-Size and 302 to /cdn-lfs/{sha256} on
                                                          another host name (`localhost` for 127.0.0.1)
    GET|HEAD /cdn-lfs/{sha256}                            LFS content (the "CDN"), Range requests

Writes, as `HfApi.create_repo` / `create_branch` / `create_commit` / `preupload_lfs_files` send them
(each needs `Authorization: Bearer <token>`, one of `write_tokens` when given; else 401
"Invalid credentials in Authorization header", as the Hub answers a bad token):

    POST /api/repos/create                                JSON {name, organization, type, private};
                                                          409 (with the repo's url) if it exists; a new
                                                          repo has the Hub's "initial commit" (.gitattributes)
    POST /api/{type}s/{repo}/branch/{branch}              JSON {startingPoint}; 409 if it exists
    POST /api/{type}s/{repo}/preupload/{rev}              which files go to LFS (a .gitattributes pattern,
                                                          over 10 MB, or a binary sample) and the oid a
                                                          path already has on that branch
    POST /[{type}s/]{repo}.git/info/lfs/objects/batch     git-lfs batch API ("basic" transfer): an upload
                                                          action for each object the hub does not hold yet
    PUT  /lfs-upload/{sha256}?X-Amz-Signature=...         the object's bytes (a signed URL: no token);
                                                          the sha256 is checked
    POST /[{type}s/]{repo}.git/info/lfs/objects/verify    the object arrived
    POST /api/{type}s/{repo}/commit/{branch}              NDJSON: header {summary, description,
                                                          parentCommit}, then file (base64), lfsFile
                                                          (an uploaded object), deletedFile, deletedFolder;
                                                          412 if parentCommit is not the branch head,
                                                          422 for an LFS object never uploaded
    POST /api/validate-yaml                               README front matter: accepted
    GET  /api/agent-harnesses                             404 (the client's best-effort fetch of a registry it
                                                          would cache under HF_HOME)

`HubServer(fail_commits_after=k)` answers every commit after the k-th with 503 (an outage: the
client does not retry commits), to test resuming an interrupted upload. Two holds give a test a moment to
kill the uploading client at: `pause_puts_after=n` stops reading the first LFS upload (PUT) once n bytes of
it arrived (`put_paused` is set), `hold_commits_after=k` holds the commit after the k-th, fully received,
before applying it (`commit_held`); both go on when `resume` is set. A body cut short (the client went away
mid-send) is never acted on (`incomplete_bodies` counts them), and a client gone before its answer is not an
error. `uploaded` holds the LFS
objects received, `api_commits` counts commits made through the API.

A revision is a branch, a tag, a full 40-hex commit sha, or `refs/heads/X` / `refs/tags/X`; the
client percent-encodes it into one path segment (`refs%2Fpr%2F1`). Errors carry the headers the
client maps to exceptions (`huggingface_hub.utils._http.hf_raise_for_status`) plus a JSON body
`{"error": ...}`: unknown repo -> 404 `X-Error-Code: RepoNotFound` (the client checks exactly
"RepoNotFound"; "RepositoryNotFound" would surface as a plain HfHubHTTPError), unknown revision ->
404 `RevisionNotFound`, missing file or folder -> 404 `EntryNotFound`.

Every request is recorded in `HubServer.requests` (method, path, lower-cased headers), e.g. to
check that a token was sent. A bug in this emulator answers 400 (never 5xx: the client retries 5xx with
backoff for ~20 s) and is recorded in `HubServer.errors`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import mimetypes
import re
import socket
import sys
import threading
import traceback
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatch
from typing import Self
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
LFS_PATTERNS = ("*.parquet", "*.gz", "*.zst", "*.bin", "*.safetensors", "*.arrow", "*.tar", "*.zip")
"""Paths stored with Git LFS whatever their size, as a typical `.gitattributes` says."""
LFS_THRESHOLD = 10 * 2**20
"""Larger files go to LFS too (the Hub rejects plain-git files over 10 MB)."""
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
API_OPERATIONS = {"revision", "tree", "paths-info", "refs", "commits", "preupload", "commit", "branch"}
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS)
"""What the Hub's "initial commit" of a new repository holds (abridged)."""


def git_blob_oid(content: bytes) -> str:
    """The git object id of a blob, as the Hub reports it (`blobId`, `oid`, non-LFS `ETag`)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(content: bytes) -> bytes:
    """The pointer file git stores in place of an LFS file."""
    return (f"version https://git-lfs.github.com/spec/v1\n"
            f"oid sha256:{hashlib.sha256(content).hexdigest()}\nsize {len(content)}\n").encode()


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass(frozen=True)
class Entry:
    """One file in a commit, with the metadata the Hub reports for it."""

    path: str
    content: bytes
    lfs: bool

    @property
    def size(self) -> int:
        return len(self.content)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def oid(self) -> str:
        """Git blob id: of the content, or of the LFS pointer for an LFS file."""
        return git_blob_oid(lfs_pointer(self.content) if self.lfs else self.content)

    def lfs_info(self) -> dict:
        return {"oid": self.sha256, "size": self.size, "pointerSize": len(lfs_pointer(self.content))}


@dataclass(frozen=True)
class Commit:
    sha: str
    parent: str | None
    title: str
    date: datetime
    files: dict[str, Entry] = field(repr=False)


class HubRepo:
    """A repository's history: commits (full snapshots), branches and tags. Thread-safe.

    `commit()` applies changes on top of a branch (default `main`) and moves it; shas are
    deterministic (sha1 of the tree, parent, title and date), so the same history gives the same
    shas in every run. Files matching `lfs_patterns` or larger than `lfs_threshold` are LFS files.
    """

    def __init__(self, repo_id: str, files: dict[str, bytes | str] | None = None, *, repo_type: str = "dataset",
                 lfs_patterns: tuple[str, ...] = LFS_PATTERNS, lfs_threshold: int = LFS_THRESHOLD,
                 private: bool = False):
        assert repo_type in REPO_TYPES.values(), repo_type
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.lfs_patterns = lfs_patterns
        self.lfs_threshold = lfs_threshold
        self.private = private
        self.commits: dict[str, Commit] = {}
        self.branches: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        self._lock = threading.RLock()
        if files is not None:
            self.commit(files, message="Initial commit")

    def __repr__(self) -> str:
        return f"HubRepo({self.repo_type}:{self.repo_id}, branches={self.branches}, tags={self.tags})"

    # -- writing -----------------------------------------------------------------------------

    def commit(self, files: dict[str, bytes | str | None] | None = None, *, branch: str = "main",
               message: str | None = None, replace: bool = False) -> str:
        """Add a commit on `branch` (created if new) and return its sha.

        `files` maps paths to new contents (str is UTF-8 encoded); None deletes a path. With
        `replace=True` the commit holds exactly `files`, otherwise the branch's files are kept.
        """
        changes: dict[str, Entry | None] = {}
        for path, content in (files or {}).items():
            path = path.strip("/")
            data = None if content is None else content.encode() if isinstance(content, str) else bytes(content)
            changes[path] = None if data is None else Entry(path, data, self._is_lfs(path, data))
        return self.apply(changes, branch=branch, message=message or f"Update {len(files or {})} file(s)",
                          replace=replace)

    def apply(self, changes: dict[str, Entry | None], *, branch: str = "main", message: str,
              replace: bool = False) -> str:
        """Add a commit of exactly these entries on `branch` and return its sha: an Entry adds or
        replaces its path (LFS or not as the entry says), None deletes a path, and a path ending
        in '/' with None deletes that folder."""
        with self._lock:
            parent = self.branches.get(branch)
            tree = {} if replace or parent is None else dict(self.commits[parent].files)
            for path, entry in changes.items():
                if entry is not None:
                    tree[path] = entry
                elif path.endswith("/"):
                    for below in [p for p in tree if p.startswith(path)]:
                        del tree[below]
                else:
                    tree.pop(path, None)
            title = message
            date = EPOCH + timedelta(minutes=len(self.commits))
            listing = "".join(f"{e.oid} {p}\n" for p, e in sorted(tree.items()))
            sha = hashlib.sha1(f"{listing}parent {parent}\n{title}\n{_iso(date)}\n".encode()).hexdigest()
            self.commits[sha] = Commit(sha, parent, title, date, dict(sorted(tree.items())))
            self.branches[branch] = sha
            return sha

    def tag(self, name: str, revision: str = "main") -> str:
        with self._lock:
            sha = self._must_resolve(revision)
            self.tags[name] = sha
            return sha

    def create_branch(self, name: str, revision: str = "main") -> str:
        with self._lock:
            sha = self._must_resolve(revision)
            self.branches[name] = sha
            return sha

    def _is_lfs(self, path: str, content: bytes) -> bool:
        return len(content) > self.lfs_threshold or any(fnmatch(path, p) for p in self.lfs_patterns)

    def upload_mode(self, path: str, size: int, sample: bytes) -> str:
        """How the Hub stores an uploaded file: `lfs` for a pattern, a large file or a binary
        sample (a NUL byte in its first 512 bytes), else `regular` (empty files are regular)."""
        if size == 0:
            return "regular"
        binary = b"\0" in sample
        return "lfs" if size > self.lfs_threshold or binary or any(fnmatch(path, p) for p in self.lfs_patterns) \
            else "regular"

    def _must_resolve(self, revision: str) -> str:
        sha = self.resolve(revision)
        if sha is None:
            raise KeyError(f"{self.repo_id}: no revision {revision!r}")
        return sha

    # -- reading -----------------------------------------------------------------------------

    @property
    def head(self) -> str:
        return self.branches["main"]

    def resolve(self, revision: str) -> str | None:
        """The commit sha of a branch, tag, full sha or `refs/heads|tags/X` ref; None if unknown."""
        with self._lock:
            for prefix, refs in (("refs/heads/", self.branches), ("refs/tags/", self.tags)):
                if revision.startswith(prefix):
                    return refs.get(revision[len(prefix):])
            if revision in self.branches:
                return self.branches[revision]
            if revision in self.tags:
                return self.tags[revision]
            if SHA_RE.match(revision) and revision in self.commits:
                return revision
            return None

    def files(self, revision: str = "main") -> dict[str, bytes]:
        with self._lock:
            return {p: e.content for p, e in self.commits[self._must_resolve(revision)].files.items()}

    def history(self, sha: str) -> list[Commit]:
        """Commits from `sha` back to the first one."""
        with self._lock:
            out = []
            while sha is not None:
                out.append(self.commits[sha])
                sha = self.commits[sha].parent
            return out

    def folders(self, sha: str) -> set[str]:
        """Every folder of the commit's tree ('a', 'a/b' for 'a/b/c.txt'), not the root."""
        with self._lock:
            return {f for path in self.commits[sha].files for f in _folders_of(path)}

    def changed_paths(self, sha: str) -> list[str]:
        """The paths a commit added, changed or deleted, relative to its parent."""
        with self._lock:
            commit = self.commits[sha]
            before = self.commits[commit.parent].files if commit.parent else {}
            after = commit.files
            return sorted(p for p in set(before) | set(after)
                          if (before[p].oid if p in before else None) != (after[p].oid if p in after else None))

    def tree_oid(self, sha: str, folder: str) -> str:
        below = [(p, e.oid) for p, e in self.commits[sha].files.items() if p.startswith(folder + "/")]
        return hashlib.sha1(repr(sorted(below)).encode()).hexdigest()

    def last_commit(self, sha: str, path: str, is_folder: bool) -> Commit:
        """The newest commit at or before `sha` that changed `path` (a file or a folder)."""
        def version(c: Commit):
            if is_folder:
                return self.tree_oid(c.sha, path) if path in self.folders(c.sha) else None
            entry = c.files.get(path)
            return entry.oid if entry else None

        chain = self.history(sha)
        current = version(chain[0])
        last = chain[0]
        for c in chain[1:]:
            if version(c) != current:
                break
            last = c
        return last


def _folders_of(path: str):
    """'a/b/c.txt' -> 'a', 'a/b'."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    """As sent: percent-encoded, with the query string."""
    headers: dict[str, str]
    """Names lower-cased (HTTP header names are case-insensitive; the client sends `authorization`)."""


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class HubServer:
    """The emulated Hub: `with HubServer([repo]) as hub: hub.url`. Repos can be added while it runs."""

    def __init__(self, repos=(), *, page_size: int | None = None, lfs_redirect: bool = True,
                 write_tokens: Collection[str] | None = None, fail_commits_after: int | None = None,
                 pause_puts_after: int | None = None, hold_commits_after: int | None = None):
        """`repos`: HubRepo objects, or a mapping of dataset repo id -> HubRepo or {path: bytes}.
        `write_tokens`: the tokens that may write (None: any bearer token); `fail_commits_after`: the
        number of API commits after which every commit gets a 503 (None: never)."""
        self.repos: dict[tuple[str, str], HubRepo] = {}
        if isinstance(repos, dict):
            repos = [r if isinstance(r, HubRepo) else HubRepo(repo_id, r) for repo_id, r in repos.items()]
        for repo in repos:
            self.add(repo)
        self.page_size = page_size
        """Entries per tree/commits page; None = the Hub's (1000, or 50 with expand)."""
        self.lfs_redirect = lfs_redirect
        self.write_tokens = set(write_tokens) if write_tokens is not None else None
        self.fail_commits_after = fail_commits_after
        self.api_commits = 0
        """Commits made through the commit API."""
        self.pause_puts_after = pause_puts_after
        """Bytes of the first LFS upload (PUT) after which reading it stops until `resume` (None: never)."""
        self.hold_commits_after = hold_commits_after
        """API commits after which the next commit, fully received, waits for `resume` before it is applied."""
        self.put_paused = threading.Event()
        self.commit_held = threading.Event()
        self.resume = threading.Event()
        self.incomplete_bodies = 0
        """Requests whose body ended early (the client went away mid-send): recorded, never acted on."""
        self.uploaded: dict[str, bytes] = {}
        """LFS objects received (sha256 -> content), committed or not."""
        self._signatures: dict[str, str] = {}
        """Signed upload URLs handed out: signature -> the sha256 it may upload."""
        self._write_lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.errors: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def add(self, repo: HubRepo) -> HubRepo:
        self.repos[(repo.repo_type, repo.repo_id)] = repo
        return repo

    def create_repo(self, repo_id: str, repo_type: str = "model", private: bool = False) -> HubRepo:
        """A new repository as the Hub makes one: `main` with an "initial commit" of `.gitattributes`."""
        repo = HubRepo(repo_id, repo_type=repo_type, private=private)
        repo.commit({".gitattributes": GITATTRIBUTES}, message="initial commit")
        return self.add(repo)

    def lfs_object(self, sha256: str) -> bytes | None:
        if sha256 in self.uploaded:
            return self.uploaded[sha256]
        for repo in list(self.repos.values()):
            for c in list(repo.commits.values()):
                for e in c.files.values():
                    if e.lfs and e.sha256 == sha256:
                        return e.content
        return None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        handler = type("BoundHubHandler", (_Handler,), {"hub": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.resume.set()  # a held request goes on (its client is gone or done)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def requests_to(self, fragment: str) -> list[RecordedRequest]:
        return [r for r in self.requests if fragment in r.path]


@contextlib.contextmanager
def serve_hub(*repos, **options):
    """Run a `HubServer` in a daemon thread; yields it (`.url` is the HF_ENDPOINT).

    `serve_hub(repo_a, repo_b)` or `serve_hub({"user/name": {"a.txt": b"..."}})`.
    """
    if len(repos) == 1 and isinstance(repos[0], dict):
        repos = repos[0]
    with HubServer(repos, **options) as hub:
        yield hub


def use_hub(monkeypatch, url: str, token: str | None = None) -> None:
    """Point an already-imported `huggingface_hub` (1.x) at `url`, online, for one test.

    `huggingface_hub.constants` reads HF_ENDPOINT, HF_HUB_OFFLINE and HF_HUB_DISABLE_XET when it is
    first imported, so setting the environment variables inside a test is not enough once anything
    imported it:
      * HfApi() and HfFileSystem() take `constants.ENDPOINT`;
      * `hf_hub_url` (used to read every file, also by HfFileSystem) formats
        `constants.HUGGINGFACE_CO_URL_TEMPLATE`, then swaps the endpoint prefix only if the URL
        starts with `constants.ENDPOINT` -- patching `constants.ENDPOINT` alone sends repo_info to
        the local server but file reads to the public hub;
      * the shared httpx client checks `constants.HF_HUB_OFFLINE` on every request (no session to
        rebuild, unlike 0.x's per-thread requests sessions);
      * with `hf_xet` installed, every upload goes through Xet storage (a CAS service this emulator
        does not speak): `constants.HF_HUB_DISABLE_XET` makes the client use the LFS batch API;
        downloads would use Xet only if a HEAD /resolve answered `X-Xet-Hash`, which this one never does;
      * fsspec caches HfFileSystem instances per thread and each keeps the endpoint it was made
        with (and a dircache): clear the instance cache so `hf://` uses this endpoint.
    Call `release_hub()` after the test (the fixture in test_download_hf.py does).
    """
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    # No token from the developer's machine: only HF_TOKEN, if the test sets it.
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", "/nonexistent/hf-token")
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", "/nonexistent/hf-stored-tokens")
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    if token is None:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    else:
        monkeypatch.setenv("HF_TOKEN", token)
    release_hub()


def release_hub() -> None:
    """Forget cached HfFileSystem instances (call after monkeypatch undoes)."""
    from huggingface_hub import HfFileSystem

    HfFileSystem.clear_instance_cache()


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client killed mid-request: expected here
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub; every response has a Content-Length
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms delayed-ACK stalls

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        if self.hub.pause_puts_after is not None:  # a small window: a paused PUT's bytes stay with its sender
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)

    # -- plumbing ----------------------------------------------------------------------------

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        self.hub.requests.append(RecordedRequest(method, self.path, {k.lower(): v for k, v in self.headers.items()}))
        try:
            self.body, complete = self._read_body()
            if not complete:  # the client went away mid-send: nothing to act on, no one to answer
                with self.hub._write_lock:
                    self.hub.incomplete_bodies += 1
                self.close_connection = True
                return
            try:
                self._route(method)
            except HubError as e:
                self._json({"error": e.message}, status=e.status,
                           headers={"X-Error-Code": e.code, "X-Error-Message": e.message} if e.code
                           else {"X-Error-Message": e.message})
        except ConnectionError:  # the client went away before its answer (killed): not an error here
            self.close_connection = True
        except Exception:  # noqa: BLE001 - recorded, and answered so the client fails fast
            self.hub.errors.append(f"{method} {self.path}\n{traceback.format_exc()}")
            self._json({"error": "hub emulator bug, see HubServer.errors"}, status=400)

    def _read_body(self) -> tuple[bytes, bool]:
        """The body, and whether all of it came (a client killed mid-send leaves it short)."""
        self._body_bytes = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                line = self.rfile.readline()
                if not line:
                    return b"".join(parts), False
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                parts.append(self._read_exactly(size))
                if len(parts[-1]) < size:
                    return b"".join(parts), False
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts), True
        length = int(self.headers.get("Content-Length") or 0)
        body = self._read_exactly(length)
        return body, len(body) == length

    def _read_exactly(self, size: int) -> bytes:
        """Up to `size` bytes (fewer at the end of the stream), in pieces; the first LFS upload to pass
        `pause_puts_after` bytes pauses there until `resume`."""
        pieces, got = [], 0
        while got < size:
            piece = self.rfile.read(min(size - got, 256 * 1024))
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
            self._body_bytes += len(piece)
            hub = self.hub
            if (self.command == "PUT" and hub.pause_puts_after is not None and self._body_bytes >= hub.pause_puts_after
                    and not hub.put_paused.is_set()):
                hub.put_paused.set()
                hub.resume.wait()
        return b"".join(pieces)

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(status)
        self.send_header("X-Request-Id", f"Root=emulator-{len(self.hub.requests)}")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, data, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(data).encode(),
                   {"Content-Type": "application/json; charset=utf-8", **(headers or {})},
                   head=self.command == "HEAD")

    def _base(self) -> str:
        return f"http://{self.headers.get('Host') or f'127.0.0.1:{self.server.server_address[1]}'}"

    def _cdn_base(self) -> str:
        """This server under the loopback's other name: the CDN is another host, as at the Hub, so the
        client stops at the 302 to read a file's metadata (X-Repo-Commit) and sends the CDN no token."""
        host = (self.headers.get("Host") or "127.0.0.1").rsplit(":", 1)[0]
        return f"http://{'localhost' if host == '127.0.0.1' else '127.0.0.1'}:{self.server.server_address[1]}"

    # -- routing -----------------------------------------------------------------------------

    def _route(self, method: str) -> None:
        split = urlsplit(self.path)
        self.query = parse_qs(split.query, keep_blank_values=True)
        segments = [unquote(s) for s in split.path.split("/")[1:]]
        if segments and segments[-1] == "":
            segments.pop()
        if segments == ["api", "repos", "create"] and method == "POST":
            return self._create_repo()
        if segments == ["api", "validate-yaml"] and method == "POST":
            return self._json({"errors": [], "warnings": []})
        if len(segments) >= 2 and segments[0] == "api" and segments[1] in REPO_TYPES:
            repo, rest = self._find_repo(REPO_TYPES[segments[1]], segments[2:], API_OPERATIONS)
            return self._api(method, repo, rest)
        if len(segments) == 2 and segments[0] == "lfs-upload" and method == "PUT":
            return self._lfs_put(segments[1])
        git = next((i for i, seg in enumerate(segments) if seg.endswith(".git")), None)
        if git is not None and segments[git + 1:git + 4] == ["info", "lfs", "objects"] and method == "POST":
            return self._lfs_api(segments[:git] + [segments[git][:-len(".git")]], segments[git + 4:])
        if len(segments) == 2 and segments[0] == "cdn-lfs" and method in ("GET", "HEAD"):
            content = self.hub.lfs_object(segments[1])
            if content is None:
                raise HubError(404, None, "Not Found")
            return self._file_response(content, {"ETag": f'"{segments[1]}"'}, method)
        repo_type = "model"
        if segments and segments[0] in REPO_TYPES and segments[0] != "models":
            repo_type, segments = REPO_TYPES[segments[0]], segments[1:]
        if "resolve" in segments[1:3] and method in ("GET", "HEAD"):
            repo, rest = self._find_repo(repo_type, segments, {"resolve"})
            revision, path = _split_revision(rest[1:])
            return self._resolve(method, repo, revision, path)
        raise HubError(404, None, f"Sorry, we can't find the page you are looking for: {split.path}")

    def _find_repo(self, repo_type: str, segments: list[str], operations: set[str]) -> tuple[HubRepo, list[str]]:
        """The repo named by `ns/name` or `name` at the start of `segments`, and the segments after it."""
        repos = self.hub.repos
        if len(segments) >= 2 and (repo_type, "/".join(segments[:2])) in repos:
            return repos[(repo_type, "/".join(segments[:2]))], segments[2:]
        if segments and (repo_type, segments[0]) in repos and (len(segments) == 1 or segments[1] in operations):
            return repos[(repo_type, segments[0])], segments[1:]
        raise HubError(404, "RepoNotFound", "Repository not found")

    def _commit(self, repo: HubRepo, revision: str) -> Commit:
        sha = repo.resolve(revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo.commits[sha]

    def _api(self, method: str, repo: HubRepo, rest: list[str]) -> None:
        op = rest[0] if rest else "revision"
        if op == "revision" and method == "GET" and len(rest) <= 1:
            return self._repo_info(repo, self._commit(repo, "main"))
        if op == "revision" and method == "GET":
            revision, _ = _split_revision(rest[1:], whole=True)
            return self._repo_info(repo, self._commit(repo, revision))
        if op == "tree" and method == "GET" and len(rest) >= 2:
            revision, path = _split_revision(rest[1:])
            return self._tree(repo, self._commit(repo, revision), path)
        if op == "paths-info" and method == "POST" and len(rest) >= 2:
            revision, _ = _split_revision(rest[1:], whole=True)
            return self._paths_info(repo, self._commit(repo, revision))
        if op == "refs" and method == "GET" and len(rest) == 1:
            return self._refs(repo)
        if op == "commits" and method == "GET" and len(rest) >= 2:
            revision, _ = _split_revision(rest[1:], whole=True)
            return self._commits(repo, self._commit(repo, revision))
        if op in ("preupload", "commit", "branch") and method == "POST" and len(rest) >= 2:
            self._require_write()
            revision, _ = _split_revision(rest[1:], whole=True)
            if op == "branch":
                return self._create_branch(repo, revision)
            if _truthy(self.query.get("create_pr", ["0"])[-1]):
                raise HubError(400, None, "pull requests are not emulated")
            return self._preupload(repo, revision) if op == "preupload" else self._commit_api(repo, revision)
        raise HubError(404, None, f"Sorry, we can't find the page you are looking for: {self.path}")

    # -- API endpoints -----------------------------------------------------------------------

    def _repo_info(self, repo: HubRepo, commit: Commit) -> None:
        blobs = _truthy(self.query.get("blobs", ["false"])[-1])
        siblings = []
        for path, e in commit.files.items():
            sibling = {"rfilename": path}
            if blobs:
                sibling.update({"blobId": e.oid, "size": e.size})
                if e.lfs:
                    lfs = e.lfs_info()
                    sibling["lfs"] = {"sha256": lfs["oid"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}
            siblings.append(sibling)
        first = repo.history(commit.sha)[-1]
        self._json({
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
            "sha": commit.sha,
            "lastModified": _iso(commit.date),
            "createdAt": _iso(first.date),
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(e.size for e in commit.files.values()),
        })

    def _entry_json(self, repo: HubRepo, commit: Commit, path: str, expand: bool) -> dict:
        entry = commit.files.get(path)
        if entry is not None:
            out = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
            if entry.lfs:
                out["lfs"] = entry.lfs_info()
        else:
            out = {"type": "directory", "oid": repo.tree_oid(commit.sha, path), "size": 0, "path": path}
        if expand:
            last = repo.last_commit(commit.sha, path, is_folder=entry is None)
            out["lastCommit"] = {"id": last.sha, "title": last.title, "date": _iso(last.date)}
            if entry is not None:
                out["securityFileStatus"] = {"status": "safe", "avScan": {"virusFound": False, "virusNames": None},
                                             "pickleImportScan": None}
        return out

    def _children(self, commit: Commit, folder: str, recursive: bool) -> list[str]:
        """Paths below `folder` ('' = root): folders first then files at each level, like the Hub."""
        prefix = folder + "/" if folder else ""
        files, folders = [], set()
        for path in commit.files:
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):]
            if "/" not in rest:
                files.append(path)
            else:
                parts = rest.split("/")
                depth = len(parts) - 1 if recursive else 1
                for i in range(1, depth + 1):
                    folders.add(prefix + "/".join(parts[:i]))
                if recursive:
                    files.append(path)
        return sorted(folders) + sorted(files)

    def _tree(self, repo: HubRepo, commit: Commit, folder: str) -> None:
        recursive = _truthy(self.query.get("recursive", ["false"])[-1])
        expand = _truthy(self.query.get("expand", ["false"])[-1])
        if folder and folder not in repo.folders(commit.sha):
            raise HubError(404, "EntryNotFound", f"{folder} does not exist on \"{commit.sha}\"")
        paths = self._children(commit, folder, recursive)
        page = self.hub.page_size or (50 if expand else 1000)
        start = int(self.query.get("cursor", ["0"])[-1] or 0)
        chunk = paths[start:start + page]
        headers = {}
        if start + page < len(paths):
            query = {k: v[-1] for k, v in self.query.items()}
            query["cursor"] = str(start + page)
            next_url = f"{self._base()}{urlsplit(self.path).path}?{urlencode(query)}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        self._json([self._entry_json(repo, commit, p, expand) for p in chunk], headers=headers)

    def _paths_info(self, repo: HubRepo, commit: Commit) -> None:
        if self.headers.get("Content-Type", "").startswith("application/json"):
            data = json.loads(self.body or b"{}")
            paths, expand = data.get("paths", []), bool(data.get("expand"))
        else:
            form = parse_qs(self.body.decode(), keep_blank_values=True)
            paths, expand = form.get("paths", []), _truthy(form.get("expand", ["false"])[-1])
        folders = repo.folders(commit.sha)
        out = []
        for path in paths:
            path = path.strip("/")
            if path in commit.files or path in folders:
                out.append(self._entry_json(repo, commit, path, expand))
        self._json(out)

    def _refs(self, repo: HubRepo) -> None:
        def refs(kind, items):
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": s} for n, s in sorted(items.items())]

        data = {"branches": refs("heads", repo.branches), "converts": [], "tags": refs("tags", repo.tags)}
        if _truthy(self.query.get("include_prs", ["0"])[-1]):
            data["pullRequests"] = []
        self._json(data)

    def _commits(self, repo: HubRepo, commit: Commit) -> None:
        chain = repo.history(commit.sha)
        page = self.hub.page_size or 50
        start = int(self.query.get("p", ["0"])[-1] or 0) * page
        headers = {}
        if start + page < len(chain):
            query = {k: v[-1] for k, v in self.query.items()}
            query["p"] = str(start // page + 1)
            headers["Link"] = f'<{self._base()}{urlsplit(self.path).path}?{urlencode(query)}>; rel="next"'
        self._json([{"id": c.sha, "title": c.title, "message": "", "date": _iso(c.date),
                     "authors": [{"user": "emulator", "avatar": ""}]} for c in chain[start:start + page]],
                   headers=headers)

    # -- writes ------------------------------------------------------------------------------

    def _require_write(self) -> None:
        """A write needs a bearer token (one of `write_tokens` when the hub has them)."""
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if not token or (self.hub.write_tokens is not None and token not in self.hub.write_tokens):
            raise HubError(401, None, "Invalid credentials in Authorization header")

    def _repo_url(self, repo_type: str, repo_id: str) -> str:
        return f"{self._base()}/{URL_PREFIXES[repo_type]}{repo_id}"

    def _create_repo(self) -> None:
        self._require_write()
        data = json.loads(self.body or b"{}")
        repo_type = data.get("type") or "model"
        if repo_type not in URL_PREFIXES or not data.get("name"):
            raise HubError(400, None, f"invalid repo type {repo_type!r} or name {data.get('name')!r}")
        repo_id = f"{data['organization']}/{data['name']}" if data.get("organization") else data["name"]
        url = self._repo_url(repo_type, repo_id)
        with self.hub._write_lock:
            if (repo_type, repo_id) in self.hub.repos:
                message = f"You already created this {repo_type} repo"
                return self._json({"error": message, "url": url}, status=409, headers={"X-Error-Message": message})
            self.hub.create_repo(repo_id, repo_type, bool(data.get("private")))
        self._json({"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def _create_branch(self, repo: HubRepo, branch: str) -> None:
        data = json.loads(self.body or b"{}")
        with repo._lock:
            if branch in repo.branches:
                raise HubError(409, None, f"Reference already exists: refs/heads/{branch}")
            start = self._commit(repo, data.get("startingPoint") or "main")
            repo.create_branch(branch, start.sha)
        self._json({})

    def _preupload(self, repo: HubRepo, revision: str) -> None:
        commit = self._commit(repo, revision)
        files = []
        for f in json.loads(self.body)["files"]:
            path = f["path"].strip("/")
            existing = commit.files.get(path)
            info = {"path": f["path"], "uploadMode": repo.upload_mode(path, f["size"], base64.b64decode(f["sample"])),
                    "shouldIgnore": False}
            if existing is not None:
                info["oid"] = existing.sha256 if existing.lfs else existing.oid
            files.append(info)
        self._json({"files": files, "commitOid": commit.sha})

    def _lfs_api(self, repo_segments: list[str], rest: list[str]) -> None:
        repo_type = "model"
        if repo_segments and repo_segments[0] in REPO_TYPES and repo_segments[0] != "models":
            repo_type, repo_segments = REPO_TYPES[repo_segments[0]], repo_segments[1:]
        repo = self.hub.repos.get((repo_type, "/".join(repo_segments)))
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        self._require_write()
        data = json.loads(self.body or b"{}")
        if rest == ["verify"]:
            content = self.hub.uploaded.get(data.get("oid", ""))
            if content is None or len(content) != data.get("size"):
                raise HubError(404, None, f"LFS object {data.get('oid')} was not uploaded")
            return self._json({})
        if rest != ["batch"] or data.get("operation") != "upload":
            raise HubError(400, None, "only LFS uploads are emulated (downloads use /resolve)")
        objects = []
        verify = f"{self._repo_url(repo.repo_type, repo.repo_id)}.git/info/lfs/objects/verify"
        for obj in data["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"]}
            if self.hub.lfs_object(obj["oid"]) is None:
                signature = uuid.uuid4().hex
                self.hub._signatures[signature] = obj["oid"]
                entry["authenticated"] = True
                entry["actions"] = {
                    "upload": {"href": f"{self._base()}/lfs-upload/{obj['oid']}?X-Amz-Signature={signature}"},
                    "verify": {"href": verify, "header": {}}}
            objects.append(entry)
        self._json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _lfs_put(self, oid: str) -> None:
        signature = self.query.get("X-Amz-Signature", [""])[-1]
        if self.hub._signatures.get(signature) != oid:
            raise HubError(403, None, "SignatureDoesNotMatch")
        if hashlib.sha256(self.body).hexdigest() != oid:
            raise HubError(400, None, f"content does not hash to {oid}")
        self.hub.uploaded[oid] = self.body
        self._send(200, b"", {"ETag": f'"{hashlib.md5(self.body).hexdigest()}"'})

    def _commit_api(self, repo: HubRepo, revision: str) -> None:
        lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, None, "a commit starts with its header line")
        header = lines[0]["value"]
        changes: dict[str, Entry | None] = {}
        for item in lines[1:]:
            key, value = item["key"], item["value"]
            path = value["path"].strip("/")
            if key == "file":
                changes[path] = Entry(path, base64.b64decode(value["content"]), lfs=False)
            elif key == "lfsFile":
                content = self.hub.lfs_object(value["oid"])
                if content is None or ("size" in value and len(content) != value["size"]):
                    raise HubError(422, None, f"Your push was rejected because an LFS pointer pointed to a file"
                                              f" that does not exist: {value['oid']} ({path})")
                changes[path] = Entry(path, content, lfs=True)
            elif key == "deletedFile":
                changes[path] = None
            elif key == "deletedFolder":
                changes[path + "/"] = None
            else:
                raise HubError(400, None, f"unknown commit operation {key!r}")
        branch = revision[len("refs/heads/"):] if revision.startswith("refs/heads/") else revision
        hub = self.hub
        if (hub.hold_commits_after is not None and hub.api_commits >= hub.hold_commits_after
                and not hub.commit_held.is_set()):
            hub.commit_held.set()
            hub.resume.wait()
        with repo._lock, self.hub._write_lock:
            if branch not in repo.branches:
                self._commit(repo, revision)  # 404 RevisionNotFound if unknown
                raise HubError(400, None, f"Invalid rev id: {revision} is not a branch")
            if header.get("parentCommit") and header["parentCommit"] != repo.branches[branch]:
                raise HubError(412, None, "A commit has happened since. Please refresh and try again.")
            if self.hub.fail_commits_after is not None and self.hub.api_commits >= self.hub.fail_commits_after:
                raise HubError(503, None, "Service Unavailable (an emulated outage)")
            sha = repo.apply(changes, branch=branch, message=header.get("summary") or "Upload files")
            self.hub.api_commits += 1
        self._json({"success": True, "commitOid": sha, "hookOutput": "", "pullRequestUrl": None,
                    "commitUrl": f"{self._repo_url(repo.repo_type, repo.repo_id)}/commit/{sha}"})

    # -- files -------------------------------------------------------------------------------

    def _resolve(self, method: str, repo: HubRepo, revision: str, path: str) -> None:
        commit = self._commit(repo, revision)
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, "EntryNotFound", "Entry not found")
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{entry.oid}"'}
        if entry.lfs:
            headers.update({"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
            if self.hub.lfs_redirect:
                filename = quote(path.rsplit("/", 1)[-1])
                location = f"{self._cdn_base()}/cdn-lfs/{entry.sha256}?response-content-disposition=" + \
                    quote(f"inline; filename*=UTF-8''{filename}", safe="")
                body = f"Found. Redirecting to {location}".encode()
                return self._send(302, body, {**headers, "Location": location,
                                              "Content-Type": "text/plain; charset=utf-8"}, head=method == "HEAD")
        self._file_response(entry.content, headers, method, filename=path.rsplit("/", 1)[-1])

    def _file_response(self, content: bytes, headers: dict, method: str, filename: str | None = None) -> None:
        size = len(content)
        headers = {**headers, "Accept-Ranges": "bytes",
                   "Content-Type": (mimetypes.guess_type(filename or "")[0] if filename else None)
                   or "application/octet-stream"}
        if filename:
            headers["Content-Disposition"] = f"inline; filename*=UTF-8''{quote(filename)}; filename=\"{filename}\";"
        wanted = self.headers.get("Range")
        if not wanted:
            return self._send(200, content, headers, head=method == "HEAD")
        match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", wanted)
        if not match or match.groups() == ("", ""):
            return self._send(200, content, headers, head=method == "HEAD")  # unsupported: ignore, as allowed
        first, last = match.groups()
        if first == "":  # suffix: the last N bytes
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), min(int(last), size - 1) if last else size - 1
        if start >= size or start > end:
            return self._send(416, b"", {**headers, "Content-Range": f"bytes */{size}"}, head=method == "HEAD")
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self._send(206, content[start:end + 1], headers, head=method == "HEAD")


def _split_revision(segments: list[str], whole: bool = False) -> tuple[str, str]:
    """(revision, path) from decoded segments after `resolve`/`tree`/...: the client sends the
    revision as one percent-encoded segment; an unencoded `refs/pr/N`, `refs/convert/X`,
    `refs/heads/X` or `refs/tags/X` spans three."""
    if len(segments) >= 3 and segments[0] == "refs" and segments[1] in ("pr", "convert", "heads", "tags"):
        revision, rest = "/".join(segments[:3]), segments[3:]
    else:
        revision, rest = segments[0], segments[1:]
    if whole and rest:
        revision, rest = "/".join([revision, *rest]), []
    return revision, "/".join(rest)


def _truthy(value: str) -> bool:
    return value.lower() in ("1", "true", "yes")
