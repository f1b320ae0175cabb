"""The normalized format every curation stage reads and writes.

A curated dataset is parquet shards `{output}/{split}/part-NNNNN.parquet` with at least the columns
`id` (a 128-bit content hash of the text, 32 hex digits: stable across runs and machines), `text`
and `source` (`file:line` it came from); a stage keeps every other column it does not own.
Everything a stage needs besides its output (per-shard stats, claims, intermediate hash buckets)
lives under `{output}/_work/`, which the tokenize step's split discovery does not read.
Shards are written whole and renamed into place, so a reader never sees a partial one.
A stage whose passes would keep memory growing with the corpus reads and writes on an Arrow pool that hands
freed memory back at once (`returning_memory`) and hands back what malloc keeps between shards
(`hand_back_memory`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from marin_assets.core.files import atomic_write
from marin_assets.core.paths import join_path

WORK_DIR = "_work"
"""Under a stage's output: its bookkeeping, never read as data."""
SHARD_NAME = re.compile(r"^part-(\d{5})\.parquet$")
REQUIRED = ("id", "text", "source")
SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string())])
"""The columns every curated shard has (a stage may add more)."""


class CurationError(ValueError):
    """Bad input or a result a curation stage refuses: the message names the stage, file and row."""


@dataclass(frozen=True)
class Shard:
    """One parquet shard of a normalized dataset."""

    split: str
    index: int
    path: str

    @property
    def key(self) -> str:
        """`train-00003`: names the shard's bookkeeping files."""
        return f"{self.split}-{self.index:05d}"

    def output_under(self, output_path: str) -> str:
        """The same shard's place in another dataset."""
        return shard_path(output_path, self.split, self.index)


def shard_path(output_path: str, split: str, index: int) -> str:
    """Where shard `index` of `split` lives in a curated dataset."""
    return join_path(output_path, split, f"part-{index:05d}.parquet")


def work_path(output_path: str, *parts: str) -> str:
    """A stage's bookkeeping path (under `_work/`, never read as data)."""
    return join_path(output_path, WORK_DIR, *parts)


def document_id(text: str) -> str:
    """The 128-bit content hash (xxh3) of a document's text, as 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def list_shards(stage: str, dataset_path: str) -> list[Shard]:
    """The shards of a normalized dataset, split by split (in name order), then by index."""
    fs, root = fsspec.core.url_to_fs(dataset_path)
    protocol = dataset_path.split("://", 1)[0] + "://" if "://" in dataset_path else ""
    shards = []
    try:
        splits = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root, detail=True)
                        if e["type"] == "directory")
    except FileNotFoundError:
        raise CurationError(f"{stage}: input {dataset_path} does not exist") from None
    for split in splits:
        if split.startswith((".", "_")):
            continue
        for name in sorted(p.rsplit("/", 1)[-1] for p in fs.ls(join_path(root, split), detail=False)):
            if m := SHARD_NAME.match(name):
                shards.append(Shard(split, int(m.group(1)), protocol + join_path(root, split, name)))
    if not shards:
        raise CurationError(f"{stage}: {dataset_path} holds no normalized shards ({{split}}/part-00000.parquet);"
                            " curation stages read the output of a normalize step")
    return shards


@functools.cache
def _returning_pool() -> pa.MemoryPool:
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc (Windows): malloc's own
        return pa.system_memory_pool()
    pa.jemalloc_set_decay_ms(0)
    return pool


@contextlib.contextmanager
def returning_memory() -> Iterator[None]:
    """Arrow allocations in the block come from jemalloc with no decay (freed pages go back to the OS at once;
    malloc's pool where pyarrow has no jemalloc). pyarrow's default pool (mimalloc on most builds) keeps freed
    pages in per-thread heaps: over a stage's shards what it keeps grew with the corpus (fuzzy dedup: +25 MB
    over 3 MB of shards, +58 MB over 30 MB). Buffers remember their pool, so the previous default comes back
    safely at the end."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(_returning_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc (macOS, musl): nothing to call
        return None


