"""Tokenize: a Levanter cache (one per split) from a raw dataset and a tokenizer, exact and fast.

With one worker (the default: the Rust tokenizers already use every core of the node)
the files are appended, in order, straight into `{output}/{split}`, whose ledger records each
file's committed rows, so a crash loses at most one commit and a re-run continues where it
stopped. With `workers > 1` each file becomes its own sub-cache, tokenized by Ray tasks across
a cluster's nodes *and* by the step's own process (`execution.fanout`: it never waits on CPUs
nobody frees), and the finished sub-caches are concatenated in this process. Levanter's own Ray
builder is not used: on a small cluster its copy tasks ask for 4 CPUs and 6 GiB and wait forever.

Documents are framed with BOS/EOS *ids* (`encoders.py`), and ids never become Python ints on the
fast path: fastokens (when it agrees with Hugging Face `tokenizers` on a sample of this input)
returns one buffer per batch, framed with numpy and written to the cache as a prepared batch.
Reading and decompressing (a thread), tokenizing (Rust, off the GIL) and writing (a thread)
overlap. A cache is tied to its tokenizer and framing: extending a cache built otherwise is
refused. Levanter is reached only through `levanter_cache` and only inside functions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.execution.fanout import fan_out
from marin_assets.pipeline import levanter_cache as lc
from marin_assets.pipeline.encoders import BACKENDS, FRAMINGS, Framing, choose_backend, encoder, hf_tokenizer
from marin_assets.pipeline.text_files import (
    DatasetError,
    expand_files,
    find_splits,
    iter_text_batches,
)
from marin_assets.pipeline.tokenizer import largest_token_id

FINGERPRINT_FILE = "tokenizer_fingerprint.json"
PARTS_DIR = ".parts"
BATCH_CHARACTERS = 1 << 20
"""Texts are encoded in batches of about this many characters (fastokens needs large batches)."""
SAMPLE_CHARACTERS = 1 << 15
"""Characters read from the start of each of the first few files to check backend parity: enough
to meet the input's scripts, whitespace and special-token text, small enough to cost well under a
second with the slower tokenizer."""


class TokenizerMismatchError(ValueError):
    """An existing cache was built with a different tokenizer or framing."""


@dataclass(frozen=True)
class SplitStats:
    """Documents, tokens and input files of one split of a cache."""

    documents: int
    tokens: int
    files: int


@dataclass(frozen=True)
class TokenizedCache:
    """A Levanter cache: `{path}/{split}` for each split, built with `tokenizer`."""

    path: str
    tokenizer: str
    tokenizer_fingerprint: str
    vocab_size: int
    """Largest token id + 1: what a model's embedding must cover (tokenizers may have id gaps)."""
    splits: dict[str, SplitStats]
    tokens_per_second: float = 0.0
    framing: Framing | None = None
    """The ids around every document (None in records made before framing was explicit)."""
    backend: str = ""
    """`fastokens` or `tokenizers`: which implementation produced the ids."""
    backend_reason: str = ""
    """Why that backend: the parity check's outcome, or the user's request."""
    text_format: str = "auto"
    chat_template: str | None = None
    """Set for a chat cache (ids and assistant masks per conversation: Levanter's chat format, loss on the
    assistant tokens only), to the template it was rendered with (`pipeline/chat.py`); None: a text cache."""
    assistant_tokens: dict[str, int] = field(default_factory=dict)
    """Per split of a chat cache, how many of its tokens carry loss (the assistant turns)."""


def tokenizer_fingerprint(tokenizer_path: str) -> str:
    """sha256 of the tokenizer's definition (`tokenizer.json`): what identifies it, wherever it lives."""
    raw = read_bytes(join_path(tokenizer_path, "tokenizer.json"))
    if raw is None:
        raise TokenizerMismatchError(f"no tokenizer.json in {tokenizer_path}")
    return hashlib.sha256(raw).hexdigest()[:16]


def check_tokenizer(output_path: str, tokenizer_path: str, fingerprint: str, framing: Framing | None = None) -> None:
    """Refuse to touch a cache made with another tokenizer or framing; claim an empty one for these."""
    marker = join_path(output_path, FINGERPRINT_FILE)
    raw = read_bytes(marker)
    framed = dataclasses.asdict(framing) if framing is not None else None
    if raw is not None:
        found = json.loads(raw)
        if found["fingerprint"] != fingerprint:
            raise TokenizerMismatchError(
                f"the cache at {output_path} was built with tokenizer {found['tokenizer']} (fingerprint"
                f" {found['fingerprint']}); refusing to reuse it with {tokenizer_path} (fingerprint {fingerprint})"
            )
        if found.get("framing") != framed:
            raise TokenizerMismatchError(f"the cache at {output_path} was built with framing {found.get('framing')};"
                                         f" refusing to extend it with framing {framed}")
        return
    atomic_write(marker, json.dumps({"tokenizer": tokenizer_path, "fingerprint": fingerprint,
                                     "framing": framed}).encode())


