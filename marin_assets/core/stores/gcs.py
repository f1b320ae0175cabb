"""Status objects on Google Cloud Storage: compare-and-swap by generation preconditions.

A write names the generation it replaces (`ifGenerationMatch`; 0: the object must not exist) and GCS
refuses it (412) if another landed first; a delete names the generation it removes. Exact across
machines. The object is small, so each write is one request, applied whole or not at all.

Credentials come from the standard Google chain (application default credentials, the metadata
server, `GOOGLE_APPLICATION_CREDENTIALS`); `STORAGE_EMULATOR_HOST` points it at an emulator.
"""

from __future__ import annotations

import functools
from typing import Any

from marin_assets.core.status import STATUS_FILE, StatusRecord
from marin_assets.core.stores.base import Generation


class GCSStatusStore:
    """`gs://bucket/prefix/name_hash/.status.json`, swapped by its object generation."""

    def __init__(self, output_path: str):
        self.location = output_path
        bucket, _, key = output_path.split("://", 1)[1].partition("/")
        self.bucket = bucket
        self.name = f"{key.strip('/')}/{STATUS_FILE}" if key.strip("/") else STATUS_FILE

    def read(self) -> tuple[StatusRecord | None, Generation | None]:
        from google.api_core.exceptions import NotFound

        blob = self._blob()
        try:
            raw = blob.download_as_bytes()
        except NotFound:
            return None, None
        return StatusRecord.from_bytes(raw), blob.generation

    def write_if(self, expected: Generation | None, new: StatusRecord) -> Generation | None:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._blob()
        payload = new.to_bytes()
        try:
            blob.upload_from_string(payload, content_type="application/json", if_generation_match=expected or 0)
        except PreconditionFailed:
            # A retried request whose first attempt landed also gets 412: then the object is ours.
            found, generation = self.read()
            return generation if found is not None and found.to_bytes() == payload else None
        written: int = blob.generation
        return written

    def delete_if(self, expected: Generation) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self._blob().delete(if_generation_match=expected)
        except (PreconditionFailed, NotFound):
            return False
        return True

    def _blob(self) -> Any:
        return gcs_client().bucket(self.bucket).blob(self.name)


@functools.cache
def gcs_client() -> Any:
    """One client per process (it holds the credentials and a connection pool)."""
    from google.cloud import storage

    return storage.Client()
