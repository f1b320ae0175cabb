"""Reading text datasets (JSON lines, optionally gzipped) and writing local-only outputs.

Every error names the file and line, so a bad shard is found at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence

import fsspec

from marin_assets.core.paths import join_path


class DatasetError(ValueError):
    """The input data is malformed: bad JSON, a missing field, no documents."""


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


def iter_documents(files: Sequence[str], text_field: str = "text") -> Iterator[tuple[str, int, str]]:
    """(file, line number, text) for every JSON line of the files; `.gz` is decompressed."""
    for file in files:
        with fsspec.open(file, "rt", compression="infer", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{file}, line {number}: malformed JSON ({e.msg})") from None
                if not isinstance(record, dict) or text_field not in record:
                    raise DatasetError(f"{file}, line {number}: no {text_field!r} field")
                text = record[text_field]
                if not isinstance(text, str):
                    raise DatasetError(f"{file}, line {number}: {text_field!r} is {type(text).__name__}, not text")
                yield file, number, text


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
