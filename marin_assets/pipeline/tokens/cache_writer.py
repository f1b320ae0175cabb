"""Writing a text cache: files appended, in order, into one Levanter cache with a resumable ledger, or
tokenized one sub-cache per file under the split's folder and tied by a sharded ledger — the part of `tokenize`
that writes arrays.

A cache's ledger (`shard_ledger.json`) records each file's committed rows, so a crash loses at most
one commit and a re-run continues where it stopped: finished files are skipped, the file being
written continues after its committed documents. Reading and decompressing (a thread), tokenizing
(Rust, off the GIL) and framing and writing (a thread) overlap, as one pipeline across a cache's files: no stage
waits for another at a file's end. The writer appends in few large writes, each committed with the files that
ended before it: every append rewrites the arrays' current shard file, whatever its size.

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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from marin_assets.core.paths import join_path
from marin_assets.execution.fanout import fan_out
from marin_assets.pipeline.data.readers import format_of, iter_text_batches
from marin_assets.pipeline.tokens import levanter_cache as lc
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.tokens.encoders import FAST_BACKENDS, encoder

BATCH_CHARACTERS = 1 << 20
"""Texts are encoded by `tokenizers` in batches of about this many characters (its encodings hold ~80 bytes per
token)."""
COMPACT_BATCH_CHARACTERS = 1 << 22
"""Texts are encoded by gigatoken or fastokens in batches of about this many characters (~1 M tokens, 4 MB of
ids): their threads wait at the end of every batch for the one holding its largest document, and each call has a
fixed cost; on real source files (cl100k) the step took ~10 % less CPU with 4 MB batches than with 1 MB ones with
fastokens (issue 28)."""
WRITE_TOKENS = 1 << 21
"""The writer appends to the arrays once at least this many tokens are waiting (`write_threshold`), across file
ends: each append costs ~20 ms of CPU whatever its size (it recompresses the offsets' first chunk twice and the
tokens' last one, and reads the arrays' sizes) — with 1 M-token appends and one per file, the writer took a
third as much CPU as fastokens itself on real text."""
MAX_WRITE_TOKENS = 1 << 23
"""The most tokens the writer gathers (32 MB of ids) however full the shard file it appends to."""
SHARD_TOKENS = 1 << 22
"""Elements per shard file of the arrays of a cache this writer creates (Levanter's own default is 2^27,
`DEFAULT_WRITE_CHUNK_SIZE`): tensorstore rewrites the whole current shard file on every append, so with 2^27
tokens (a 1 GiB file of int64 ids before compression) each append's time and buffers grew with the cache. 2^22
tokens (32 MB of ids, ~10 MB compressed) bound both, and a split's appends cost time linear in its tokens;
Levanter reads the arrays through their stored metadata. A cache created before keeps its layout
(`levanter_cache.create_arrays`)."""
TOKENIZED_AHEAD = 4
"""Batches that may wait for the writer: fastokens' (~4 M tokens in compact buffers) enough that the tokenizer
runs on while one of its appends (a rewrite of the shard file, with fsync) is under way; `tokenizers`' encodings
hold ~80 bytes per token (strings, offsets, masks), but its batches are a quarter as long."""
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


def _text_batches(file: str, text_field: str, text_format: str, skip: int,
                  characters: int) -> Iterator[tuple[list[str], int]]:
    """(texts, empty documents dropped before and among them) of the file's documents after the first `skip`,
    in batches of about `characters` characters; a last `([], n)` carries empties after the last text."""
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
            if size >= characters:
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
    return _finished(cache_dir, ledger, tokenizer_path)


def _finished(cache_dir: str, ledger: Any, tokenizer_path: str) -> CacheCounts:
    """Counts of a cache with a finished `ledger`."""
    cache = lc.load_cache(cache_dir, text_processor(tokenizer_path).output_exemplar)
    return CacheCounts(ledger.total_num_rows, cache.flat_field_length(TOKENS_FIELD),
                       sum(_dropped_in(ledger.field_counts).values()))


def tokenize_files(files: Sequence[str], cache_dir: str, tokenizer_path: str, text_field: str = "text",
                   rows_per_commit: int = 8192, text_format: str = "auto", framing: str = "bos_eos",
                   backend: str = "tokenizers", labels: Sequence[str] | None = None,
                   handed_over: Callable[[], None] | None = None) -> CacheCounts:
    """Input files, in order, appended to one cache whose ledger records each file's committed rows (and
    empty documents dropped); resumes from its last commit (finished files are skipped, the current one
    continues). Returns the cache's counts.

    One pipeline runs across all the files: a reader thread reads and decompresses them in order (running
    ahead into the next file), this thread tokenizes (both Rust tokenizers release the GIL), and a writer
    thread turns the tokenizer's output into framed ids and appends them to the arrays in few large writes
    (`write_threshold`), committing the ledger with each write — at least every `rows_per_commit` documents; a
    file's end is recorded with the next commit — and, if anything fails, once more for what was written.
    `handed_over` is called once the writer has had every batch and starts its last append (or once anything
    failed): another cache may start tokenizing then.
    """
    ledger = lc.load_ledger(cache_dir)
    if ledger is not None and ledger.is_finished:
        if handed_over is not None:
            handed_over()
        return _finished(cache_dir, ledger, tokenizer_path)
    metadata = _metadata(tokenizer_path)
    shards = [_shard_name(label, f) for label, f in zip(labels or [f"{i:05d}" for i in range(len(files))], files,
                                                         strict=True)]
    shard_rows = dict(ledger.shard_rows) if ledger is not None else {}
    finished = list(ledger.finished_shards) if ledger is not None else []
    dropped = _dropped_in(ledger.field_counts) if ledger is not None else {}
    done = {"rows": ledger.total_num_rows if ledger is not None else 0, "tokens": 0, "shard": SHARD_TOKENS}
    # The file being tokenized when a previous attempt stopped continues after what it read (kept and dropped).
    todo = [(file, shard, shard_rows.get(shard, 0) + dropped.get(shard, 0))
            for file, shard in zip(files, shards, strict=True) if shard not in finished]
    arrays: dict[str, Any] = {}

    def prepare() -> None:
        """(On the writer thread, while the first batches are read and tokenized) the cache's first ledger if it
        has none, and its arrays, cut to the committed rows."""
        if ledger is None:
            _commit(cache_dir, 0, 0, {}, [], False, metadata)
        arrays["store"] = store = lc.open_store(text_processor(tokenizer_path).output_exemplar, cache_dir, mode="a",
                                                shard_elements=SHARD_TOKENS, sole_writer=True)
        lc.drop_rows_after(store, done["rows"])  # crashed after writing, before committing
        done["tokens"] = int(store.tree[TOKENS_FIELD].data_size)
        done["shard"] = lc.shard_elements(store, TOKENS_FIELD)

    def write(batch: Any, rows_of: dict[str, int], ended: list[str], commit: bool) -> None:
        """(On the writer thread) append `batch` — `rows_of[shard]` rows of each shard, in order — after the
        cache's rows, record them and the files `ended` with them, and commit (unless the caller will)."""
        if batch is not None:
            _extend(arrays["store"], batch, done, batch.num_rows)
        for shard, rows in rows_of.items():
            shard_rows[shard] = shard_rows.get(shard, 0) + rows
        finished.extend(ended)
        if commit:
            _commit(cache_dir, done["rows"], done["tokens"], shard_rows, finished, False, metadata, dropped)

    pipeline = _Pipeline(cache_dir, todo, encoder(tokenizer_path, framing, backend), lc.prepared_batch(), text_field,
                         text_format, rows_per_commit, prepare, write, done, dropped, handed_over or (lambda: None))
    complete = False
    try:
        for file, shard, _ in todo:
            _append_file(file, shard, pipeline)
        complete = True
    finally:
        pipeline.close()  # everything handed to the writer is written, unless the writer failed
        if handed_over is not None:
            handed_over()  # (again, after a failure)
        if "write" not in pipeline.failure:  # the last commit: finished, or what was written before a failure
            _commit(cache_dir, done["rows"], done["tokens"], shard_rows, finished,
                    complete and not pipeline.failure, metadata, dropped)
    pipeline.raise_failure()
    return CacheCounts(done["rows"], done["tokens"], sum(dropped.values()))


