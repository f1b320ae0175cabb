"""The one place that touches Levanter's cache and tokenizer API (`marin-levanter==0.2.227.dev40316220070`, JAX 0.11.2).

`pipeline/tokens/cache_writer.py` builds Levanter caches without Levanter's own builder (`build_cache` runs a
zephyr pipeline — a coordinator actor, workers asking 32 GiB each, chunks in a temp bucket — and
`consolidate_shard_cache_ledgers` another just to read sub-caches' ledgers). It writes arrays through `TreeStore`
and commits ledgers itself (`commit_ledger`: whole, atomically — a committed ledger is what makes a cache
resumable). A fanned-out split is one sub-cache per file under the split's folder, tied together by a
`layout="sharded"` ledger (`sharded_ledger`) that `TreeCache` reads in place: nothing is copied.

Every Levanter name used here is public: `TextLmDatasetFormat` / `ChatLmDatasetFormat` (`levanter.data.text.formats`)
and `PreferenceChatLmDatasetFormat` (`levanter.data.text.preference`) build the processors whose exemplar and
metadata training compares, `load_tokenizer` the tokenizer they take, `CacheLedger` / `CacheMetadata` /
`TreeCache` the ledger and its reading, `TreeStore` and `PreparedBatch` the arrays (`TreeStore.trim_to_size`
drops rows written after the last commit). No private Levanter name is called. New text caches' arrays are
created here first (`create_arrays`: Levanter's `JaggedArrayStore` layout, codec and inner chunks —
`DEFAULT_BLOSC_CODEC`, `DEFAULT_CHUNK_SIZE`, `build_kvstore_spec` — with smaller shard files), which Levanter
then opens with their stored metadata.
`cache_writer.py`, `chat.py`, `encoders.py`, `preference.py` and `pretokenized.py` reach Levanter through this
module only.
Levanter (and with it jax) is imported inside functions: importing this module stays cheap.

Where the arrays may go, and the S3 settings Levanter's tensorstore specs need, is `array_store.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import fsspec

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path

if TYPE_CHECKING:
    from levanter.store.cache import CacheLedger, CacheMetadata, TreeCache
    from levanter.store.tree_store import TreeStore

LEDGER_FILE = "shard_ledger.json"
"""A cache's ledger (Levanter's `LEDGER_FILE_NAME`): its committed rows, shards and field counts."""

LEVANTER_VERSION = "0.2.227.dev40316220070"
"""The `marin-levanter` version whose cache API this module was written against (pyproject.toml pins it)."""
JAX_VERSION = "0.11.2"
"""The JAX version whose tensorstore spec builder Levanter's arrays are written through (pyproject.toml pins it)."""
# --- public Levanter ---------------------------------------------------------------------------

def levanter_tokenizer(tokenizer_path: str) -> Any:
    """Levanter's tokenizer for a tokenizer folder (`load_tokenizer`, cached per path): what its processors take,
    named by `tokenizer_path` in their metadata as when training loads the same folder."""
    from levanter.tokenizers import load_tokenizer

    return load_tokenizer(tokenizer_path)


def batch_tokenizer(tokenizer_path: str, text_field: str) -> Any:
    """Levanter's text processor (`BatchTokenizer`, BOS and EOS enforced), built as training builds it for a
    text component: `TextLmDatasetFormat.build_preprocessor`."""
    from levanter.data.text.formats import TextLmDatasetFormat

    return TextLmDatasetFormat(text_key=text_field).build_preprocessor(levanter_tokenizer(tokenizer_path),
                                                                       enforce_bos=True, enforce_eos=True)


def chat_processor(tokenizer_path: str, chat_template: str, messages_field: str) -> Any:
    """Levanter's `ChatProcessor` for a template (loss on the `{% generation %}` tokens), built as training builds
    it for a chat component: `ChatLmDatasetFormat.build_preprocessor`."""
    from levanter.data.text.formats import ChatLmDatasetFormat

    return ChatLmDatasetFormat(messages_field=messages_field, chat_template=chat_template,
                               mask_user_turns=True).build_preprocessor(levanter_tokenizer(tokenizer_path))


