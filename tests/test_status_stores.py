"""Every status-store backend through the same assertions: the compare-and-swap the lease and `gc` rely on.

Local disk, GCS (fake-gcs-server), S3 (moto's server) and the best-effort fallback (fsspec's in-memory
store): create only if absent, replace and delete only from the current generation, a stale generation
refused, and where the store says it is. A new backend joins `BACKENDS` and passes these as they are.

One gap is the emulator's, not ours: the bundled fake-gcs-server ignores `ifGenerationMatch` on DELETE
(fsouza/fake-gcs-server#1282, fixed upstream by #2343 after the binary our wheel ships), so on gs the
stale-delete assertions are expected to fail there (strict: they start passing with a fixed emulator),
and a separate test checks that the request carries the precondition real GCS answers 412 to.
"""

import logging
import time
import uuid

import pytest

from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.stores import (
    BestEffortStatusStore,
    GCSStatusStore,
    LocalStatusStore,
    S3StatusStore,
    status_store,
)


def _local(request) -> str:
    return str(request.getfixturevalue("tmp_path") / "outputs")


BACKENDS = {
    "local": (LocalStatusStore, _local),
    "gs": (GCSStatusStore, lambda request: request.getfixturevalue("gs_prefix")),
    "s3": (S3StatusStore, lambda request: request.getfixturevalue("s3_prefix")),
    "best-effort": (BestEffortStatusStore, lambda request: f"memory://marin-{uuid.uuid4().hex[:8]}"),
}
"""Name → (the store class its URL scheme chooses, a storage prefix on it); emulators start only when asked for."""


@pytest.fixture(params=sorted(BACKENDS))
def output(request):
    """`(store class, output path)`: a fresh output folder on one backend."""
    store_type, prefix_of = BACKENDS[request.param]
    return store_type, f"{prefix_of(request)}/t/numbers_1a2b3c4d"


def needs_delete_preconditions(request, output) -> None:
    """The emulator cannot check this test on gs (module docstring): expect it to fail there."""
    if output[0] is GCSStatusStore:
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError, reason="fake-gcs-server ignores"
                                              " ifGenerationMatch on DELETE (fsouza/fake-gcs-server#1282)"))


def record(holder: str, status: Status = Status.RUNNING) -> StatusRecord:
    return StatusRecord(status, holder=holder, token=uuid.uuid4().hex, heartbeat=time.time())


def test_the_url_scheme_chooses_the_store_and_it_says_where_it_is(output):
    store_type, path = output
    store = status_store(path)
    assert type(store) is store_type
    assert store.location == path
    assert store.read() == (None, None)


def test_a_status_is_created_only_if_absent(output):
    store = status_store(output[1])
    first, second = record("a"), record("b")
    created = store.write_if(None, first)
    assert created is not None
    assert store.write_if(None, second) is None  # it exists now: a second creator loses
    assert store.read() == (first, created)


def test_a_status_is_replaced_only_from_its_current_generation(output):
    store = status_store(output[1])
    first, second, late = record("a"), record("b"), record("c")
    created = store.write_if(None, first)
    replaced = store.write_if(created, second)
    assert replaced is not None and replaced != created
    assert store.read() == (second, replaced)
    assert store.write_if(created, late) is None  # a stale generation is refused
    assert store.read() == (second, replaced)


def test_a_status_is_deleted_only_at_its_current_generation(output, request):
    needs_delete_preconditions(request, output)
    store = status_store(output[1])
    created = store.write_if(None, record("a"))
    replaced = store.write_if(created, record("b", Status.SUCCESS))
    assert store.delete_if(created) is False  # someone wrote since: gc must not delete it
    assert store.read()[1] == replaced
    assert store.delete_if(replaced) is True
    assert store.read() == (None, None)
    assert store.delete_if(replaced) is False  # already gone


def test_after_a_delete_the_name_is_free_and_an_old_generation_deletes_nothing(output, request):
    needs_delete_preconditions(request, output)
    store = status_store(output[1])
    gone = store.write_if(None, record("a"))
    assert store.delete_if(gone)
    fresh = record("b")
    again = store.write_if(None, fresh)  # a waiting materialization starts from scratch
    assert again is not None
    assert store.delete_if(gone) is False
    assert store.read() == (fresh, again)


@pytest.mark.parametrize("path, store_type, location", [
    ("/data/outputs/t/x_1a2b3c4d", LocalStatusStore, "/data/outputs/t/x_1a2b3c4d"),
    ("relative/t/x_1a2b3c4d", LocalStatusStore, "relative/t/x_1a2b3c4d"),
    ("file:///data/t/x_1a2b3c4d", LocalStatusStore, "/data/t/x_1a2b3c4d"),
    ("gs://bucket/p/t/x_1a2b3c4d", GCSStatusStore, "gs://bucket/p/t/x_1a2b3c4d"),
    ("gcs://bucket/t/x_1a2b3c4d", GCSStatusStore, "gcs://bucket/t/x_1a2b3c4d"),
    ("s3://bucket/t/x_1a2b3c4d", S3StatusStore, "s3://bucket/t/x_1a2b3c4d"),
    ("s3a://bucket/t/x_1a2b3c4d", S3StatusStore, "s3a://bucket/t/x_1a2b3c4d"),
    ("memory://t/x_1a2b3c4d", BestEffortStatusStore, "memory://t/x_1a2b3c4d"),
    ("hf://datasets/x/t/x_1a2b3c4d", BestEffortStatusStore, "hf://datasets/x/t/x_1a2b3c4d"),
])
def test_each_scheme_has_one_store(path, store_type, location):
    store = status_store(path)  # nothing is read or written: choosing a store is offline
    assert type(store) is store_type and store.location == location


def test_a_gcs_delete_names_the_generation_it_removes(gs_prefix, caplog):
    store = GCSStatusStore(f"{gs_prefix}/t/numbers_1a2b3c4d")
    generation = store.write_if(None, record("a"))
    with caplog.at_level(logging.DEBUG, logger="urllib3.connectionpool"):  # logs each request line it sends
        assert store.delete_if(generation)
    sent = [r.getMessage() for r in caplog.records if '"DELETE ' in r.getMessage()]
    assert len(sent) == 1 and f"ifGenerationMatch={generation}" in sent[0], sent
