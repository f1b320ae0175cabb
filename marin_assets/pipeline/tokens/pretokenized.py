"""Pretokenized caches: a Levanter cache made elsewhere — a Hub repository at a revision, or any
fsspec URL — copied and served as a tokenize step (Marin's `download_pretokenized_cache`).

A cache that arrives is trusted only once checked, before its step can succeed: each split's
ledger (`shard_ledger.json`) is finished and its shards' rows add up (a sharded ledger — sub-caches read in
place — is also checked as Levanter checks it, and each sub-cache as a split is); the arrays agree with it
(the offsets hold as many rows as the ledger, rise to the end of the data, and every chunk file
they need is there and decodes, so a truncated file fails); every token id fits the tokenizer;
and the cache was made with the tokenizer the step is given (its `tokenizer_fingerprint.json`,
as `tokenize` writes it and `check_tokenizer` compares it). A cache without that file — one not
made by a tokenize step — is refused: nothing says which tokenizer made it.

The copy is `download.py`'s (resumable; a Hub file's sha256 or git blob id checked as it
arrives, the revision resolved to its commit). Hidden files of the source (`.status.json`,
`.artifact.json` of a step's output) are not copied: they would overwrite this step's own. The
result is the `TokenizedCache` a tokenize step returns and the step a `TokenizeStep`, so
`train_step` takes it as a component like any other cache.
"""

from __future__ import annotations

import json
import re
from typing import Any

import fsspec
import numpy as np

from marin_assets.core.files import read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.data.download import (
    DownloadError,
    Expected,
    copy_file,
    download_hf,
    hf_source_version,
    is_commit_sha,
    url_source_version,
)
from marin_assets.pipeline.tokens.array_store import refuse_unsupported_array_store, s3_arrays
from marin_assets.pipeline.tokens.cache_writer import EMPTY_DROPPED
from marin_assets.pipeline.tokens.encoders import Framing
from marin_assets.pipeline.tokens.tokenize import (
    CACHE_NOT_EMPTY,
    FINGERPRINT_FILE,
    SplitStats,
    TokenizedCache,
    TokenizerMismatchError,
    TokenizeStep,
    tokenizer_fingerprint,
    tokenizer_matches,
)

LEDGER_FILE = "shard_ledger.json"
READ_ELEMENTS = 1 << 24
"""Token ids read (and checked) at a time: 128 MiB of int64."""


class PretokenizedCacheError(ValueError):
    """A downloaded cache is not a finished, consistent, whole Levanter cache."""


def is_url(source: str) -> bool:
    """A URL or path (`gs://…`, `hf://…`, `/data/cache`), not a Hub repository id (`user/name`)."""
    return "://" in source or source.startswith(("/", "."))


def _copy_url(output_path: str, url: str) -> None:
    """The folder's files below `url`, hidden ones left out, each copied whole (kept if already there with
    the source's size); files an earlier attempt copied that the source no longer has are removed."""
    try:
        fs, root = fsspec.core.url_to_fs(url)
        root = root.rstrip("/")
        found = fs.find(root, detail=True) if fs.isdir(root) else {}
    except (ImportError, ValueError) as e:
        raise DownloadError(f"{url}: unsupported URL ({e})") from None
    except FileNotFoundError:
        found = {}
    protocol = url.split("://", 1)[0] + "://" if "://" in url and not url.startswith("file://") else ""
    files = {path[len(root):].lstrip("/"): (path, info.get("size")) for path, info in sorted(found.items())}
    files = {rel: v for rel, v in files.items() if not any(part.startswith(".") for part in rel.split("/"))}
    if not files:
        raise DownloadError(f"{url}: not found, or a folder with no files")
    for relative, (path, size) in files.items():
        source = path if not protocol or path.startswith(protocol) else protocol + path
        copy_file(source, output_path, relative, Expected(size=size))
    out_fs, out_root = fsspec.core.url_to_fs(output_path)
    for path in out_fs.find(out_root):
        relative = path[len(out_root.rstrip("/")):].lstrip("/")
        if relative not in files and not any(part.startswith(".") for part in relative.split("/")):
            out_fs.rm(path)


def _problem(where: str, what: str) -> PretokenizedCacheError:
    return PretokenizedCacheError(f"{where}: {what}")