def cache_metadata(processor: Any) -> CacheMetadata:
    """The metadata a ledger records for caches built by `processor`."""
    from levanter.store.cache import CacheMetadata

    return CacheMetadata(preprocessor_metadata=processor.metadata)


def new_ledger(rows: int, shard_rows: dict[str, int], finished_shards: list[str], is_finished: bool,
               metadata: CacheMetadata, field_counts: Mapping[str, int] | None = None) -> CacheLedger:
    """A ledger of one cache whose arrays lie in its own folder (not yet committed). `field_counts`: each field's
    data size (as Levanter's writers record them), and counts Levanter keeps beside them: `cache_writer` keeps
    each file's dropped empty documents there."""
    from levanter.store.cache import CacheLedger

    return CacheLedger(total_num_rows=rows, shard_rows=dict(shard_rows), is_finished=is_finished,
                       finished_shards=list(finished_shards), field_counts=dict(field_counts or {}),
                       metadata=metadata)


def sharded_ledger(cache_dir: str, exemplar: dict, parts: Sequence[tuple[str, int, Mapping[str, int]]],
                   metadata: CacheMetadata) -> CacheLedger:
    """The finished ledger of a cache made of sub-caches in its own folder (`layout="sharded"`), read in place:
    `parts` are (folder relative to `cache_dir`, rows, field counts), in order; the field counts must hold each
    field's data size (`TreeCache` locates tokens by them). Checked as `TreeCache` checks it when it loads."""
    from levanter.store.cache import CACHE_LAYOUT_SHARDED, CacheLedger, TreeCache

    by_shard = {name: dict(counts) for name, _, counts in parts}
    totals: dict[str, int] = {}
    for counts in by_shard.values():
        for field, n in counts.items():
            totals[field] = totals.get(field, 0) + n
    ledger = CacheLedger(total_num_rows=sum(rows for _, rows, _ in parts),
                         shard_rows={name: rows for name, rows, _ in parts}, is_finished=True,
                         finished_shards=[name for name, _, _ in parts], field_counts=totals,
                         field_counts_by_shard=by_shard, layout=CACHE_LAYOUT_SHARDED, metadata=metadata)
    TreeCache.load_from_ledger(cache_dir, exemplar, ledger)  # validates the sharded ledger, reads no array
    return ledger


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


def commit_ledger(cache_dir: str, ledger: CacheLedger) -> None:
    """Write `ledger` as `{cache_dir}/shard_ledger.json` whole (a local temp file renamed into place, one
    object on a store), keeping the previous ledger as `.bak` as Levanter does. Levanter's own commit
    (`_serialize_and_commit`) writes the file in place: a process killed meanwhile leaves a torn ledger."""
    fs, path = fsspec.core.url_to_fs(join_path(cache_dir, LEDGER_FILE))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if fs.exists(path):
        fs.copy(path, f"{path}.bak")
    atomic_write(join_path(cache_dir, LEDGER_FILE), ledger.to_json().encode())


def open_store(exemplar: dict, cache_dir: str, mode: str, shard_elements: int | None = None,
               sole_writer: bool = False) -> TreeStore:
    """The arrays of a cache kept in its own folder. With `shard_elements`, arrays not yet on disk are first created
    with shard files of that many elements (`create_arrays`); arrays that exist keep the layout they were made with.

    `sole_writer`: the caller holds the cache's lease and is the only one writing it, so the arrays keep their row
    count and size in memory (Levanter's `cache_metadata`, updated by each extend and trim) instead of reading them
    back from storage before every append (a synchronous read of a just-written chunk: 0.5 s of a 0.6 s tokenize
    of 10 MB). Otherwise uncached: another writer's appends would leave cached sizes stale."""
    from levanter.store.tree_store import TreeStore

    if shard_elements is not None and mode != "r":
        create_arrays(exemplar, cache_dir, shard_elements)
    return TreeStore.open(exemplar, cache_dir, mode=mode, cache_metadata=sole_writer and mode != "r")


