"""Tokenize: a Levanter cache (one per split) from a raw dataset and a tokenizer, exact and fast — the
step, its record (`TokenizedCache`, shared by chat and pretokenized caches) and its checks.

With one worker (the default: the Rust tokenizers already use every core of the node)
the files are appended, in order, straight into `{output}/{split}`, whose ledger records each
file's committed rows, so a crash loses at most one commit and a re-run continues where it
stopped. With `workers > 1` each file becomes its own sub-cache in the split's folder, tokenized by
Ray tasks across a cluster's nodes *and* by the step's own process (`execution.fanout`: it never
waits on CPUs nobody frees), and one sharded ledger ties the finished sub-caches into the split's
cache, which Levanter reads in place (no copy). Levanter's own builder is not used: it runs a zephyr
pipeline whose workers ask for 32 GiB each. The writing — files into a cache, sub-caches tied,
empty documents dropped and counted — is `cache_writer.py`'s.

Documents are framed with BOS/EOS *ids* (`encoders.py`), and ids never become Python ints on the
fast path: gigatoken or fastokens (the first that agrees with Hugging Face `tokenizers` on a sample of this
input) returns one buffer per batch, framed with numpy and written to the cache as a prepared batch.
A cache is tied to its tokenizer and framing: extending a cache built otherwise is refused.
Levanter is reached only through `levanter_cache` and only inside functions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.data.text_files import DatasetError, expand_files, find_splits, iter_text_batches
from marin_assets.pipeline.tokens.array_store import refuse_unsupported_array_store, s3_arrays
from marin_assets.pipeline.tokens.cache_writer import CacheCounts, finished_counts, tokenize_files, tokenize_split
from marin_assets.pipeline.tokens.encoders import (
    BACKENDS,
    FAST_BACKENDS,
    FRAMINGS,
    BackendChoice,
    Framing,
    choose_backend,
    encoder,
    hf_tokenizer,
)
from marin_assets.pipeline.tokens.token_estimates import tokenize_estimate
from marin_assets.pipeline.tokens.tokenizer import largest_token_id

FINGERPRINT_FILE = "tokenizer_fingerprint.json"
PARTS_DIR = ".parts"
"""Where a fanned-out split's claims lie while its files are tokenized (`.parts/{split}/00000.claim`, …)."""
SAMPLE_CHARACTERS = 1 << 15
"""Characters read from the start of each of the first few files to check backend parity: enough
to meet the input's scripts, whitespace and special-token text, small enough to cost well under a
second with the slower tokenizer."""
SAMPLE_DOCUMENTS = 64
"""At most this many documents from each of those files (a file of short documents: its first 64)."""


class TokenizerMismatchError(ValueError):
    """An existing cache was built with a different tokenizer or framing."""


@dataclass(frozen=True)
class SplitStats:
    """Documents, tokens and input files of one split of a cache."""

    documents: int
    tokens: int
    files: int
    empty_documents_dropped: int = 0
    """Documents with no text or only whitespace, left out of the cache (0 in records made before they were
    counted, when JSON lines and parquet kept them as `[BOS, EOS]`)."""
    max_tokens: int | None = None
    """Tokens of the longest document — of a preference cache, the longer side of any pair: what a DPO run's
    sequence must hold (None: not recorded, as for text and chat caches)."""


@record_type("tokenized_cache")
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
    """`gigatoken`, `fastokens` or `tokenizers`: which implementation produced the ids."""
    backend_reason: str = ""
    """Why that backend: the parity check's outcome, or the user's request."""
    text_format: str = "auto"
    chat_template: str | None = None
    """Set for a chat cache (ids and assistant masks per conversation: Levanter's chat format, loss on the
    assistant tokens only), to the template it was rendered with (`pipeline/tokens/chat.py`); None: a text cache."""
    assistant_tokens: dict[str, int] = field(default_factory=dict)
    """Per split of a chat cache, how many of its tokens carry loss (the assistant turns)."""
    preference: bool = False
    """A preference cache (`pipeline/tokens/preference_cache.py`: per row a chosen and a rejected conversation, ids and
    assistant masks): only DPO reads it; LM training and SFT refuse it."""


