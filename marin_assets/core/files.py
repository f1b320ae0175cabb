"""Small whole-file writes that readers never see half-written, through fsspec."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


def atomic_write(url: str, data: bytes) -> None:
    """Local disk: temp file, fsync, rename. Object stores: one PUT is already atomic."""
    fs, path = fsspec.core.url_to_fs(url)
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; outputs are shared with other readers
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_bytes(url: str) -> bytes | None:
    """The file's bytes, or None if it does not exist."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        data: bytes = fs.cat_file(path)
    except FileNotFoundError:
        return None
    return data


def open_file(url: str, mode: str = "r") -> Any:
    """Open a local path or fsspec URL; for writing, make the parent folder first (local disks need it)."""
    fs, path = fsspec.core.url_to_fs(url)
    if "w" in mode or "a" in mode:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    return fs.open(path, mode)
