"""Tokenize: a Levanter cache (train and validation splits) from a raw dataset and a tokenizer.

Each input file becomes its own sub-cache with its own ledger, committed every few thousand
documents, so a crash loses at most one commit of one file and a re-run continues where it
stopped. The finished sub-caches are then concatenated in this process into
`{output}/{split}` — Levanter's own Ray builder is not used: on a small cluster its copy
tasks ask for 4 CPUs and 6 GiB and wait forever. With `workers > 1` files are tokenized by
parallel Ray tasks (across a cluster's nodes); with one, the Rust tokenizer already uses
every core of the node. A cache is tied to its tokenizer: extending a cache built with
another tokenizer is refused. Levanter is reached only through `levanter_cache` (which fences
the private Levanter calls this needs) and only inside functions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.step import Resources, Step, made_by
from marin_assets.pipeline import levanter_cache as lc
from marin_assets.pipeline.text_files import DatasetError, expand_files, iter_documents
from marin_assets.pipeline.tokenizer import load_hf_tokenizer

FINGERPRINT_FILE = "tokenizer_fingerprint.json"
PARTS_DIR = ".parts"


class TokenizerMismatchError(ValueError):
    """An existing cache was built with a different tokenizer."""


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
    splits: dict[str, SplitStats]
    tokens_per_second: float = 0.0


def tokenizer_fingerprint(tokenizer_path: str) -> str:
    """sha256 of the tokenizer's definition (`tokenizer.json`): what identifies it, wherever it lives."""
    raw = read_bytes(join_path(tokenizer_path, "tokenizer.json"))
    if raw is None:
        raise TokenizerMismatchError(f"no tokenizer.json in {tokenizer_path}")
    return hashlib.sha256(raw).hexdigest()[:16]


def check_tokenizer(output_path: str, tokenizer_path: str, fingerprint: str) -> None:
    """Refuse to touch a cache made with another tokenizer; claim an empty one for this one."""
    marker = join_path(output_path, FINGERPRINT_FILE)
    raw = read_bytes(marker)
    if raw is not None:
        found = json.loads(raw)
        if found["fingerprint"] != fingerprint:
            raise TokenizerMismatchError(
                f"the cache at {output_path} was built with tokenizer {found['tokenizer']} (fingerprint"
                f" {found['fingerprint']}); refusing to reuse it with {tokenizer_path} (fingerprint {fingerprint})"
            )
        return
    atomic_write(marker, json.dumps({"tokenizer": tokenizer_path, "fingerprint": fingerprint}).encode())


@functools.lru_cache(maxsize=8)
def _processor(tokenizer_path: str, text_field: str):
    """Levanter's tokenizing processor for a tokenizer folder, loaded once per process and path
    (a content-addressed tokenizer folder never changes)."""
    return lc.batch_tokenizer(load_hf_tokenizer(tokenizer_path), text_field)


def _commit(cache_dir: str, rows: int, shard_rows: dict, finished: list, done: bool, metadata):
    ledger = lc.new_ledger(rows, shard_rows, finished, done, metadata)
    lc.commit_ledger(cache_dir, ledger)
    return ledger