def create_arrays(exemplar: dict, cache_dir: str, shard_elements: int) -> None:
    """Create a cache's arrays — each field's `offsets` and `data`, as Levanter's `JaggedArrayStore` lays them
    out — with shard files of `shard_elements` elements instead of Levanter's 2^27, in Levanter's codec (blosc
    zstd level 1) and inner chunks (`DEFAULT_CHUNK_SIZE`); arrays that already exist are left as they are.

    Why: tensorstore rewrites a sharded zarr3 array's whole current shard file on every append and holds it in
    memory meanwhile, so with 2^27-element shards the cost and memory of each append grow with the cache up to
    512 MB of ids. Levanter opens an existing store with its stored metadata (`TreeStore.open`, `TreeCache`),
    so it reads these arrays as its own. Only flat exemplars of rank-1 fields (text caches) are laid out here;
    any other exemplar is left to Levanter."""
    import numpy as np
    import tensorstore as ts
    from levanter.store.jagged_array import DEFAULT_BLOSC_CODEC, DEFAULT_CHUNK_SIZE
    from levanter.tensorstore_serialization import build_kvstore_spec

    items = {field: np.asarray(item) for field, item in exemplar.items()}  # (as `TreeStore` takes them)
    if not all(item.ndim == 1 for item in items.values()):
        return
    chunk = min(DEFAULT_CHUNK_SIZE, shard_elements)
    for field, item in items.items():
        for name, dtype in (("offsets", np.dtype(np.int64)), ("data", item.dtype)):
            path = join_path(cache_dir, field, name)
            spec = {"driver": "zarr3", "kvstore": build_kvstore_spec(path), "metadata": {
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shard_elements]}},
                "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [chunk], "codecs": [
                    {"name": "blosc", "configuration": {"cname": DEFAULT_BLOSC_CODEC.compressor,
                                                        "clevel": DEFAULT_BLOSC_CODEC.compression_level}}]}}]}}
            try:
                ts.open(spec, dtype=dtype.name, shape=[2**54], create=True).result()
            except ValueError as e:
                if "ALREADY_EXISTS" not in str(e):
                    raise


def shard_elements(store: TreeStore, field: str) -> int:
    """Elements per shard file of a field's data array (what one append rewrites whole)."""
    return int(store.tree[field].data.chunk_layout.write_chunk.shape[0])


def load_cache(cache_dir: str, exemplar: dict) -> TreeCache:
    """A finished cache as training reads it (`TreeCache.load`), whatever its layout: `flat_field_length(field)`,
    `jagged_array_tree()`, `get_batch_sync(rows)`."""
    from levanter.store.cache import TreeCache

    return TreeCache.load(cache_dir, exemplar)


def prepared_batch() -> type:
    """Levanter's `PreparedBatch` (`data`, row `offsets`, `shapes`): rows appended to a store as one flat array,
    with no Python object per row or token."""
    from levanter.store.jagged_array import PreparedBatch

    return PreparedBatch


def data_sizes(store: TreeStore) -> dict[str, int]:
    """Each field's data size (elements over all rows): the field counts Levanter's writers record."""
    return {field: int(array.data_size) for field, array in store.tree.items()}


def drop_rows_after(store: TreeStore, rows: int) -> None:
    """Keep exactly the first `rows` rows (those a ledger committed): rows written after a commit by a process
    that then died are cut off, and the next appends follow the committed ones (`TreeStore.trim_to_size`)."""
    if len(store) > rows:
        store.trim_to_size(rows)


def preference_processor(tokenizer_path: str, chat_template: str) -> Any:
    """Levanter's `PreferenceChatProcessor` for a template (a `ChatProcessor` per side), built as `train_dpo`
    builds it for a preference component: `PreferenceChatLmDatasetFormat.build_preprocessor`."""
    from levanter.data.text.preference import PreferenceChatLmDatasetFormat

    return PreferenceChatLmDatasetFormat(chat_template=chat_template).build_preprocessor(
        levanter_tokenizer(tokenizer_path))