def tokenizer_fingerprint(tokenizer_path: str) -> str:
    """sha256 of the tokenizer's definition (`tokenizer.json`): what identifies it, wherever it lives. Kept per
    file and version (`_file_version`): a step and its checks ask for it several times, and reading and hashing
    a 100k vocabulary's definition costs about as much as tokenizing a megabyte."""
    url = join_path(tokenizer_path, "tokenizer.json")
    version = _file_version(url)
    if version is not None and (url, version) in _FINGERPRINTS:
        return _FINGERPRINTS[(url, version)]
    raw = read_bytes(url)
    if raw is None:
        raise TokenizerMismatchError(f"no tokenizer.json in {tokenizer_path}")
    fingerprint = hashlib.sha256(raw).hexdigest()[:16]
    if version is not None and _file_version(url) == version:  # unchanged while it was read
        if len(_FINGERPRINTS) >= 64:
            _FINGERPRINTS.clear()
        _FINGERPRINTS[(url, version)] = fingerprint
    return fingerprint


_FINGERPRINTS: dict[tuple[str, tuple], str] = {}
"""{(tokenizer.json's URL, its version): fingerprint} of the files hashed in this process."""


def _file_version(url: str) -> tuple | None:
    """What changes whenever the file's content does — its size, inode and modification time (local) or the
    store's ETag or modification time — or None: unknown, or a local file modified within the last seconds (a
    rewrite within the same clock tick would keep its stamp, as git's "racy" entries), hashed every time."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        if isinstance(fs, LocalFileSystem):
            st = os.stat(path)
            if time.time() - st.st_mtime < 2:
                return None
            return st.st_size, st.st_mtime_ns, st.st_ino
        info = fs.info(path)
    except FileNotFoundError:
        return None
    stamp = next((info[k] for k in ("ETag", "etag", "md5Hash", "crc32c", "mtime", "LastModified", "last_modified",
                                    "updated") if info.get(k)), None)
    return (info.get("size"), str(stamp)) if stamp is not None else None


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
def _vocab_size(tokenizer_path: str) -> int:
    """Largest id + 1 of a (content-addressed, so unchanging) tokenizer folder."""
    return largest_token_id(hf_tokenizer(tokenizer_path)) + 1


_CHOICES: dict[tuple[str, str, str], BackendChoice] = {}
"""Backend verdicts by (tokenizer folder, its fingerprint, the backend requested): made once per tokenizer in a
process, on the probes and the first corpus's sample."""
_CHOICES_LOCK = threading.Lock()


def _backend_choice(tokenizer_path: str, fingerprint: str, requested: str,
                    sample: Callable[[], list[str]]) -> BackendChoice:
    """`choose_backend`, once per tokenizer (its folder and `tokenizer.json` fingerprint) and request in this
    process: a later tokenize (another split's worker, the next run on a warm Ray worker) keeps the verdict and
    says so, instead of reading and encoding a sample again (0.03-0.15 s, a fifth of tokenizing 10 MB)."""
    key = (tokenizer_path, fingerprint, requested)
    with _CHOICES_LOCK:
        known = _CHOICES.get(key)
    if known is not None:
        return dataclasses.replace(known, reason=f"{known.reason} (checked earlier in this process, tokenizer"
                                                 f" {fingerprint})")
    choice = choose_backend(tokenizer_path, sample(), requested)
    with _CHOICES_LOCK:
        if len(_CHOICES) >= 64:
            _CHOICES.clear()
        _CHOICES[key] = choice
    return choice


def _parity_sample(files: Sequence[str], text_field: str, text_format: str) -> list[str]:
    """The first documents (about SAMPLE_CHARACTERS, at most SAMPLE_DOCUMENTS, of each) of the first few files:
    what the backend parity check encodes both ways. A long document contributes its start. Read a few
    documents at a time, so that a file of long documents is parsed no further than the sample needs."""
    sample: list[str] = []
    for file in files[:4]:
        size = taken = 0
        for texts in iter_text_batches(file, text_field=text_field, text_format=text_format, batch_size=8):
            for text in texts:
                sample.append(text[:SAMPLE_CHARACTERS - size])
                size += len(sample[-1])
                taken += 1
                if size >= SAMPLE_CHARACTERS or taken >= SAMPLE_DOCUMENTS:
                    break
            if size >= SAMPLE_CHARACTERS or taken >= SAMPLE_DOCUMENTS:
                break
    return sample


