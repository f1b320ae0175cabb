"""The one place that touches Levanter's cache and tokenizer internals (pinned `levanter==1.2.dev1644`).

`pipeline/tokens/cache_writer.py` builds Levanter caches without Levanter's own Ray cache builder: on a small
cluster that builder's copy tasks ask for 4 CPUs and 6 GiB and wait forever, so we write one
sub-cache per input file, commit its ledger ourselves (`commit_ledger`: whole, atomically — a
committed ledger is what makes a sub-cache resumable), and concatenate the finished sub-caches in
process. Doing that needs these private Levanter names, each behind one function here and each
pinned by a test in `tests/test_private_apis.py` (re-check them all when the pin moves):

- `levanter.store.cache._expose_available_rows` → `expose_rows`: set a store's visible row count
  (offsets[0]); used to drop rows written after the last commit, and to reveal appended rows.
- `levanter.store.cache._extend_cache_with_other_cache` → `copy_cache_data`: append a finished
  cache's token data to another cache at a data offset (the builder's data copy, without Ray).
- `levanter.store.cache._extend_cache_metadata_with_other` → `copy_cache_offsets`: append its
  row offsets, shifted by that data offset (the builder's metadata copy, without Ray).

Everything else here is public Levanter (re-exported so `cache_writer.py` imports Levanter through
this module only). Levanter (and with it jax) is imported inside functions: importing this module
stays cheap.

The fence also keeps one limit of the pinned stack: `refuse_unsupported_array_store`, which every step
writing Levanter arrays calls before it computes anything (s3:// arrays would land in a local folder).
"""

from __future__ import annotations

import asyncio
import types
from typing import TYPE_CHECKING, Any

import fsspec

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path

if TYPE_CHECKING:
    from levanter.data.text import BatchTokenizer
    from levanter.store.cache import CacheLedger, CacheMetadata
    from levanter.store.tree_store import TreeStore

LEDGER_FILE = "shard_ledger.json"
"""A cache's ledger (Levanter's `LEDGER_FILE_NAME`): its committed rows, shards and field counts."""

LEVANTER_VERSION = "1.2.dev1644"
"""The Levanter version whose internals this module was written against (pyproject.toml pins it)."""
JAX_VERSION = "0.7.2"
"""The JAX version whose tensorstore spec builder Levanter's arrays are written through (pyproject.toml pins it)."""
UNSUPPORTED_ARRAY_SCHEMES = ("s3",)
"""URL schemes Levanter arrays cannot be written to under the pinned JAX: its tensorstore spec builder does not
know `s3`, so `s3://bucket/x` becomes the *local* path `s3:/bucket/x` — the arrays land in a folder named `s3:`
in the working directory while the step records SUCCESS. (The Levanter upgrade makes S3 whole.)"""


class UnsupportedArrayStoreError(ValueError):
    """Levanter arrays cannot be written where a step's output is (see `refuse_unsupported_array_store`)."""


def refuse_unsupported_array_store(output_path: str, step_name: str) -> None:
    """Refuse, before anything is computed or written, an output where Levanter arrays would not land.

    Every step that writes Levanter arrays through tensorstore (tokenize, chat tokenize, pretokenized caches,
    and training's checkpoints, in `training/runner.py`) calls this first with its output path and its name.
    Today that refuses `s3://`: see `UNSUPPORTED_ARRAY_SCHEMES`.
    """
    scheme = output_path.split("://", 1)[0].lower() if "://" in output_path else ""
    if scheme in UNSUPPORTED_ARRAY_SCHEMES:
        raise UnsupportedArrayStoreError(
            f"{step_name}: refusing to write Levanter arrays to {output_path}: the {scheme}:// scheme is not"
            f" supported yet — tensorstore under the pinned JAX {JAX_VERSION} writes {scheme}:// arrays to a local"
            f" folder named '{scheme}:' (while the step would report SUCCESS); use a gs:// or local prefix for"
            " this step until the Levanter upgrade")


# --- public Levanter ---------------------------------------------------------------------------

def batch_tokenizer(hf_tokenizer: Any, text_field: str) -> BatchTokenizer:
    """Levanter's tokenizing processor, adding BOS/EOS where the tokenizer itself does not."""
    from levanter.data.text import BatchTokenizer

    return BatchTokenizer(hf_tokenizer, text_field=text_field, enforce_bos=True, enforce_eos=True)