def hand_back_memory() -> None:
    """Give the memory malloc holds free back to the OS (glibc's `malloc_trim(0)`; elsewhere nothing). A shard's
    work frees its buffers, but malloc keeps them resident, fragmented between longer-lived objects (and in the
    arenas of the threads that freed them), and what it keeps grows with the shards a process has worked on."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def read_shard(stage: str, path: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A whole shard (or some of its columns); an unreadable file or a missing column names the file."""
    wanted = list(columns) if columns is not None else list(REQUIRED)
    try:
        with fsspec.open(path, "rb") as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            missing = [c for c in wanted if c not in names]
            if missing:
                raise CurationError(f"{stage}: shard {path} has no column {', '.join(map(repr, missing))}"
                                    f" (it has {', '.join(names)})")
            table = parquet.read(columns=list(columns) if columns is not None else None)
    except FileNotFoundError:
        raise CurationError(f"{stage}: shard {path} is missing") from None
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise CurationError(f"{stage}: shard {path} is unreadable: {e}") from None
    text = table.column("text") if "text" in table.column_names else None
    if text is not None and text.null_count:
        row = next(i for i, v in enumerate(text.is_null().to_pylist()) if v)
        raise CurationError(f"{stage}: shard {path} row {row}: text is null")
    return table


def write_shard(table: pa.Table, path: str) -> None:
    """Write a shard whole (zstd parquet) and move it into place: never seen half-written."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", row_group_size=8192)
    atomic_write(path, buffer.getvalue())


def text_bytes(texts: pa.ChunkedArray | pa.Array) -> int:
    """UTF-8 bytes of a text column (what Arrow stores), without copying it out."""
    import pyarrow.compute as pc

    return int(pc.sum(pc.binary_length(texts)).as_py() or 0)


class FileShardWriter:
    """One input file's documents cut into shards of about `target_bytes` of text each, written to
    `folder/part-NNNNN.parquet` (then numbered into the dataset by `place_file_shards`). An input file
    with no documents still gets one (empty) shard, typed by `schema`."""

    def __init__(self, folder: str, target_bytes: int, schema: pa.Schema = SCHEMA) -> None:
        self.folder, self.target_bytes, self.schema = folder, target_bytes, schema
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.size = self.bytes = self.shards = 0

    def add(self, text: str, source: str, *more: Any) -> None:
        """A document; `more` are the values of the schema's columns after `id`, `text`, `source`."""
        length = len(text.encode("utf-8", "surrogatepass"))
        for name, value in zip(self.schema.names, (document_id(text), text, source, *more), strict=True):
            self.columns[name].append(value)
        self.size += length
        self.bytes += length
        if self.size >= self.target_bytes:
            self.flush()

    def flush(self) -> None:
        write_shard(pa.table(self.columns, schema=self.schema),
                    join_path(self.folder, f"part-{self.shards:05d}.parquet"))
        self.shards += 1
        self.columns = {name: [] for name in self.schema.names}
        self.size = 0

    def close(self) -> None:
        if self.columns["id"] or not self.shards:
            self.flush()


def place_file_shards(output_path: str, files: Sequence[tuple[str, str, int]]) -> dict[str, int]:
    """Move each input file's shards (`(split, folder, shards)`, in input order) to
    `{split}/part-NNNNN.parquet`, numbered in that order; returns shards per split. A re-run after a
    crash part-way finds the ones already moved in place."""
    fs, _ = fsspec.core.url_to_fs(output_path)
    counter: dict[str, int] = {}
    for split, folder, shards in files:
        for part in range(shards):
            index = counter.get(split, 0)
            counter[split] = index + 1
            source = fsspec.core.url_to_fs(join_path(folder, f"part-{part:05d}.parquet"))[1]
            target = fsspec.core.url_to_fs(shard_path(output_path, split, index))[1]
            if fs.exists(source):
                fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                fs.mv(source, target)
    return counter