def splits_and_config(config: str) -> str:
    """Why `splits` and `config` are not given together."""
    return (f"give splits= or config=, not both (config {config!r} chooses among the splits the layout holds;"
            f" given splits, write the config folder into their globs: '{config}/…')")


def splits_identity(what: str, splits: dict[str, list[str]] | None,
                    config: str | None) -> tuple[dict[str, list[str]] | None, dict[str, Any]]:
    """A tokenize step's splits (a copy; None: from the layout) and the identity they make: `splits` (or
    `from-layout`), and `config` only when given — steps defined without it keep the identity they had."""
    if splits and config is not None:
        raise StepDefinitionError(f"{what}: {splits_and_config(config)}")
    chosen = {k: list(v) for k, v in splits.items()} if splits is not None else None
    attrs: dict[str, Any] = {"splits": chosen if chosen is not None else "from-layout"}
    if config is not None:
        attrs["config"] = config
    return chosen, attrs


def splits_to_read(dataset_path: str, splits: dict[str, list[str]] | None, config: str | None) -> dict[str, list[str]]:
    """The splits to tokenize: `splits` as given, else those the dataset's layout holds (in its config folder
    `config` when it has several). Given both, `splits`' globs would be relative to the root: refused."""
    if splits and config is not None:
        raise ValueError(splits_and_config(config))
    return dict(splits) if splits else dict(find_splits(dataset_path, config))


def _each_split(files_of: dict[str, list[str]], counts: Callable[[str, list[str], Callable[[], None]], CacheCounts],
                relay: bool) -> dict[str, CacheCounts]:
    """{split: counts(split, files, handed_over)}, in order. With `relay`, a split starts as soon as the one before
    it calls `handed_over` (its writer has every batch: its last append and commit, each with fsync, are left),
    on a second thread: a split's fixed costs pass while another finishes. A failure is raised once every
    split started has stopped, the first split's in order first."""
    if not relay or len(files_of) < 2:
        return {split: counts(split, files, lambda: None) for split, files in files_of.items()}
    handed = [threading.Event() for _ in files_of]

    def run(i: int, split: str, files: list[str]) -> CacheCounts:
        try:
            if i:
                handed[i - 1].wait()
            return counts(split, files, handed[i].set)
        finally:
            handed[i].set()

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize split") as pool:
        futures = {split: pool.submit(run, i, split, files) for i, (split, files) in enumerate(files_of.items())}
    return {split: future.result() for split, future in futures.items()}


