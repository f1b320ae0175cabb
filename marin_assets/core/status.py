"""Status and lease of one output, kept in one small object next to it: `.status.json`.

Status (`RUNNING`, `SUCCESS`, `FAILED`) and lease (holder, token, heartbeat) share one object
so that every transition is a single compare-and-swap: a holder can mark `SUCCESS` only if
the object is still the one it last wrote. A holder that lost its lease (someone took over
after its heartbeat went stale) therefore cannot write a second success mark (Marin #8107).

Stores implement `read()` and `write_if(expected_version, new)`: on a local disk with
`fcntl.flock` around compare-and-replace; on GCS with generation preconditions
(`ifGenerationMatch`) and on S3 with conditional writes (`If-None-Match` / `If-Match`), exact
across machines; on other fsspec stores best-effort (write, then read back), documented as such.
"""

from __future__ import annotations

import enum
import fcntl
import functools
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path

STATUS_FILE = ".status.json"
LOCK_FILE = ".status.lock"


class Status(str, enum.Enum):
    """The three states of an output: being computed, complete, or failed."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


@dataclass(frozen=True)
class StatusRecord:
    """The content of `.status.json`."""

    status: Status
    holder: str
    """`host:pid:id` of the process that wrote it."""
    token: str
    """Unique per lease acquisition; the holder's proof of ownership."""
    heartbeat: float
    """Wall-clock time (epoch seconds) of the holder's last renewal."""
    run_id: str | None = None
    error: str | None = None

    def is_live(self, stale_timeout: float, now: float | None = None) -> bool:
        """A RUNNING holder that renewed within `stale_timeout` seconds."""
        now = time.time() if now is None else now
        return self.status is Status.RUNNING and now - self.heartbeat < stale_timeout

    def to_bytes(self) -> bytes:
        data = asdict(self)
        data["status"] = self.status.value
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> StatusRecord:
        data = json.loads(raw)
        data["status"] = Status(data["status"])
        return cls(**data)

    def renewed(self, **changes: Any) -> StatusRecord:
        return replace(self, heartbeat=time.time(), **changes)


