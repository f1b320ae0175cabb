"""Content versions: what an output was made from when a source can change under one identity.

Identity is fixed at definition time, so a download of a branch or a URL keeps its hash
when the data behind it changes. Such a step reports a source version (`Step.source_version`)
which is recorded as its `content_version`; every step made from it records the versions of
its inputs and a digest of them as its own content version. A cached output whose recorded
input versions no longer match its inputs' current ones is out of date and is recomputed in
place. Pure pipelines (no changing source) record nothing here and pay nothing.

"Version" means this one thing across the protocol: what an output's content was made from (a
source version, a content version, input versions, and Dagster's data version built from them).
The status object's compare-and-swap token is its *generation* (`core/stores/base.py`); the
layout of an artifact record is its *format* (`ArtifactRecord.format`).
"""

from __future__ import annotations

import hashlib
import json

from marin_assets.core.record import ArtifactRecord, RecordNotAvailableError, read_record
from marin_assets.core.step import Step


def current_input_versions(step: Step, prefix: str) -> dict[str, str]:
    """`name_with_hash` → content version of each successful dependency that has one."""
    versions: dict[str, str] = {}
    for dep in step.deps:
        try:
            record = read_record(dep.output_path_under(prefix))
        except RecordNotAvailableError:
            continue
        if record.content_version is not None:
            versions[dep.name_with_hash] = record.content_version
    return versions


def content_version(source_version: str | None, input_versions: dict[str, str]) -> str | None:
    """A source's own version, else a digest of the inputs' versions, else None."""
    if source_version is not None:
        return source_version
    if not input_versions:
        return None
    return hashlib.sha256(json.dumps(input_versions, sort_keys=True).encode()).hexdigest()[:16]


def changed_inputs(step: Step, record: ArtifactRecord, prefix: str) -> list[str]:
    """Inputs whose content changed since `record` was made: `dep: old → new` descriptions.

    Reads dependency records only when the record has input versions, so the cache hit of a
    pure step stays one status read and one record read.
    """
    if not record.input_versions:
        return []
    now = current_input_versions(step, prefix)
    return [f"{dep}: {old} → {now.get(dep, 'unavailable')}"
            for dep, old in sorted(record.input_versions.items()) if now.get(dep) != old]


def data_version(step: Step, record: ArtifactRecord) -> str:
    """Dagster's data version: the identity hash, plus the content version when there is one."""
    return step.hash if record.content_version is None else f"{step.hash}-{record.content_version[:12]}"
