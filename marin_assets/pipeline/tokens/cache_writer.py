"""Writing a text cache: files appended, in order, into one Levanter cache with a resumable ledger, or
tokenized one sub-cache per file under the split's folder and tied by a sharded ledger — the part of `tokenize`
that writes arrays.

A cache's ledger (`shard_ledger.json`) records each file's committed rows, so a crash loses at most
one commit and a re-run continues where it stopped: finished files are skipped, the file being
written continues after its committed documents. Reading and decompressing (a thread), tokenizing
(Rust, off the GIL) and framing and writing (a thread) overlap, as one pipeline across a cache's files: no stage
waits for another at a file's end, and the writer appends as tokens come, not once per commit.

Empty documents — no text, or only whitespace — are dropped in every format (`text-lines` and JSON
lines never had blank *lines* as documents; a blank `text-file` file is one dropped document): their
`[BOS, EOS]` would teach a model nothing but "documents may be empty". Each file's count is committed
with its rows, in the ledger's `field_counts` (`empty_documents_dropped/<shard>`, beside `input_ids`, the tokens
written), so a resumed file skips exactly what it read before and the count survives a crash. A sharded ledger
keeps each sub-cache's counts in `field_counts_by_shard`, and their sums in `field_counts`, as Levanter checks.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from marin_assets.core.paths import join_path
from marin_assets.execution.fanout import fan_out
from marin_assets.pipeline.data.readers import format_of, iter_text_batches
from marin_assets.pipeline.tokens import levanter_cache as lc
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.tokens.encoders import encoder

BATCH_CHARACTERS = 1 << 20
"""Texts are encoded in batches of about this many characters (fastokens needs large batches)."""
WRITE_TOKENS = 1 << 20
"""The writer appends to the arrays once this many tokens are waiting (and at every commit): each append has a
fixed cost (it reads the arrays' sizes and writes the row count), so a few large ones beat many small ones."""
EMPTY_DROPPED = "empty_documents_dropped"
"""The ledger's `field_counts` key prefix (`empty_documents_dropped/<shard>`) and the record's field name."""
TOKENS_FIELD = "input_ids"
"""The cache's one field; its `field_counts` entry is its data size (the tokens), as Levanter's writers keep it."""


class CacheCounts(NamedTuple):
    """What a cache (or sub-cache) holds: documents (rows), tokens, and the empty documents dropped."""

    documents: int
    tokens: int
    empty_documents_dropped: int = 0


def is_empty(text: str) -> bool:
    """No text, or only whitespace: a document that is dropped."""
    return not text or text.isspace()


@functools.lru_cache(maxsize=8)
def text_processor(tokenizer_path: str):
    """Levanter's processor for a tokenizer folder: the cache's exemplar and the ledger metadata Levanter
    compares when it loads the cache for training (loaded once per process and path)."""
    return lc.batch_tokenizer(tokenizer_path, "text")


def _dropped_in(field_counts: dict[str, int]) -> dict[str, int]:
    """{shard: empty documents dropped} from a ledger's field counts."""
    prefix = EMPTY_DROPPED + "/"
    return {k[len(prefix):]: v for k, v in field_counts.items() if k.startswith(prefix)}


def _commit(cache_dir: str, rows: int, tokens: int, shard_rows: dict, finished: list, done: bool, metadata,
            dropped: dict[str, int] | None = None):
    counts = {TOKENS_FIELD: tokens, **{f"{EMPTY_DROPPED}/{shard}": n for shard, n in (dropped or {}).items() if n}}
    ledger = lc.new_ledger(rows, shard_rows, finished, done, metadata, field_counts=counts)
    lc.commit_ledger(cache_dir, ledger)
    return ledger


def _text_batches(file: str, text_field: str, text_format: str, skip: int) -> Iterator[tuple[list[str], int]]:
    """(texts, empty documents dropped before and among them) of the file's documents after the first `skip`,
    in batches of about BATCH_CHARACTERS characters; a last `([], n)` carries empties after the last text."""
    batch: list[str] = []
    size = dropped = 0
    seen = False
    for texts in iter_text_batches(file, text_field=text_field, text_format=text_format, batch_size=1024, skip=skip):
        for text in texts:
            seen = True
            if is_empty(text):
                dropped += 1
                continue
            batch.append(text)
            size += len(text)
            if size >= BATCH_CHARACTERS:
                yield batch, dropped
                batch, size, dropped = [], 0, 0
    if not seen and not skip and format_of(file, text_format) == "text-file":
        dropped += 1  # the reader yields no document for a blank file
    if batch or dropped:
        yield batch, dropped


def tokenize_file(file: str, part_dir: str, tokenizer_path: str, text_field: str = "text",
                  rows_per_commit: int = 8192, text_format: str = "auto", framing: str = "bos_eos",
                  backend: str = "tokenizers") -> CacheCounts:
    """One input file → one sub-cache with its own ledger (a fanned-out task's share); resumable."""
    with s3_arrays([part_dir]):
        label = part_dir.rstrip("/").rsplit("/", 1)[-1]
        return tokenize_files([file], part_dir, tokenizer_path, text_field, rows_per_commit, text_format, framing,
                              backend, labels=[label])


def _shard_name(label: str, file: str) -> str:
    """A file's shard in a ledger: unique within the split even when two folders hold files of one name."""
    return f"{label}-{file.rstrip('/').rsplit('/', 1)[-1]}".replace(".", "_")


def finished_counts(cache_dir: str, tokenizer_path: str) -> CacheCounts | None:
    """Counts of a cache whose ledger is finished (a re-run after a late crash), else None; either layout."""
    ledger = lc.load_ledger(cache_dir)
    if ledger is None or not ledger.is_finished:
        return None
    cache = lc.load_cache(cache_dir, text_processor(tokenizer_path).output_exemplar)
    return CacheCounts(ledger.total_num_rows, cache.flat_field_length(TOKENS_FIELD),
                       sum(_dropped_in(ledger.field_counts).values()))


def tokenize_files(files: Sequence[str], cache_dir: str, tokenizer_path: str, text_field: str = "text",
                   rows_per_commit: int = 8192, text_format: str = "auto", framing: str = "bos_eos",
                   backend: str = "tokenizers", labels: Sequence[str] | None = None) -> CacheCounts:
    """Input files, in order, appended to one cache whose ledger records each file's committed rows (and
    empty documents dropped); resumes from its last commit (finished files are skipped, the current one
    continues). Returns the cache's counts.

    One pipeline runs across all the files: a reader thread reads and decompresses them in order (running
    ahead into the next file), this thread tokenizes (both Rust tokenizers release the GIL), and a writer
    thread turns the tokenizer's output into framed ids, appends them to the arrays as they come and commits
    the ledger every `rows_per_commit` documents and at the end of every file.
    """
    finished_already = finished_counts(cache_dir, tokenizer_path)
    if finished_already is not None:
        return finished_already
    processor = text_processor(tokenizer_path)
    metadata = _metadata(tokenizer_path)
    shards = [_shard_name(label, f) for label, f in zip(labels or [f"{i:05d}" for i in range(len(files))], files,
                                                         strict=True)]
    ledger = lc.load_ledger(cache_dir)
    if ledger is None:
        ledger = _commit(cache_dir, 0, 0, {}, [], False, metadata)
    store = lc.open_store(processor.output_exemplar, cache_dir, mode="a")
    lc.drop_rows_after(store, ledger.total_num_rows)  # crashed after writing, before committing
    shard_rows, finished = dict(ledger.shard_rows), list(ledger.finished_shards)
    dropped = _dropped_in(ledger.field_counts)
    done = {"rows": ledger.total_num_rows, "tokens": int(store.tree[TOKENS_FIELD].data_size)}
    # The file being tokenized when a previous attempt stopped continues after what it read (kept and dropped).
    todo = [(file, shard, shard_rows.get(shard, 0) + dropped.get(shard, 0))
            for file, shard in zip(files, shards, strict=True) if shard not in finished]

    before: dict[str, int] = {}  # rows of the cache before each file (set by the writer as it reaches the file)

    def commit(shard: str, file_done: bool = False) -> None:
        """(On the writer thread) record what is written of `shard` — all of it with `file_done` — and commit."""
        shard_rows[shard] = done["rows"] - before[shard]
        if file_done:
            finished.append(shard)
        _commit(cache_dir, done["rows"], done["tokens"], shard_rows, finished, False, metadata, dropped)

    def begin(shard: str) -> None:
        """(On the writer thread) before the first row of `shard` is written: rows of the cache before it."""
        before.setdefault(shard, done["rows"] - shard_rows.get(shard, 0))

    pipeline = _Pipeline(todo, store, encoder(tokenizer_path, framing, backend), lc.prepared_batch(), text_field,
                         text_format, rows_per_commit, begin, commit, done, dropped)
    try:
        for file, shard, skip in todo:
            _append_file(file, shard, store, pipeline, skip)
    finally:
        pipeline.close()
    _commit(cache_dir, done["rows"], done["tokens"], shard_rows, finished, True, metadata, dropped)
    return CacheCounts(done["rows"], done["tokens"], sum(dropped.values()))


@functools.lru_cache(maxsize=8)
def _metadata(tokenizer_path: str) -> Any:
    """The ledger metadata of caches built with a tokenizer folder (Levanter's `BatchTokenizer.metadata` calls
    `len()` on the transformers tokenizer: ~0.1 s for a 100k vocabulary, once per process and folder)."""
    return lc.cache_metadata(text_processor(tokenizer_path))


_END = object()
"""The reader's mark after a file's last batch, and the main thread's to the writer."""


class _Pipeline:
    """The reader and writer threads of one `tokenize_files` call, shared by its files (see there). Its state —
    `done`, `dropped`, the ledger — is touched by the writer thread only, until `close` has joined it."""

    def __init__(self, todo: Sequence[tuple[str, str, int]], store: Any, encoder: Any, prepared: Any, text_field: str,
                 text_format: str, rows_per_commit: int, begin: Any, commit: Any, done: dict[str, int],
                 dropped: dict[str, int]) -> None:
        self.encoder, self.stopped = encoder, False
        self.failure: dict[str, BaseException] = {}
        self.batches: queue.Queue = queue.Queue(maxsize=4)
        self.tokenized: queue.Queue = queue.Queue(maxsize=4)
        self._reader = threading.Thread(target=self._read, args=(todo, text_field, text_format), daemon=True,
                                        name="tokenize reader")
        self._writer = threading.Thread(target=self._write, args=(store, prepared, rows_per_commit, begin, commit,
                                                                  done, dropped), daemon=True, name="tokenize writer")
        self._reader.start()
        self._writer.start()

    def _read(self, todo: Sequence[tuple[str, str, int]], text_field: str, text_format: str) -> None:
        try:
            for file, _, skip in todo:
                for batch in _text_batches(file, text_field, text_format, skip):
                    self.batches.put(batch)
                self.batches.put(_END)
        except BaseException as e:
            self.failure["read"] = e
        finally:
            self.batches.put(None)

    def _write(self, store: Any, prepared: Any, rows_per_commit: int, begin: Any, commit: Any, done: dict[str, int],
               dropped: dict[str, int]) -> None:
        pending: list[Any] = []
        rows = tokens = 0  # rows handed over since the last commit; tokens not yet written
        ended = False

        def write() -> None:
            nonlocal pending, tokens
            if pending:
                batch = prepared.concat(pending) if len(pending) > 1 else pending[0]
                _extend(store, batch, done, batch.num_rows)
            pending, tokens = [], 0

        try:
            while (item := self.tokenized.get()) is not None:
                shard, started, empties = item
                begin(shard)
                if started is _END:
                    write()
                    commit(shard, file_done=True)
                    rows = 0
                    continue
                if started is not None:
                    pending.append(prepared(*self.encoder.assemble(started), None))
                    rows += pending[-1].num_rows
                    tokens += len(pending[-1].data)
                dropped[shard] = dropped.get(shard, 0) + empties
                if rows >= rows_per_commit:
                    write()
                    commit(shard)
                    rows = 0
                elif tokens >= WRITE_TOKENS:
                    write()
            ended = True
        except BaseException as e:
            self.failure["write"] = e
            while not ended and self.tokenized.get() is not None:  # keep the producer from blocking
                pass

    def close(self) -> None:
        """Wait for the writer (everything handed to it is written and committed) and stop the reader; raise what
        failed."""
        self.tokenized.put(None)
        self._writer.join()
        while self._reader.is_alive():  # drain so a failed tokenizer does not leave the reader blocked
            if self.batches.get() is None:
                break
        self._reader.join()
        if self.failure:
            raise self.failure.get("read") or self.failure["write"]


def _append_file(file: str, shard: str, store: Any, pipeline: _Pipeline, skip: int) -> None:
    """Tokenize one file's documents after its first `skip` (what its ledger committed, kept and dropped), as
    the pipeline's reader yields them, and hand them to its writer, which appends them to `store` and commits.
    Returns once the file is handed over (the writer may still be writing it); `_Pipeline.close` waits."""
    del file, store, skip  # the reader reads `file` after `skip`; the writer writes `store`
    while not pipeline.stopped and (item := pipeline.batches.get()) is not _END:
        if item is None or "write" in pipeline.failure:  # the reader or the writer failed: `close` raises it
            pipeline.stopped = True
            return
        texts, empties = item
        pipeline.tokenized.put((shard, pipeline.encoder.start(texts) if texts else None, empties))
    if not pipeline.stopped:
        pipeline.tokenized.put((shard, _END, 0))


def _extend(store: Any, batch: Any, done: dict[str, int], rows: int) -> None:
    """Write a prepared batch of `rows` documents after the store's rows, and count them (rows and tokens)."""
    store.extend_with_batch({TOKENS_FIELD: batch})
    done["rows"] += rows
    done["tokens"] += len(batch.data)


def commit_sharded(part_names: Sequence[str], cache_dir: str, tokenizer_path: str) -> None:
    """Tie finished sub-caches (folders under `cache_dir`, in order) into one finished cache: a sharded ledger,
    read in place by Levanter, whose per-shard counts are each sub-cache's own. Nothing is copied, and the one
    commit is atomic: before it the split has no finished ledger, after it every sub-cache is part of it."""
    processor = text_processor(tokenizer_path)
    parts = []
    for name in part_names:
        part_ledger = lc.load_ledger(join_path(cache_dir, name))
        if part_ledger is None or not part_ledger.is_finished:
            raise RuntimeError(f"sub-cache {join_path(cache_dir, name)} is not finished")
        parts.append((name, part_ledger.total_num_rows, part_ledger.field_counts))
    lc.commit_ledger(cache_dir, lc.sharded_ledger(cache_dir, processor.output_exemplar, parts,
                                                  _metadata(tokenizer_path)))


def _tokenize_part(options: dict[str, Any], file_and_part: tuple[str, str]) -> CacheCounts:
    """One file of a fan-out (module level: pickles by reference onto Ray workers)."""
    file, part_dir = file_and_part
    return tokenize_file(file, part_dir, **options)


def tokenize_split(files: Sequence[str], cache_dir: str, claims_dir: str, workers: int, **options: Any) -> CacheCounts:
    """One split: straight into its cache in this process, or — with `workers > 1` — one sub-cache per file
    (`{cache_dir}/00000`, …) across Ray tasks *and* this process (`fan_out` never waits on CPUs nobody frees;
    its claims lie in `claims_dir`), then tied by a sharded ledger."""
    if workers <= 1 or len(files) <= 1:
        return tokenize_files(files, cache_dir, **options)
    names = [f"{i:05d}" for i in range(len(files))]
    items = [(file, join_path(cache_dir, name)) for file, name in zip(files, names, strict=True)]
    claims = {part: join_path(claims_dir, f"{name}.claim") for (_, part), name in zip(items, names, strict=True)}
    counts = [CacheCounts(*c) for c in fan_out(items, functools.partial(_tokenize_part, options),
                                               claim_path_of=lambda item: claims[item[1]],
                                               workers=workers, name=f"tokenize {len(files)} files")]
    if sum(c.documents for c in counts):
        commit_sharded(names, cache_dir, options["tokenizer_path"])
    return CacheCounts(*(sum(c[i] for c in counts) for i in range(3)))
