"""Finding a dataset's files (globs, the splits its layout holds) and local-only outputs.

The documents themselves are read by `readers` (re-exported here for the callers that import
them from this module).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator, Sequence

import fsspec

from marin_assets.core.paths import join_path
from marin_assets.pipeline.data.readers import DatasetError, iter_documents, iter_text_batches

__all__ = ["DatasetError", "expand_files", "find_splits", "iter_documents", "iter_text_batches", "local_copy_of",
           "local_dir_for"]

SPLIT_NAMES = ("train", "validation", "valid", "val", "dev", "test", "eval", "evaluation")
"""Folder (and `{split}.jsonl`-style file) names taken as splits; sharded files name any split."""
SHARD = re.compile(r"^(?P<split>[^.]+?)-\d{5}-of-\d{5}(?P<ext>\..*)?$")
"""The Hugging Face shard name `{split}-00000-of-00002.parquet`."""


def expand_files(root: str, patterns: Sequence[str]) -> list[str]:
    """Files under `root` matching the glob patterns (relative to root), sorted; none is an error."""
    fs, base = fsspec.core.url_to_fs(root)
    found: set[str] = set()
    for pattern in patterns:
        found.update(p for p in fs.glob(join_path(base, pattern)) if not os.path.basename(p).startswith("."))
    if not found:
        raise DatasetError(f"no files match {list(patterns)} under {root}")
    protocol = root.split("://", 1)[0] + "://" if "://" in root else ""
    return sorted(protocol + p if protocol and not p.startswith(protocol) else p for p in found)


def find_splits(root: str, config: str | None = None) -> dict[str, list[str]]:
    """The splits the layout under `root` holds, as glob patterns relative to root: `{split}/`
    folders, Hugging Face shards (`data/{split}-00000-of-00002.parquet`), `data/{split}/`, and
    the same one level down in a config folder (`{config}/...`), which must be chosen when there
    are several."""
    fs, base = fsspec.core.url_to_fs(root)
    entries = _listing(fs, base, root)
    if config is not None:
        if not entries.get(config):
            raise DatasetError(f"{root}: no config folder {config!r} (it contains: {_names(entries)})")
        found = _splits_in(fs, base, config + "/")
        if not found:
            raise DatasetError(f"{root}/{config}: no split found (it contains:"
                               f" {_names(_listing(fs, join_path(base, config), root))})")
        return found
    found = _splits_in(fs, base, "")
    if found:
        return found
    configs = {name: splits for name, is_dir in entries.items() if is_dir
               for splits in [_splits_in(fs, base, name + "/")] if splits}
    if len(configs) > 1:
        first = sorted(configs)[0]
        raise DatasetError(f"{root} holds several configs ({', '.join(sorted(configs))}); choose one with"
                           f" config= (tokenize_step(…, config={first!r}), chat_tokenize_step(…, config={first!r})),"
                           f" or give splits= globs under it (splits={configs[first]!r})")
    if configs:
        return next(iter(configs.values()))
    raise DatasetError(f"{root}: no split found — expected {{split}}/ folders ({', '.join(SPLIT_NAMES[:3])}, …),"
                       f" data/{{split}}-00000-of-00001.parquet shards or config folders holding them"
                       f" (it contains: {_names(entries)})")


def _splits_in(fs, base: str, rel: str) -> dict[str, list[str]]:
    """Splits in the folder `rel` ('' or ending in '/') and in its `data/` folder."""
    found: dict[str, list[str]] = {}
    entries = _listing(fs, join_path(base, rel) if rel else base, None)
    for folder in [rel] + ([rel + "data/"] if entries.get("data") else []):
        listing = entries if folder == rel else _listing(fs, join_path(base, folder), None)
        shards = {(m["split"], m["ext"] or "") for name, is_dir in listing.items()
                  if not is_dir and (m := SHARD.match(name))}
        names = {split for split, _ in shards}
        for split, ext in sorted(shards):
            # `train-*` would also take a split named `train-clean`: then spell the shard number out.
            ambiguous = any(other.startswith(split + "-") for other in names)
            middle = "[0-9][0-9][0-9][0-9][0-9]-of-*" if ambiguous else "*"
            found.setdefault(split, []).append(f"{folder}{split}-{middle}{ext}")
        for name, is_dir in sorted(listing.items()):
            split = name if is_dir else name.split(".", 1)[0]  # `train.jsonl.gz` is split `train`
            if split.lower() in SPLIT_NAMES and (is_dir or not SHARD.match(name)):
                found.setdefault(split, []).append(f"{folder}{name}/*" if is_dir else f"{folder}{name}")
    order = {name: i for i, name in enumerate(SPLIT_NAMES)}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0].lower(), len(order)), kv[0])))


def _listing(fs, path: str, root: str | None) -> dict[str, bool]:
    """{name: is a folder} of a folder's visible entries; a missing root is an error naming it."""
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        if root is None:
            return {}
        raise DatasetError(f"{root}: not found") from None
    listing = {os.path.basename(e["name"].rstrip("/")): e["type"] == "directory" for e in entries}
    return {name: is_dir for name, is_dir in listing.items() if name and not name.startswith(".")}


def _names(entries: dict[str, bool], limit: int = 20) -> str:
    names = [name + ("/" if is_dir else "") for name, is_dir in sorted(entries.items())]
    return (", ".join(names[:limit]) + (f", … ({len(names)} in all)" if len(names) > limit else "")) or "nothing"


@contextlib.contextmanager
def local_dir_for(output_path: str) -> Iterator[str]:
    """A local folder to write into: the output itself, or a temp folder uploaded at the end."""
    if "://" not in output_path:
        os.makedirs(output_path, exist_ok=True)
        yield output_path
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield tmp
        fs, path = fsspec.core.url_to_fs(output_path)
        fs.put(tmp.rstrip("/") + "/", path, recursive=True)


@contextlib.contextmanager
def local_copy_of(path: str) -> Iterator[str]:
    """A local folder with the content of `path` (itself when already local)."""
    if "://" not in path:
        yield path
        return
    with tempfile.TemporaryDirectory() as tmp:
        fs, remote = fsspec.core.url_to_fs(path)
        fs.get(remote.rstrip("/") + "/", tmp, recursive=True)
        yield tmp