def new_holder_id() -> str:
    """A lease holder's name: `host:pid:random`, unique per acquisition attempt."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# An opaque version: the bytes last seen (local), or a generation number (object stores).
Version = Any


class StatusStore(Protocol):
    """Reads and compare-and-swaps the status object of one output (local disk, GCS, S3, best effort)."""

    def read(self) -> tuple[StatusRecord | None, Version]: ...

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        """Replace the status if its version is still `expected` (None: must not exist).

        Returns the new version, or None when the precondition failed.
        """
        ...


class LocalStatusStore:
    """Compare-and-replace under `fcntl.flock`; readers never see a half-written file."""

    def __init__(self, output_path: str):
        self.dir = output_path
        self.path = os.path.join(output_path, STATUS_FILE)
        self.lock_path = os.path.join(output_path, LOCK_FILE)

    def read(self) -> tuple[StatusRecord | None, Version]:
        raw = read_bytes(self.path)
        return (None if raw is None else StatusRecord.from_bytes(raw)), raw

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        os.makedirs(self.dir, exist_ok=True)
        payload = new.to_bytes()
        with open(self.lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if read_bytes(self.path) != expected:
                    return None
                atomic_write(self.path, payload)
                return payload
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class BestEffortStatusStore:
    """For fsspec stores without conditional writes: write, wait, read back.

    Two writers racing within `settle` seconds can both believe they won; the documented
    price of a store with neither generations nor `If-Match`.
    """

    def __init__(self, output_path: str, settle: float = 0.1):
        self.dir = output_path
        self.url = join_path(output_path, STATUS_FILE)
        self.settle = settle

    def read(self) -> tuple[StatusRecord | None, Version]:
        raw = read_bytes(self.url)
        return (None if raw is None else StatusRecord.from_bytes(raw)), raw

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        if self.read()[1] != expected:
            return None
        payload = new.to_bytes()
        atomic_write(self.url, payload)
        time.sleep(self.settle)
        return payload if self.read()[1] == payload else None


class GCSStatusStore:
    """Compare-and-swap by GCS generation preconditions: a write names the generation it
    replaces (0: the object must not exist) and GCS refuses it (412) if another landed first.

    Credentials come from the standard Google chain (application default credentials, the
    metadata server, `GOOGLE_APPLICATION_CREDENTIALS`); `STORAGE_EMULATOR_HOST` points it at an
    emulator. The object is small, so each write is one request that is applied whole or not.
    """

    def __init__(self, output_path: str):
        bucket, _, key = output_path.split("://", 1)[1].partition("/")
        self.bucket = bucket
        self.name = f"{key.strip('/')}/{STATUS_FILE}" if key.strip("/") else STATUS_FILE

    def _blob(self) -> Any:
        return _gcs_client().bucket(self.bucket).blob(self.name)

    def read(self) -> tuple[StatusRecord | None, Version]:
        from google.api_core.exceptions import NotFound

        blob = self._blob()
        try:
            raw = blob.download_as_bytes()
        except NotFound:
            return None, None
        return StatusRecord.from_bytes(raw), blob.generation

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._blob()
        payload = new.to_bytes()
        try:
            blob.upload_from_string(payload, content_type="application/json", if_generation_match=expected or 0)
        except PreconditionFailed:
            # A retried request whose first attempt landed also gets 412: then the object is ours.
            found, generation = self.read()
            return generation if found is not None and found.to_bytes() == payload else None
        return blob.generation


@functools.cache
def _gcs_client() -> Any:
    from google.cloud import storage

    return storage.Client()


class ConditionalWritesUnsupportedError(RuntimeError):
    """An S3-compatible store ignored `If-None-Match` / `If-Match`: exactly-once cannot be kept there."""


class S3StatusStore:
    """Compare-and-swap by S3 conditional writes: a write creates the object with `If-None-Match: *`
    or replaces it with `If-Match: <the ETag we read>`, and S3 refuses it (412) if another landed first.

    Credentials and endpoint come from the standard AWS chain (`AWS_ACCESS_KEY_ID`…, profiles,
    instance roles; `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` for an S3-compatible store). A store
    that ignored the headers would let racing writers all win unseen, so each endpoint and bucket is
    probed before its first write and refused (`ConditionalWritesUnsupportedError`) if it does not
    honour them. An ETag is never reused: every status object holds a fresh token and heartbeat.
    """

    def __init__(self, output_path: str):
        self.dir = output_path
        bucket, _, key = output_path.split("://", 1)[1].partition("/")
        self.bucket = bucket
        self.prefix = key.strip("/")
        self.name = f"{self.prefix}/{STATUS_FILE}" if self.prefix else STATUS_FILE

    def read(self) -> tuple[StatusRecord | None, Version]:
        client = _s3_client(_s3_endpoint())
        try:
            response = client.get_object(Bucket=self.bucket, Key=self.name)
        except client.exceptions.NoSuchKey:
            return None, None
        return StatusRecord.from_bytes(response["Body"].read()), response["ETag"]

    def write_if(self, expected: Version, new: StatusRecord) -> Version | None:
        from botocore.exceptions import ClientError

        client = self._checked_client(deletes=False)
        payload = new.to_bytes()
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        for attempt in range(5):
            try:
                response = client.put_object(Bucket=self.bucket, Key=self.name, Body=payload,
                                             ContentType="application/json", **condition)
                return response["ETag"]
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code")
                if code == "ConditionalRequestConflict" and attempt < 4:  # 409: S3 asks for a retry
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if code not in ("PreconditionFailed", "NoSuchKey", "ConditionalRequestConflict"):
                    raise
                break
        # A retried request whose first attempt landed also gets 412: then the object is ours.
        found, etag = self.read()
        return etag if found is not None and found.to_bytes() == payload else None

    def delete_if(self, expected: Version) -> bool:
        """Remove the status object if its ETag is still `expected` (for `gc`); True if removed."""
        from botocore.exceptions import ClientError

        client = self._checked_client(deletes=True)
        try:
            client.delete_object(Bucket=self.bucket, Key=self.name, IfMatch=expected)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "NoSuchKey"):
                return False
            raise
        return True

    def _checked_client(self, deletes: bool) -> Any:
        client = _s3_client(_s3_endpoint())
        _check_conditional_requests(client, self.bucket, self.prefix, self.dir, deletes)
        return client


def _s3_endpoint() -> str | None:
    """The endpoint set in the environment (None: boto3's own default, e.g. AWS or a config file's)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