@functools.lru_cache(maxsize=8)
def _processor(tokenizer_path: str):
    """Levanter's processor for a tokenizer folder: the cache's exemplar and the ledger metadata Levanter
    compares when it loads the cache for training (loaded once per process and path)."""
    return lc.batch_tokenizer(hf_tokenizer(tokenizer_path), "text")


def _commit(cache_dir: str, rows: int, shard_rows: dict, finished: list, done: bool, metadata):
    ledger = lc.new_ledger(rows, shard_rows, finished, done, metadata)
    lc.commit_ledger(cache_dir, ledger)
    return ledger


def _text_batches(file: str, text_field: str, text_format: str, skip: int) -> Iterator[list[str]]:
    """The file's documents after the first `skip`, in batches of about BATCH_CHARACTERS characters."""
    batch: list[str] = []
    size = 0
    for texts in iter_text_batches(file, text_field=text_field, text_format=text_format, batch_size=1024, skip=skip):
        for text in texts:
            batch.append(text)
            size += len(text)
            if size >= BATCH_CHARACTERS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def tokenize_file(file: str, part_dir: str, tokenizer_path: str, text_field: str = "text",
                  rows_per_commit: int = 8192, text_format: str = "auto", framing: str = "bos_eos",
                  backend: str = "tokenizers") -> tuple[int, int]:
    """One input file → one sub-cache with its own ledger (a fanned-out task's share); resumable.

    Returns (documents, tokens).
    """
    label = part_dir.rstrip("/").rsplit("/", 1)[-1]
    return tokenize_files([file], part_dir, tokenizer_path, text_field, rows_per_commit, text_format, framing,
                          backend, labels=[label])


def _shard_name(label: str, file: str) -> str:
    """A file's shard in a ledger: unique within the split even when two folders hold files of one name."""
    return f"{label}-{file.rstrip('/').rsplit('/', 1)[-1]}".replace(".", "_")


def tokenize_files(files: Sequence[str], cache_dir: str, tokenizer_path: str, text_field: str = "text",
                   rows_per_commit: int = 8192, text_format: str = "auto", framing: str = "bos_eos",
                   backend: str = "tokenizers", labels: Sequence[str] | None = None) -> tuple[int, int]:
    """Input files, in order, appended to one cache whose ledger records each file's committed rows;
    resumes from its last commit (finished files are skipped, the current one continues).

    Returns (documents, tokens) of the cache.
    """
    from levanter.store.jagged_array import PreparedBatch

    processor = _processor(tokenizer_path)
    metadata = lc.cache_metadata(processor)
    encode = encoder(tokenizer_path, framing, backend).encode
    shards = [_shard_name(label, f) for label, f in zip(labels or [f"{i:05d}" for i in range(len(files))], files,
                                                         strict=True)]
    ledger = lc.load_ledger(cache_dir)
    if ledger is not None and ledger.is_finished:
        store = lc.open_store(processor.output_exemplar, cache_dir, mode="r")
        return ledger.total_num_rows, int(store.tree["input_ids"].data_size)
    if ledger is None:
        ledger = _commit(cache_dir, 0, {}, [], False, metadata)
    store = lc.open_store(processor.output_exemplar, cache_dir, mode="a")
    if len(store) > ledger.total_num_rows:  # crashed after writing, before committing
        lc.expose_rows(store, ledger.total_num_rows)
    shard_rows, finished = dict(ledger.shard_rows), list(ledger.finished_shards)
    done = {"rows": ledger.total_num_rows}
    for file, shard in zip(files, shards, strict=True):
        if shard in finished:
            continue
        skip = shard_rows.get(shard, 0)  # the file being tokenized when a previous attempt stopped
        before = done["rows"] - skip  # rows of the cache before this file

        def commit(total: int, shard: str = shard, before: int = before) -> None:
            shard_rows[shard] = total - before
            _commit(cache_dir, total, shard_rows, finished, False, metadata)

        _append_file(file, shard, store, encode, PreparedBatch, text_field, text_format, rows_per_commit, commit,
                     done, skip)
        finished.append(shard)
        commit(done["rows"])
    _commit(cache_dir, done["rows"], shard_rows, finished, True, metadata)
    return done["rows"], int(store.tree["input_ids"].data_size)