def cache_metadata(processor: BatchTokenizer) -> CacheMetadata:
    """The metadata a ledger records for caches built by `processor`."""
    from levanter.store.cache import CacheMetadata

    return CacheMetadata(preprocessor_metadata=processor.metadata)


def new_ledger(rows: int, shard_rows: dict[str, int], finished_shards: list[str], is_finished: bool,
               metadata: CacheMetadata, field_counts: dict[str, int] | None = None) -> CacheLedger:
    """A ledger (not yet committed); `field_counts` are counts Levanter keeps beside the rows (and adds up
    when it merges ledgers): `cache_writer` keeps each file's dropped empty documents there."""
    from levanter.store.cache import CacheLedger

    return CacheLedger(total_num_rows=rows, shard_rows=dict(shard_rows), is_finished=is_finished,
                       finished_shards=list(finished_shards), field_counts=dict(field_counts or {}),
                       metadata=metadata)


def load_ledger(cache_dir: str) -> CacheLedger | None:
    """The committed ledger of a cache, or None if none was ever committed."""
    from levanter.store.cache import CacheLedger

    try:
        return CacheLedger.load(cache_dir)
    except FileNotFoundError:
        return None
    except ValueError:  # an empty or torn ledger, left by a commit that wrote in place (before `commit_ledger`)
        raw = read_bytes(join_path(cache_dir, f"{LEDGER_FILE}.bak"))
        if raw is None:
            raise
        return CacheLedger.from_json(raw.decode())  # the commit before: rows after it are written again


def open_store(exemplar: dict, cache_dir: str, mode: str) -> TreeStore:
    """The cache's arrays, uncached (we write them, so cached metadata would go stale)."""
    from levanter.store.tree_store import TreeStore

    return TreeStore.open(exemplar, cache_dir, mode=mode, cache_metadata=False)


# --- private Levanter: one function per private name -------------------------------------------

def commit_ledger(cache_dir: str, ledger: CacheLedger) -> None:
    """Write `ledger` as `{cache_dir}/shard_ledger.json` whole (a local temp file renamed into place, one
    object on a store), keeping the previous ledger as `.bak` as Levanter does. Levanter's own commit
    (`_serialize_and_commit`) truncates the file before writing it: a process killed in between left an empty
    ledger, and the cache could never be resumed."""
    fs, path = fsspec.core.url_to_fs(join_path(cache_dir, LEDGER_FILE))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if fs.exists(path):
        fs.copy(path, f"{path}.bak")
    atomic_write(join_path(cache_dir, LEDGER_FILE), ledger.to_json().encode())


def expose_rows(store: TreeStore, rows: int) -> None:
    """Make exactly `rows` rows visible: later appends overwrite what lies beyond (private:
    `_expose_available_rows`)."""
    from levanter.store.cache import _expose_available_rows

    _expose_available_rows(store, rows)


def _copier(exemplar: dict) -> types.SimpleNamespace:
    """What Levanter's copy functions read of their `processor` argument: only `output_exemplar`."""
    return types.SimpleNamespace(output_exemplar=exemplar)


def copy_cache_data(dest_dir: str, part_dir: str, exemplar: dict, offsets: dict[str, int], rows: int) -> int:
    """Copy `part_dir`'s data arrays into `dest_dir` at `offsets` (data sizes per field); returns the
    part's row count. Nothing becomes visible yet (private: `_extend_cache_with_other_cache`)."""
    from levanter.store.cache import _extend_cache_with_other_cache

    return asyncio.run(_extend_cache_with_other_cache(dest_dir, part_dir, _copier(exemplar), offsets, rows))


def copy_cache_offsets(dest_dir: str, part_dir: str, exemplar: dict, offsets: dict[str, int], rows: int) -> int:
    """Copy `part_dir`'s row offsets into `dest_dir` after row `rows`, shifted by `offsets`; returns the
    part's row count. Nothing becomes visible yet (private: `_extend_cache_metadata_with_other`)."""
    from levanter.store.cache import _extend_cache_metadata_with_other

    return asyncio.run(_extend_cache_metadata_with_other(dest_dir, part_dir, _copier(exemplar), offsets, rows))


def append_cache(dest_dir: str, part_dir: str, exemplar: dict, offsets: dict[str, int], rows: int) -> None:
    """Copy a finished cache after the first `rows` rows of `dest_dir` (data, then offsets); the caller
    then exposes the new rows and commits its ledger."""
    copy_cache_data(dest_dir, part_dir, exemplar, offsets, rows)
    copy_cache_offsets(dest_dir, part_dir, exemplar, offsets, rows)