def tokenize_file(file: str, part_dir: str, tokenizer_path: str, text_field: str = "text",
                  batch_size: int = 512, rows_per_commit: int = 8192) -> tuple[int, int]:
    """One input file → one sub-cache with its own ledger; resumes from its last commit.

    Returns (documents, tokens).
    """
    processor = _processor(tokenizer_path, text_field)
    metadata = lc.cache_metadata(processor)
    # Unique within the split even when two folders hold files of one name.
    shard = f"{os.path.basename(part_dir)}-{os.path.basename(file)}".replace(".", "_")
    ledger = lc.load_ledger(part_dir)
    if ledger is not None and ledger.is_finished:
        store = lc.open_store(processor.output_exemplar, part_dir, mode="r")
        return ledger.total_num_rows, int(store.tree["input_ids"].data_size)
    if ledger is None:
        ledger = _commit(part_dir, 0, {shard: 0}, [], False, metadata)
    store = lc.open_store(processor.output_exemplar, part_dir, mode="a")
    if len(store) > ledger.total_num_rows:  # crashed after writing, before committing
        lc.expose_rows(store, ledger.total_num_rows)
    skip = ledger.total_num_rows

    # Three stages overlap on separate cores: parsing (reader thread), tokenizing (here; the
    # Rust tokenizer releases the GIL), writing and committing in order (writer thread).
    batches: queue.Queue = queue.Queue(maxsize=4)
    tokenized: queue.Queue = queue.Queue(maxsize=4)
    failure: dict[str, BaseException] = {}
    done = {"rows": skip}

    def read() -> None:
        try:
            batch: list[dict] = []
            for index, (_, _, text) in enumerate(iter_documents([file], text_field)):
                if index < skip:
                    continue
                batch.append({text_field: text})
                if len(batch) >= batch_size:
                    batches.put(batch)
                    batch = []
            if batch:
                batches.put(batch)
        except BaseException as e:
            failure["read"] = e
        finally:
            batches.put(None)

    def write() -> None:
        pending: list = []
        try:
            while (rows := tokenized.get()) is not None:
                pending.extend(rows)
                if len(pending) >= rows_per_commit:
                    store.extend(pending)
                    done["rows"] += len(pending)
                    pending = []
                    _commit(part_dir, done["rows"], {shard: done["rows"]}, [], False, metadata)
            if pending:
                store.extend(pending)
                done["rows"] += len(pending)
        except BaseException as e:
            failure["write"] = e
            while tokenized.get() is not None:  # keep the producer from blocking
                pass

    reader = threading.Thread(target=read, name=f"read {shard}", daemon=True)
    writer = threading.Thread(target=write, name=f"write {shard}", daemon=True)
    reader.start()
    writer.start()
    encode = _encoder(processor, text_field)
    try:
        while (batch := batches.get()) is not None:
            tokenized.put(encode(batch))
    finally:
        tokenized.put(None)
        writer.join()
        while reader.is_alive():  # drain so a failed tokenizer does not leave the reader blocked
            if batches.get() is None:
                break
        reader.join()
    if failure:
        raise failure.get("read") or failure["write"]
    _commit(part_dir, done["rows"], {shard: done["rows"]}, [shard], True, metadata)
    return done["rows"], int(store.tree["input_ids"].data_size)


def _encoder(processor, text_field: str):
    """Levanter's BatchTokenizer, or — when the tokenizer itself frames documents with BOS/EOS
    and nothing else needs doing — the Rust tokenizer directly, with identical output and
    without the Python-side conversions of the transformers wrapper. `encode_batch_fast`
    (tokenizers >= 0.21) skips the character offsets nobody here reads: ~25 % more tokens/s."""
    fast = lc.rust_tokenizer(processor)
    framing = lc.tokenizer_framing(processor)
    if (fast is None or framing.adds_bos or framing.adds_eos or processor.padding is not False
            or processor.return_attention_mask):
        return processor
    limit = framing.long_text_limit
    encode_batch = getattr(fast, "encode_batch_fast", fast.encode_batch)

    def encode(batch: list[dict]) -> list[dict]:
        texts = [row[text_field] for row in batch]
        if limit is not None and any(len(t) > limit for t in texts):
            return processor(batch)
        return [{"input_ids": e.ids} for e in encode_batch(texts)]

    return encode


def merge_parts(part_dirs: Sequence[str], cache_dir: str, tokenizer_path: str, text_field: str = "text") -> None:
    """Concatenate finished sub-caches, in order, into one finished cache; resumable."""
    processor = _processor(tokenizer_path, text_field)
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


def _finished_stats(cache_dir: str, tokenizer_path: str, text_field: str, files: int) -> SplitStats | None:
    """Counts of a split whose merged cache is already finished (a re-run after a late crash)."""
    ledger = lc.load_ledger(cache_dir)
    if ledger is None or not ledger.is_finished:
        return None
    exemplar = _processor(tokenizer_path, text_field).output_exemplar
    store = lc.open_store(exemplar, cache_dir, mode="r")
    return SplitStats(ledger.total_num_rows, int(store.tree["input_ids"].data_size), files)