@functools.cache
def _s3_client(endpoint_url: str | None) -> Any:
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=endpoint_url)


_CHECKED: set[tuple[str, str, bool]] = set()
_CHECK_LOCK = threading.Lock()
_WRONG_ETAG = '"00000000000000000000000000000000"'


def _check_conditional_requests(client: Any, bucket: str, prefix: str, output_path: str, deletes: bool) -> None:
    """Probe once per endpoint and bucket, with a throwaway object beside the status object, that the
    store refuses a second create (`If-None-Match: *`) and a write or delete naming a wrong ETag."""
    from botocore.exceptions import ClientError

    endpoint = client.meta.endpoint_url
    with _CHECK_LOCK:
        if (endpoint, bucket, deletes) in _CHECKED:
            return
        key = f"{prefix}/" if prefix else ""
        key += f".conditional-write-probe-{uuid.uuid4().hex[:8]}"

        def refused(call: Any, **kwargs: Any) -> bool:
            try:
                call(Bucket=bucket, Key=key, **kwargs)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") == "PreconditionFailed":
                    return True
                raise
            return False

        failed = None
        try:
            etag = client.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")["ETag"]
            if deletes:
                if not refused(client.delete_object, IfMatch=_WRONG_ETAG):
                    failed = "a DeleteObject with If-Match: <a wrong ETag> deleted the object instead of failing (412)"
            elif not refused(client.put_object, Body=b"2", IfNoneMatch="*"):
                failed = "a second PutObject with If-None-Match: * replaced the object instead of failing (412)"
            elif not refused(client.put_object, Body=b"3", IfMatch=_WRONG_ETAG):
                failed = "a PutObject with If-Match: <a wrong ETag> replaced the object instead of failing (412)"
            elif refused(client.put_object, Body=b"4", IfMatch=etag):
                failed = "a PutObject with If-Match: <its current ETag> was refused"
        except ClientError as e:
            error = e.response.get("Error", {})
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") not in (400, 501):
                raise  # access, bucket or credentials: the store's own error says it best
            failed = f"a conditional request was rejected ({error.get('Code')}: {error.get('Message')})"
        finally:
            try:
                client.delete_object(Bucket=bucket, Key=key)
            except ClientError:
                pass
        if failed is not None:
            kind = "conditional deletes" if deletes else "conditional writes"
            raise ConditionalWritesUnsupportedError(
                f"S3 endpoint {endpoint} (bucket {bucket!r}) does not honour {kind}: {failed}; exactly-once"
                f" for {output_path} needs If-None-Match and If-Match{' on DeleteObject' if deletes else ''}"
                " (AWS S3 has them; for an S3-compatible store, use a version that does)")
        _CHECKED.add((endpoint, bucket, deletes))


def status_store(output_path: str) -> StatusStore:
    """The store for an output path: local disk, GCS, S3, or best effort for other URLs."""
    protocol = output_path.split("://", 1)[0] if "://" in output_path else "file"
    if protocol in ("file", "local"):
        return LocalStatusStore(output_path.removeprefix("file://"))
    if protocol in ("gs", "gcs"):
        return GCSStatusStore(output_path)
    if protocol in ("s3", "s3a"):
        return S3StatusStore(output_path)
    return BestEffortStatusStore(output_path)


def read_status(output_path: str) -> StatusRecord | None:
    """The status object of the output at `output_path`, or None if there is none."""
    return status_store(output_path).read()[0]