def _chunk_files(path: str, array: str, length: int) -> tuple[list[str], int]:
    """The chunk files (relative to `path`) that hold elements [0, length) of a zarr v3 array, from its
    zarr.json, and the elements per chunk."""
    meta_file = f"{array}/zarr.json"
    raw = read_bytes(join_path(path, meta_file))
    if raw is None:
        raise _problem(join_path(path, meta_file), "missing (the array's metadata)")
    try:
        meta = json.loads(raw)
        chunk = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        encoding = meta.get("chunk_key_encoding", {"name": "default"})
        separator = encoding.get("configuration", {}).get("separator", "/" if encoding["name"] == "default" else ".")
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise _problem(join_path(path, meta_file), f"not zarr v3 array metadata ({type(e).__name__}: {e})") from None
    prefix = "c" + separator if encoding["name"] == "default" else ""
    return [f"{array}/{prefix}{i}" for i in range(-(-length // chunk))], chunk


def _require_files(path: str, files: list[str], needed_for: str) -> None:
    fs, root = fsspec.core.url_to_fs(path)
    for relative in files:
        if not fs.exists(f"{root.rstrip('/')}/{relative}"):
            raise _problem(join_path(path, relative), f"missing ({needed_for} are in it)")


def _read(array: Any, start: int, stop: int, where: str) -> Any:
    try:
        return array[start:stop].read().result()
    except Exception as e:  # noqa: BLE001 - tensorstore reports a truncated or corrupt chunk in several types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        first = re.sub(r' in (local )?file "[^"]*"', "", first)  # the file is named already
        first = re.sub(r"\s*\[source locations=.*", "", first)  # tensorstore's own C++ lines
        raise _problem(where, f"unreadable: truncated or corrupt ({first})") from None


def _verify_arrays(path: str, folder: str, exemplar: dict, rows: int, vocab_size: int,
                   ledger_file: str) -> dict[str, int]:
    """The arrays in `{path}/{folder}` hold `rows` rows (offsets rising, every chunk file there and whole) of ids
    in the vocabulary (assistant masks 0 or 1): each field's data size."""
    from marin_assets.pipeline.tokens import levanter_cache as lc

    store = lc.open_store(exemplar, join_path(path, folder), mode="r")
    sizes = {}
    for field in exemplar:
        array = f"{folder}/{field}"
        offsets_files, _ = _chunk_files(path, f"{array}/offsets", rows + 1)
        _require_files(path, offsets_files, f"the offsets of {rows:,} rows")
        jagged = store.tree[field]
        where = join_path(path, offsets_files[0] if len(offsets_files) == 1 else f"{array}/offsets")
        found = int(_read(jagged.offsets, 0, 1, where)[0])
        if found != rows:
            raise _problem(where, f"holds {found:,} rows, but {ledger_file} says {rows:,}")
        size = 0  # where the previous row ends: rows are stored end to end
        for start in range(1, rows + 1, READ_ELEMENTS):
            ends = _read(jagged.offsets, start, min(rows + 1, start + READ_ELEMENTS), where)
            shorter = np.flatnonzero(np.diff(ends, prepend=size) < 0)
            if shorter.size:
                raise _problem(where, f"row offsets are corrupt: row {start - 1 + int(shorter[0]):,} ends before"
                                      " it starts")
            size = int(ends[-1])
        data_files, chunk = _chunk_files(path, f"{array}/data", size)
        _require_files(path, data_files, f"the {size:,} token ids of {rows:,} rows")
        for start in range(0, size, READ_ELEMENTS):
            stop = min(size, start + READ_ELEMENTS)
            ids = _read(jagged.data, start, stop, join_path(path, data_files[start // chunk]))
            low, high = int(ids.min()), int(ids.max())
            limit = vocab_size if field == "input_ids" else 2  # a chat cache's assistant masks are 0 or 1
            if low < 0 or high >= limit:
                bad = low if low < 0 else high
                position = start + int((ids == bad).argmax())
                what = (f"outside the tokenizer's {vocab_size:,} ids" if field == "input_ids"
                        else "not a 0/1 assistant mask")
                raise _problem(join_path(path, array, "data"), f"{'token id' if field == 'input_ids' else 'value'}"
                                                               f" {bad} at position {position:,} is {what}")
        sizes[field] = size
    return sizes


def _verify_shards(path: str, split: str, ledger: dict, exemplar: dict, vocab_size: int, ledger_file: str) -> int:
    """A sharded split (sub-caches under its folder, read in place): the ledger as Levanter checks it on load,
    then each sub-cache's arrays against its rows and field counts. Its tokens."""
    from marin_assets.pipeline.tokens import levanter_cache as lc

    try:
        lc.load_cache(join_path(path, split), exemplar)
    except (ValueError, KeyError, TypeError) as e:
        raise _problem(ledger_file, f"not a valid sharded ledger ({type(e).__name__}: {e})") from None
    by_shard = ledger.get("field_counts_by_shard") or {}
    for shard in ledger.get("finished_shards") or []:
        if ".." in shard.split("/"):
            raise _problem(ledger_file, f"sub-cache {shard!r} lies outside the split's folder")
        rows = ledger["shard_rows"][shard]
        if rows == 0:  # Levanter never opens an empty sub-cache
            continue
        sizes = _verify_arrays(path, f"{split}/{shard}", exemplar, rows, vocab_size, ledger_file)
        for field, size in sizes.items():
            if by_shard.get(shard, {}).get(field) != size:
                raise _problem(ledger_file, f"sub-cache {shard!r} holds {size:,} {field} values, but its field count"
                                            f" says {by_shard.get(shard, {}).get(field)}")
    return int((ledger.get("field_counts") or {}).get("input_ids", 0))


def verify_split(path: str, split: str, exemplar: dict, vocab_size: int) -> SplitStats:
    """One split agrees with its ledger: finished, rows, offsets, whole chunk files, ids in the vocabulary."""
    ledger_file = join_path(path, split, LEDGER_FILE)
    try:
        ledger = json.loads(read_bytes(ledger_file) or b"")
        rows, finished, shard_rows = ledger["total_num_rows"], ledger["is_finished"], ledger["shard_rows"]
        if not isinstance(rows, int) or rows < 0 or not isinstance(shard_rows, dict):
            raise ValueError(f"total_num_rows {rows!r}, shard_rows {type(shard_rows).__name__}")
    except (ValueError, KeyError, TypeError) as e:
        raise _problem(ledger_file, f"not a Levanter ledger ({type(e).__name__}: {e})") from None
    if not finished:
        raise _problem(ledger_file, f"the cache is not finished (is_finished is false after {rows:,} rows)")
    if sum(shard_rows.values()) != rows:
        raise _problem(ledger_file, f"total_num_rows is {rows:,}, but its shards' rows add up to"
                                    f" {sum(shard_rows.values()):,}")
    if ledger.get("layout") == "sharded":
        tokens = _verify_shards(path, split, ledger, exemplar, vocab_size, ledger_file)
    else:
        tokens = _verify_arrays(path, split, exemplar, rows, vocab_size, ledger_file)["input_ids"]
    counts = ledger.get("field_counts") if isinstance(ledger.get("field_counts"), dict) else {}
    empty = sum(n for k, n in counts.items() if k.startswith(EMPTY_DROPPED + "/") and isinstance(n, int))  # as made
    return SplitStats(rows, tokens, len(ledger.get("finished_shards") or shard_rows), empty)


def check_fingerprint(marker: str, tokenizer_path: str) -> tuple[dict, str]:
    """The cache's `tokenizer_fingerprint.json` (at `marker`, any URL) names `tokenizer_path`'s tokenizer:
    (the record, the fingerprint)."""
    ours = tokenizer_fingerprint(tokenizer_path)
    raw = read_bytes(marker)
    if raw is None:
        raise TokenizerMismatchError(f"{marker}: missing, so nothing says which tokenizer made this cache; a cache"
                                     " made by a tokenize step (and uploaded with it) has one")
    try:
        found = json.loads(raw)
        theirs = found["fingerprint"]
    except (ValueError, KeyError, TypeError) as e:
        raise _problem(marker, f"not a tokenizer fingerprint record ({type(e).__name__}: {e})") from None
    if theirs != ours:
        raise TokenizerMismatchError(f"{marker}: the cache was made with tokenizer {found.get('tokenizer')}"
                                     f" (fingerprint {theirs}), not with {tokenizer_path} (fingerprint {ours})")
    return found, ours


def verify_pretokenized(path: str, tokenizer_path: str) -> tuple[dict[str, SplitStats], Framing | None, str,
                                                               str | None, dict]:
    """A whole cache made with `tokenizer_path`'s tokenizer, every split consistent: (splits, framing, fingerprint)."""
    from marin_assets.pipeline.tokens import levanter_cache as lc
    from marin_assets.pipeline.tokens.chat import chat_exemplar, chat_template_of_cache
    from marin_assets.pipeline.tokens.encoders import hf_tokenizer
    from marin_assets.pipeline.tokens.tokenizer import largest_token_id

    found, ours = check_fingerprint(join_path(path, FINGERPRINT_FILE), tokenizer_path)
    fs, root = fsspec.core.url_to_fs(path)
    splits = sorted(p.rstrip("/").rsplit("/", 2)[-2] for p in fs.glob(f"{root.rstrip('/')}/*/{LEDGER_FILE}"))
    if not splits:
        raise _problem(path, f"no Levanter cache here: no {{split}}/{LEDGER_FILE}")
    tokenizer = hf_tokenizer(tokenizer_path)
    template = chat_template_of_cache(path)
    exemplar = (chat_exemplar(tokenizer, template) if template is not None  # ids and assistant masks
                else lc.batch_tokenizer(tokenizer_path, "text").output_exemplar)
    vocab_size = largest_token_id(tokenizer) + 1
    stats = {split: verify_split(path, split, exemplar, vocab_size) for split in splits}
    framing = Framing(**found["framing"]) if found.get("framing") else None
    return stats, framing, ours, template, exemplar


def download_pretokenized_cache(output_path: str, source: str, tokenizer_path: str, revision: str = "main",
                                repo_type: str = "dataset") -> TokenizedCache:
    """Copy a Levanter cache from a Hub repository (`user/name` at `revision`) or any fsspec URL, then verify
    it (ledgers, arrays, token ids, tokenizer fingerprint) before it counts as a tokenized cache."""
    from marin_assets.pipeline.tokens.encoders import hf_tokenizer
    from marin_assets.pipeline.tokens.tokenizer import largest_token_id

    refuse_unsupported_array_store(output_path, "download_pretokenized_cache")
    with s3_arrays([output_path]):
        # First the source's own fingerprint, so another tokenizer's cache is refused before it is copied
        # (the copy's is checked again: a URL's files may change between the two reads).
        if is_url(source):
            check_fingerprint(join_path(source, FINGERPRINT_FILE), tokenizer_path)
            _copy_url(output_path, source)
            origin = source
        else:
            sha = hf_source_version(source, revision, repo_type)  # one commit for both reads
            prefix = {"dataset": "datasets/", "space": "spaces/"}.get(repo_type, "")
            check_fingerprint(f"hf://{prefix}{source}@{sha}/{FINGERPRINT_FILE}", tokenizer_path)
            got = download_hf(output_path, source, sha, include=("[!.]*",), repo_type=repo_type)
            origin = f"{got.source}@{got.revision}"
        try:
            splits, framing, fingerprint, template, exemplar = verify_pretokenized(output_path, tokenizer_path)
        except (PretokenizedCacheError, TokenizerMismatchError) as e:
            e.add_note(f"(the cache was copied from {origin})")
            raise
        from marin_assets.pipeline.tokens.chat import assistant_token_counts

        assistant = assistant_token_counts(output_path, sorted(splits), exemplar) if template is not None else {}
        return TokenizedCache(path=output_path, tokenizer=tokenizer_path, tokenizer_fingerprint=fingerprint,
                              vocab_size=largest_token_id(hf_tokenizer(tokenizer_path)) + 1, splits=splits,
                              framing=framing, backend="pretokenized", backend_reason=f"downloaded from {origin}",
                              chat_template=template, assistant_tokens=assistant)


def pretokenized_step(name: str, source: str, tokenizer: Step, revision: str = "main",
                      repo_type: str = "dataset") -> TokenizeStep:
    """A Levanter cache made elsewhere (`source`: a Hub repository id at `revision`, or an fsspec URL), made
    with `tokenizer`'s folder, served like a tokenize step's. A branch or URL is followed by the source
    sensor; a pinned commit never changes.

    Identity: `source`, with `revision` and `repo_type` for a Hub repository (and `tokenizer`).
    """
    hub = not is_url(source)
    if hub and (source.count("/") > 1 or not source.strip("/")):
        raise StepDefinitionError(f"step {name!r}: source {source!r} is neither a Hub repository id (user/name) nor"
                                  " a URL or absolute path")
    hash_attrs: dict[str, Any] = {"source": source, "format": "levanter-cache-v2"}
    if hub:
        hash_attrs.update(revision=revision, repo_type=repo_type)
        version = None if is_commit_sha(revision) else (lambda: hf_source_version(source, revision, repo_type))
    else:
        version = lambda: url_source_version([source])  # noqa: E731
    return TokenizeStep(
        name=name,
        fn=lambda out: download_pretokenized_cache(out, source, tokenizer.output_path, revision, repo_type),
        deps=[tokenizer],
        hash_attrs=hash_attrs,
        kind="pretokenized",
        description=made_by(download_pretokenized_cache),
        source_version=version,
        kinds=["levanter"],
        checks=[CACHE_NOT_EMPTY, tokenizer_matches(tokenizer)],
        tokenizer=tokenizer,
        chat=None,  # the downloaded cache's ledger says
        preference=None,  # and whether it holds preference pairs
    )


__all__ = ["PretokenizedCacheError", "check_fingerprint", "download_pretokenized_cache", "is_url",
           "pretokenized_step",
           "verify_pretokenized", "verify_split"]