def _append_file(file: str, shard: str, store: Any, encode: Any, prepared: Any, text_field: str, text_format: str,
                 rows_per_commit: int, commit: Any, done: dict[str, int], skip: int) -> None:
    """Append one file's documents after its first `skip` to `store`, calling `commit(total rows)` every
    `rows_per_commit` documents.

    Three stages overlap: reading and decompressing (reader thread), tokenizing (here; both Rust
    tokenizers release the GIL), writing and committing in order (writer thread).
    """
    batches: queue.Queue = queue.Queue(maxsize=4)
    tokenized: queue.Queue = queue.Queue(maxsize=4)
    failure: dict[str, BaseException] = {}

    def read() -> None:
        try:
            for batch in _text_batches(file, text_field, text_format, skip):
                batches.put(batch)
        except BaseException as e:
            failure["read"] = e
        finally:
            batches.put(None)

    def write() -> None:
        pending: list[Any] = []
        rows = 0
        ended = False
        try:
            while (batch := tokenized.get()) is not None:
                pending.append(batch)
                rows += batch.num_rows
                if rows >= rows_per_commit:
                    store.extend_with_batch({"input_ids": prepared.concat(pending)})
                    done["rows"] += rows
                    pending, rows = [], 0
                    commit(done["rows"])
            ended = True
            if pending:
                store.extend_with_batch({"input_ids": prepared.concat(pending)})
                done["rows"] += rows
        except BaseException as e:
            failure["write"] = e
            while not ended and tokenized.get() is not None:  # keep the producer from blocking
                pass

    reader = threading.Thread(target=read, name=f"read {shard}", daemon=True)
    writer = threading.Thread(target=write, name=f"write {shard}", daemon=True)
    reader.start()
    writer.start()
    try:
        while (texts := batches.get()) is not None:
            ids, ends = encode(texts)
            tokenized.put(prepared(ids, ends, None))
    finally:
        tokenized.put(None)
        writer.join()
        while reader.is_alive():  # drain so a failed tokenizer does not leave the reader blocked
            if batches.get() is None:
                break
        reader.join()
    if failure:
        raise failure.get("read") or failure["write"]


def merge_parts(part_dirs: Sequence[str], cache_dir: str, tokenizer_path: str) -> None:
    """Concatenate finished sub-caches, in order, into one finished cache; resumable."""
    processor = _processor(tokenizer_path)
    exemplar = processor.output_exemplar
    ledger = lc.load_ledger(cache_dir)
    if ledger is not None and ledger.is_finished:
        return
    if ledger is None:
        ledger = _commit(cache_dir, 0, {}, [], False, lc.cache_metadata(processor))
    dest = lc.open_store(exemplar, cache_dir, mode="a")
    if len(dest) > ledger.total_num_rows:
        lc.expose_rows(dest, ledger.total_num_rows)
    for part in part_dirs:
        part_ledger = lc.load_ledger(part)
        if part_ledger is None or not part_ledger.is_finished:
            raise RuntimeError(f"sub-cache {part} is not finished")
        if all(s in ledger.finished_shards for s in part_ledger.finished_shards):
            continue
        rows = ledger.total_num_rows
        offsets = {k: v.data_size for k, v in dest.tree.items()}
        lc.append_cache(cache_dir, part, exemplar, offsets, rows)
        lc.expose_rows(dest, rows + part_ledger.total_num_rows)
        ledger.total_num_rows += part_ledger.total_num_rows
        ledger.shard_rows.update(part_ledger.shard_rows)
        ledger.finished_shards.extend(part_ledger.finished_shards)
        lc.commit_ledger(cache_dir, ledger)
    ledger.is_finished = True
    lc.commit_ledger(cache_dir, ledger)


def _finished_stats(cache_dir: str, tokenizer_path: str, files: int) -> SplitStats | None:
    """Counts of a split whose merged cache is already finished (a re-run after a late crash)."""
    ledger = lc.load_ledger(cache_dir)
    if ledger is None or not ledger.is_finished:
        return None
    store = lc.open_store(_processor(tokenizer_path).output_exemplar, cache_dir, mode="r")
    return SplitStats(ledger.total_num_rows, int(store.tree["input_ids"].data_size), files)


