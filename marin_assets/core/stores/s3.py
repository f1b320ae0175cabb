"""Status objects on S3 and S3-compatible stores: compare-and-swap by conditional requests.

A write creates the object with `If-None-Match: *` or replaces it with `If-Match: <the ETag we read>`,
a delete names the ETag it removes, and S3 refuses either (412) if another landed first. Exact across
machines. The generation is the ETag; it is never reused, since every status object holds a fresh
token and heartbeat.

A store that ignored the headers would let racing writers all win unseen, so each endpoint and bucket
is probed before its first write (and first delete) and refused (`ConditionalWritesUnsupportedError`)
if it does not honour them. Credentials and endpoint come from the standard AWS chain
(`AWS_ACCESS_KEY_ID`…, profiles, instance roles; `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` for an
S3-compatible store).
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
from typing import Any

from marin_assets.core.status import STATUS_FILE, StatusRecord
from marin_assets.core.stores.base import Generation


class ConditionalWritesUnsupportedError(RuntimeError):
    """An S3-compatible store ignored `If-None-Match` / `If-Match`: exactly-once cannot be kept there."""


class S3StatusStore:
    """`s3://bucket/prefix/name_hash/.status.json`, swapped by its ETag."""

    def __init__(self, output_path: str):
        self.location = output_path
        bucket, _, key = output_path.split("://", 1)[1].partition("/")
        self.bucket = bucket
        self.prefix = key.strip("/")
        self.name = f"{self.prefix}/{STATUS_FILE}" if self.prefix else STATUS_FILE

    def read(self) -> tuple[StatusRecord | None, Generation | None]:
        client = _s3_client(_s3_endpoint())
        try:
            response = client.get_object(Bucket=self.bucket, Key=self.name)
        except client.exceptions.NoSuchKey:
            return None, None
        return StatusRecord.from_bytes(response["Body"].read()), response["ETag"]

    def write_if(self, expected: Generation | None, new: StatusRecord) -> Generation | None:
        from botocore.exceptions import ClientError

        client = self._checked_client(deletes=False)
        payload = new.to_bytes()
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        for attempt in range(5):
            try:
                response = client.put_object(Bucket=self.bucket, Key=self.name, Body=payload,
                                             ContentType="application/json", **condition)
                written: str = response["ETag"]
                return written
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

    def delete_if(self, expected: Generation) -> bool:
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
        _check_conditional_requests(client, self.bucket, self.prefix, self.location, deletes)
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