@functools.lru_cache(maxsize=8)
def _metadata(tokenizer_path: str) -> Any:
    """The ledger metadata of caches built with a tokenizer folder (Levanter's `BatchTokenizer.metadata` calls
    `len()` on the transformers tokenizer: ~0.1 s for a 100k vocabulary, once per process and folder)."""
    return lc.cache_metadata(text_processor(tokenizer_path))


def write_threshold(written: int, shard_tokens: int = SHARD_TOKENS) -> int:
    """Tokens the writer gathers before it appends them to a cache holding `written` tokens in shard files of
    `shard_tokens`: WRITE_TOKENS, or a quarter of what the current shard file already holds, up to
    MAX_WRITE_TOKENS. Every append rewrites that whole file (tensorstore's sharded zarr3), so appends of a fixed
    size would cost time quadratic in its size — in the 2^27-token shards of caches created before
    SHARD_TOKENS; in SHARD_TOKENS' shards a quarter never exceeds WRITE_TOKENS."""
    return max(WRITE_TOKENS, min((written % shard_tokens) // 4, MAX_WRITE_TOKENS))


_END = object()
"""The reader's mark after a file's last batch, and the main thread's to the writer."""


class _Pipeline:
    """The reader and writer threads of one `tokenize_files` call, shared by its files (see there). Its state —
    the cache's counts, the ledger — is touched by the writer thread only, until `close` has joined it."""

    def __init__(self, cache_dir: str, todo: Sequence[tuple[str, str, int]], encoder: Any, prepared: Any,
                 text_field: str, text_format: str, rows_per_commit: int, prepare: Any, write: Any,
                 done: dict[str, int], dropped: dict[str, int], handed_over: Callable[[], None]) -> None:
        self.cache_dir = cache_dir
        self.skips = {file: skip for file, _, skip in todo}
        """{file: documents its ledger already committed, which the reader skips}"""
        self.encoder, self.stopped = encoder, False
        self.failure: dict[str, BaseException] = {}
        self.batches: queue.Queue = queue.Queue(maxsize=4)
        compact = encoder.backend in FAST_BACKENDS and encoder.framing.style != "levanter"
        self.tokenized: queue.Queue = queue.Queue(maxsize=TOKENIZED_AHEAD)
        characters = COMPACT_BATCH_CHARACTERS if compact else BATCH_CHARACTERS
        self._reader = threading.Thread(target=self._read, args=(todo, text_field, text_format, characters),
                                        daemon=True, name="tokenize reader")
        self._writer = threading.Thread(target=self._write, daemon=True, name="tokenize writer",
                                        args=(prepared, rows_per_commit, prepare, write, done, dropped, handed_over))
        self._reader.start()
        self._writer.start()

    def _read(self, todo: Sequence[tuple[str, str, int]], text_field: str, text_format: str,
              characters: int) -> None:
        try:
            for file, _, skip in todo:
                for batch in _text_batches(file, text_field, text_format, skip, characters):
                    self.batches.put(batch)
                self.batches.put(_END)
        except BaseException as e:
            self.failure["read"] = e
        finally:
            self.batches.put(None)

    def _write(self, prepared: Any, rows_per_commit: int, prepare: Any, write: Any, done: dict[str, int],
               dropped: dict[str, int], handed_over: Callable[[], None]) -> None:
        """`prepare` the cache, then frame what the tokenizer made, gather it (rows per shard, files ended) and
        hand it to `write` in few large appends, each committed; at the end, what remains is written and left for
        `tokenize_files` to commit."""
        pending: list[Any] = []
        rows_of: dict[str, int] = {}  # rows of each shard in `pending` (and the shards seen since the last write)
        ended: list[str] = []  # files whose last rows are in `pending` (or that had none)
        rows = tokens = 0  # rows and tokens pending (`done`: what the cache holds, kept up to date by `write`)
        finished = False

        def flush(commit: bool = True) -> None:
            nonlocal pending, rows_of, ended, rows, tokens
            batch = (prepared.concat(pending) if len(pending) > 1 else pending[0]) if pending else None
            if batch is not None or rows_of or ended:
                write(batch, rows_of, ended, commit)
            pending, rows_of, ended, rows, tokens = [], {}, [], 0, 0

        try:
            prepare()
            while (item := self.tokenized.get()) is not None:
                shard, started, empties = item
                rows_of.setdefault(shard, 0)
                if started is _END:
                    ended.append(shard)
                    continue
                if started is not None:
                    pending.append(prepared(*self.encoder.assemble(started), None))
                    rows_of[shard] += pending[-1].num_rows
                    rows += pending[-1].num_rows
                    tokens += len(pending[-1].data)
                dropped[shard] = dropped.get(shard, 0) + empties
                if rows >= rows_per_commit or tokens >= write_threshold(done["tokens"], done["shard"]):
                    flush()
            finished = True
            handed_over()
            flush(commit=False)
        except BaseException as e:
            self.failure["write"] = e
            while not finished and self.tokenized.get() is not None:  # keep the producer from blocking
                pass

    def close(self) -> None:
        """Wait for the writer (everything handed to it is written) and stop the reader."""
        self.tokenized.put(None)
        self._writer.join()
        while self._reader.is_alive():  # drain so a failed tokenizer does not leave the reader blocked
            if self.batches.get() is None:
                break
        self._reader.join()

    def raise_failure(self) -> None:
        """Raise what failed on the reader or writer thread, if anything did."""
        if self.failure:
            raise self.failure.get("read") or self.failure["write"]


def _append_file(file: str, shard: str, pipeline: _Pipeline) -> None:
    """Tokenize one file's documents (those after what its ledger committed, kept and dropped), as the pipeline's
    reader yields them (it reads `file`), and hand them to its writer. Returns once the file is handed over (the
    writer may still be writing it); `_Pipeline.close` waits."""
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