def _tokenize_files(files: Sequence[str], part_dirs: Sequence[str], tokenizer_path: str, text_field: str,
                    rows_per_commit: int, workers: int) -> list[tuple[int, int]]:
    if workers <= 1:
        return [tokenize_file(f, p, tokenizer_path, text_field, rows_per_commit=rows_per_commit)
                for f, p in zip(files, part_dirs, strict=True)]
    import ray

    # A task blocked in ray.get gives its CPUs back to Ray, so these nested tasks cannot starve.
    remote = ray.remote(num_cpus=1, max_retries=0)(tokenize_file)
    return ray.get([remote.remote(f, p, tokenizer_path, text_field,  # type: ignore[call-arg]  # Ray's stubs
                                  rows_per_commit=rows_per_commit) for f, p in zip(files, part_dirs, strict=True)])


def tokenize(output_path: str, dataset_path: str, tokenizer_path: str,
             splits: dict[str, Sequence[str]] | None = None, text_field: str = "text",
             rows_per_commit: int = 8192, workers: int = 1) -> TokenizedCache:
    """Tokenize a raw dataset's splits into a Levanter cache, resumably."""
    splits = splits or {"train": ["train/*"], "validation": ["validation/*"]}
    fingerprint = tokenizer_fingerprint(tokenizer_path)
    check_tokenizer(output_path, tokenizer_path, fingerprint)
    started = time.monotonic()
    stats: dict[str, SplitStats] = {}
    for split, patterns in splits.items():
        files = expand_files(dataset_path, patterns)
        finished = _finished_stats(join_path(output_path, split), tokenizer_path, text_field, len(files))
        if finished is not None:
            stats[split] = finished
            continue
        parts = [join_path(output_path, PARTS_DIR, split, f"{i:05d}") for i in range(len(files))]
        counts = _tokenize_files(files, parts, tokenizer_path, text_field, rows_per_commit, workers)
        documents = sum(c[0] for c in counts)
        if documents == 0:
            raise DatasetError(f"split {split!r} of {dataset_path} has no documents ({len(files)} files)")
        merge_parts(parts, join_path(output_path, split), tokenizer_path, text_field)
        stats[split] = SplitStats(documents, sum(c[1] for c in counts), len(files))
    fs, root = fsspec.core.url_to_fs(join_path(output_path, PARTS_DIR))
    if fs.exists(root):
        fs.rm(root, recursive=True)  # merged: the sub-caches would only double the disk used
    tokens = sum(s.tokens for s in stats.values())
    vocab = len(_processor(tokenizer_path, text_field).tokenizer)
    return TokenizedCache(output_path, tokenizer_path, fingerprint, vocab, stats,
                          round(tokens / max(time.monotonic() - started, 1e-9), 1))


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


def tokenize_step(name: str, dataset: Step, tokenizer: Step, splits: dict[str, Sequence[str]] | None = None,
                  text_field: str = "text", workers: int = 1, cpu: float = 1) -> TokenizeStep:
    """A Levanter cache of `dataset`'s splits (`{split: [glob, …]}`) tokenized with `tokenizer`'s folder."""
    splits = {k: list(v) for k, v in (splits or {"train": ["train/*"], "validation": ["validation/*"]}).items()}
    return TokenizeStep(
        name=name,
        fn=lambda out: tokenize(out, dataset.output_path, tokenizer.output_path, splits, text_field,
                                workers=workers),
        deps=[dataset, tokenizer],
        hash_attrs={"splits": splits, "text_field": text_field, "format": "levanter-cache-v1"},
        resources=Resources(cpu=cpu),
        kind="tokenize",
        description=made_by(tokenize),
        kinds=["levanter"],
        checks=[CACHE_NOT_EMPTY, tokenizer_matches(tokenizer)],
        tokenizer=tokenizer,
    )