def tokenize(output_path: str, dataset_path: str, tokenizer_path: str,
             splits: dict[str, list[str]] | None = None, text_field: str = "text",
             rows_per_commit: int = 8192, workers: int = 1, text_format: str = "auto",
             framing: str = "bos_eos", backend: str = "auto", config: str | None = None) -> TokenizedCache:
    """Tokenize a raw dataset's splits (`{split: [glob, …]}`; None: found from its layout, in the config
    folder `config` when it has several) into a Levanter cache, resumably, each document framed by
    `framing`'s ids. Empty documents (no text, or only whitespace) are dropped and counted per split."""
    refuse_unsupported_array_store(output_path, "tokenize")
    with s3_arrays([output_path]):
        chosen = splits_to_read(dataset_path, splits, config)
        fingerprint = tokenizer_fingerprint(tokenizer_path)
        framed = encoder(tokenizer_path, framing).framing
        check_tokenizer(output_path, tokenizer_path, fingerprint, framed)
        started = time.monotonic()
        files_of = {split: expand_files(dataset_path, patterns) for split, patterns in chosen.items()}
        all_files = [f for files in files_of.values() for f in files]
        if framing == "levanter":
            choice_backend, choice_reason = "tokenizers", "framing 'levanter' runs Levanter's BatchTokenizer"
        else:
            choice = _backend_choice(tokenizer_path, fingerprint, backend,
                                     lambda: _parity_sample(all_files, text_field, text_format))
            choice_backend, choice_reason = choice.backend, choice.reason
        options: dict[str, Any] = dict(tokenizer_path=tokenizer_path, text_field=text_field,
                                       rows_per_commit=rows_per_commit, text_format=text_format, framing=framing,
                                       backend=choice_backend)
        stats: dict[str, SplitStats] = {}

        in_process = workers <= 1 and framing != "levanter"  # (Levanter's processor is not called from two threads)

        def split_counts(split: str, files: list[str], handed_over: Callable[[], None]) -> CacheCounts:
            cache_dir = join_path(output_path, split)
            if in_process:
                return tokenize_files(files, cache_dir, handed_over=handed_over, **options)
            return finished_counts(cache_dir, tokenizer_path) or tokenize_split(
                files, cache_dir, join_path(output_path, PARTS_DIR, split), workers, **options)

        counted = _each_split(files_of, split_counts, relay=in_process)
        for split, files in files_of.items():
            counts = counted[split]
            if counts.documents == 0:
                dropped = counts.empty_documents_dropped
                empties = f"; {dropped} empty documents dropped" if dropped else ""
                raise DatasetError(f"split {split!r} of {dataset_path} has no documents ({len(files)} files{empties})")
            stats[split] = SplitStats(counts.documents, counts.tokens, len(files), counts.empty_documents_dropped)
        fs, root = fsspec.core.url_to_fs(join_path(output_path, PARTS_DIR))
        if fs.exists(root):
            fs.rm(root, recursive=True)  # every split is finished: its fan-out's claims are spent
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
    chat: bool | None = field(default=False, kw_only=True)
    """Whether its cache is a chat cache (ids and assistant masks, `chat_tokenize_step`); None: known only once
    it exists (a pretokenized cache), from its record."""
    preference: bool | None = field(default=False, kw_only=True)
    """Whether its cache is a preference cache (chosen/rejected pairs, `preference_tokenize_step`), which only DPO
    reads; None: known only once it exists, from its record. Not identity."""


def tokenize_step(name: str, dataset: Step, tokenizer: Step, splits: dict[str, list[str]] | None = None,
                  text_field: str = "text", workers: int = 1, cpu: float = 1, text_format: str = "auto",
                  framing: str = "bos_eos", backend: str = "auto", config: str | None = None) -> TokenizeStep:
    """A Levanter cache of `dataset`'s splits (`{split: [glob, …]}`, or None to find them from the
    dataset's layout — in its config folder `config`, for a dataset with several) tokenized with
    `tokenizer`'s folder.

    `framing` (see `encoders.FRAMINGS`) enters identity, and so does `config` when given. `backend` does
    not when it is `auto` (gigatoken or fastokens is used only where it matches `tokenizers` id for id) or
    `tokenizers` (the reference); forcing `gigatoken` or `fastokens` does, since then ids may differ.

    Identity: `splits`, `config` (when given), `text_field`, `text_format`, `framing`, `backend` (when forced to
    gigatoken or fastokens) (and `dataset`, `tokenizer`); not `workers` nor `cpu`.
    """
    if framing not in FRAMINGS or backend not in BACKENDS:
        raise StepDefinitionError(f"tokenize step {name!r}: framing must be one of {FRAMINGS} (got {framing!r})"
                                  f" and backend one of {BACKENDS} (got {backend!r})")
    chosen, hash_attrs = splits_identity(f"tokenize step {name!r}", splits, config)
    hash_attrs.update({"text_field": text_field, "text_format": text_format, "framing": framing,
                       "format": "levanter-cache-v2"})
    if backend in FAST_BACKENDS:
        hash_attrs["backend"] = backend
    return TokenizeStep(
        name=name,
        fn=lambda out: tokenize(out, dataset.output_path, tokenizer.output_path, chosen, text_field, workers=workers,
                                text_format=text_format, framing=framing, backend=backend, config=config),
        deps=[dataset, tokenizer],
        hash_attrs=hash_attrs,
        resources=Resources(cpu=cpu),
        kind="tokenize",
        description=made_by(tokenize),
        kinds=["levanter"],
        checks=[CACHE_NOT_EMPTY, tokenizer_matches(tokenizer)],
        estimate=tokenize_estimate(dataset),
        tokenizer=tokenizer,
    )