def _tokenize_part(options: dict[str, Any], file_and_part: tuple[str, str]) -> tuple[int, int]:
    """One file of a fan-out (module level: pickles by reference onto Ray workers)."""
    file, part_dir = file_and_part
    return tokenize_file(file, part_dir, **options)


def _tokenize_split(files: Sequence[str], cache_dir: str, parts_dir: str, workers: int,
                    **options: Any) -> tuple[int, int]:
    """One split: straight into its cache in this process, or — with `workers > 1` — one sub-cache per
    file across Ray tasks *and* this process (`fan_out` never waits on CPUs nobody frees), then merged."""
    if workers <= 1 or len(files) <= 1:
        return tokenize_files(files, cache_dir, **options)
    parts = [join_path(parts_dir, f"{i:05d}") for i in range(len(files))]
    counts = fan_out(list(zip(files, parts, strict=True)), functools.partial(_tokenize_part, options),
                     claim_path_of=lambda item: item[1].rstrip("/") + ".claim", workers=workers,
                     name=f"tokenize {len(files)} files")
    if sum(c[0] for c in counts):
        merge_parts(parts, cache_dir, options["tokenizer_path"])
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


@functools.lru_cache(maxsize=8)
def _vocab_size(tokenizer_path: str) -> int:
    """Largest id + 1 of a (content-addressed, so unchanging) tokenizer folder."""
    return largest_token_id(hf_tokenizer(tokenizer_path)) + 1


def _parity_sample(files: Sequence[str], text_field: str, text_format: str) -> list[str]:
    """The first documents (about SAMPLE_CHARACTERS of each) of the first few files: what the backend
    parity check encodes both ways. A long document contributes its start."""
    sample: list[str] = []
    for file in files[:4]:
        size = 0
        for texts in iter_text_batches(file, text_field=text_field, text_format=text_format, batch_size=64):
            for text in texts:
                sample.append(text[:SAMPLE_CHARACTERS - size])
                size += len(sample[-1])
                if size >= SAMPLE_CHARACTERS:
                    break
            break
    return sample


def tokenize(output_path: str, dataset_path: str, tokenizer_path: str,
             splits: dict[str, list[str]] | None = None, text_field: str = "text",
             rows_per_commit: int = 8192, workers: int = 1, text_format: str = "auto",
             framing: str = "bos_eos", backend: str = "auto") -> TokenizedCache:
    """Tokenize a raw dataset's splits (`{split: [glob, …]}`; None: found from its layout) into a
    Levanter cache, resumably, each document framed by `framing`'s ids."""
    chosen: dict[str, list[str]] = dict(splits) if splits else dict(find_splits(dataset_path))
    fingerprint = tokenizer_fingerprint(tokenizer_path)
    framed = encoder(tokenizer_path, framing).framing
    check_tokenizer(output_path, tokenizer_path, fingerprint, framed)
    started = time.monotonic()
    files_of = {split: expand_files(dataset_path, patterns) for split, patterns in chosen.items()}
    all_files = [f for files in files_of.values() for f in files]
    if framing == "levanter":
        choice_backend, choice_reason = "tokenizers", "framing 'levanter' runs Levanter's BatchTokenizer"
    else:
        choice = choose_backend(tokenizer_path, _parity_sample(all_files, text_field, text_format), backend)
        choice_backend, choice_reason = choice.backend, choice.reason
    options = dict(tokenizer_path=tokenizer_path, text_field=text_field, rows_per_commit=rows_per_commit,
                   text_format=text_format, framing=framing, backend=choice_backend)
    stats: dict[str, SplitStats] = {}
    for split, files in files_of.items():
        finished = _finished_stats(join_path(output_path, split), tokenizer_path, len(files))
        if finished is not None:
            stats[split] = finished
            continue
        documents, tokens = _tokenize_split(files, join_path(output_path, split),
                                            join_path(output_path, PARTS_DIR, split), workers, **options)
        if documents == 0:
            raise DatasetError(f"split {split!r} of {dataset_path} has no documents ({len(files)} files)")
        stats[split] = SplitStats(documents, tokens, len(files))
    fs, root = fsspec.core.url_to_fs(join_path(output_path, PARTS_DIR))
    if fs.exists(root):
        fs.rm(root, recursive=True)  # merged: the sub-caches would only double the disk used
    tokens = sum(s.tokens for s in stats.values())
    vocab = _vocab_size(tokenizer_path)
    return TokenizedCache(output_path, tokenizer_path, fingerprint, vocab, stats,
                          round(tokens / max(time.monotonic() - started, 1e-9), 1), framed, choice_backend,
                          choice_reason, text_format)


