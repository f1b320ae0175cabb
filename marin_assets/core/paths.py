"""Where outputs live: the storage prefix and path joining for local paths and URLs.

The prefix is resolved at use time, never baked into a step: the storage resource sets it
for the duration of a materialization (`using_prefix`), else `MARIN_PREFIX`, else the
project-local `outputs/` folder. It never enters identity.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

PREFIX_ENV = "MARIN_PREFIX"
DEFAULT_LOCAL_DIR = "outputs"

_active_prefix: contextvars.ContextVar[str | None] = contextvars.ContextVar("marin_prefix", default=None)


def normalize_prefix(prefix: str) -> str:
    """Absolute local paths (a relative prefix would split data from status, Marin #6334)."""
    prefix = prefix.strip()
    if not prefix:
        raise ValueError("storage prefix is empty")
    if prefix.startswith("file://"):
        prefix = prefix[len("file://") :]
    if "://" in prefix:
        return prefix.rstrip("/")
    return os.path.abspath(os.path.expanduser(prefix))


def default_prefix() -> str:
    """`MARIN_PREFIX` if set, else `./outputs` of the working directory (the project root)."""
    return normalize_prefix(os.environ.get(PREFIX_ENV) or DEFAULT_LOCAL_DIR)


def storage_prefix() -> str:
    """The prefix in effect: the one set by `using_prefix`, else `default_prefix()`."""
    return _active_prefix.get() or default_prefix()


@contextlib.contextmanager
def using_prefix(prefix: str) -> Iterator[str]:
    """Set the storage prefix for the duration of a `with` block (this context only)."""
    token = _active_prefix.set(normalize_prefix(prefix))
    try:
        yield _active_prefix.get()  # type: ignore[misc]
    finally:
        _active_prefix.reset(token)


def join_path(base: str, *parts: str) -> str:
    """Join with '/', for local paths and URLs alike."""
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out