def cache_not_empty(output_path: str, result: dict) -> CheckOutcome:
    """Each split's Levanter ledger is finished and holds documents, and the record counted tokens."""
    rows = {}
    for split in result["splits"]:
        ledger = json.loads(read_bytes(join_path(output_path, split, "shard_ledger.json")) or b"{}")
        rows[split] = ledger.get("total_num_rows", 0) if ledger.get("is_finished") else 0
    empty = sorted(s for s, n in rows.items() if n == 0 or result["splits"][s]["tokens"] == 0)
    tokens = {f"{s}_tokens": result["splits"][s]["tokens"] for s in rows}
    message = (f"empty or unfinished: {', '.join(empty)}" if empty
               else ", ".join(f"{s}: {n} documents" for s, n in rows.items()))
    return CheckOutcome(bool(rows) and not empty, message, {**{f"{s}_documents": n for s, n in rows.items()}, **tokens})


def tokenizer_matches(tokenizer: Step) -> Check:
    """The cache was built with the tokenizer the step declares, as that tokenizer is now."""

    def check(output_path: str, result: dict) -> CheckOutcome:
        found = json.loads(read_bytes(join_path(output_path, FINGERPRINT_FILE)) or b"{}").get("fingerprint")
        declared = tokenizer_fingerprint(tokenizer.output_path)
        if found == declared:
            return CheckOutcome(True, f"built with {tokenizer.name} (fingerprint {declared[:12]})")
        return CheckOutcome(False, f"built with a tokenizer of fingerprint {str(found)[:12]}, but {tokenizer.name} now"
                                   f" has fingerprint {declared[:12]}", {"found": str(found), "declared": declared})

    return Check("tokenizer_matches", check, "The cache was built with the declared tokenizer (same tokenizer.json).",
                 blocking=True)


CACHE_NOT_EMPTY = Check("cache_not_empty", cache_not_empty,
                        "Every split is a finished Levanter cache with documents and tokens.", blocking=True)


@dataclass(frozen=True, eq=False)
class TokenizeStep(Step):
    """A tokenize step that knows, at definition time, which tokenizer step its cache is built with."""

    tokenizer: Step = field(kw_only=True)
    """The tokenizer step (its output folder is the tokenizer)."""


def tokenize_step(name: str, dataset: Step, tokenizer: Step, splits: dict[str, list[str]] | None = None,
                  text_field: str = "text", workers: int = 1, cpu: float = 1, text_format: str = "auto",
                  framing: str = "bos_eos", backend: str = "auto") -> TokenizeStep:
    """A Levanter cache of `dataset`'s splits (`{split: [glob, …]}`, or None to find them from the
    dataset's layout) tokenized with `tokenizer`'s folder.

    `framing` (see `encoders.FRAMINGS`) enters identity. `backend` does not when it is `auto`
    (fastokens is used only where it matches `tokenizers` id for id) or `tokenizers` (the reference);
    forcing `fastokens` does, since then ids may differ.
    """
    if framing not in FRAMINGS or backend not in BACKENDS:
        raise StepDefinitionError(f"tokenize step {name!r}: framing must be one of {FRAMINGS} (got {framing!r})"
                                  f" and backend one of {BACKENDS} (got {backend!r})")
    chosen = {k: list(v) for k, v in splits.items()} if splits is not None else None
    hash_attrs: dict[str, Any] = {"splits": chosen if chosen is not None else "from-layout", "text_field": text_field,
                                  "text_format": text_format, "framing": framing, "format": "levanter-cache-v2"}
    if backend == "fastokens":
        hash_attrs["backend"] = backend
    return TokenizeStep(
        name=name,
        fn=lambda out: tokenize(out, dataset.output_path, tokenizer.output_path, chosen, text_field, workers=workers,
                                text_format=text_format, framing=framing, backend=backend),
        deps=[dataset, tokenizer],
        hash_attrs=hash_attrs,
        resources=Resources(cpu=cpu),
        kind="tokenize",
        description=made_by(tokenize),
        kinds=["levanter"],
        checks=[CACHE_NOT_EMPTY, tokenizer_matches(tokenizer)],
        tokenizer=tokenizer,
    )
