"""Old names kept for one release after a rename: each still works and warns, naming the new one.

A module that moved leaves a two-line file at its old path calling `moved_module(__name__, "new.path")`: the old
path then *is* the new module (the same object, so patches and `isinstance` agree), and importing it warns once per
process. A function or class that was renamed is kept as `old = renamed(new, "old", "where.it.lives")`: calling it
warns, then calls the new one. A module that became a folder of the same name sets its folder's `__getattr__ =
moved_names(__name__, "folder.module")`: the names it held still import from the folder, warning. Every warning is a
`DeprecationWarning` naming the new place and the release that removes the old name.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

REMOVED_IN = "0.3.0"
"""The release that drops every old name kept here: one release after the renames of 0.2.0."""

F = TypeVar("F", bound=Callable[..., Any])


def moved_module(old: str, new: str) -> None:
    """Make module `old` (the caller's `__name__`) the module `new`, warning that it moved."""
    warnings.warn(f"{old} moved to {new}; the old path goes in marin-assets {REMOVED_IN}", DeprecationWarning,
                  stacklevel=3)
    sys.modules[old] = importlib.import_module(new)


def renamed(new: F, old_name: str, where: str) -> F:
    """`new` under its old name `old_name` (in module `where`): the same callable, warning at each call."""
    message = (f"{where}.{old_name} is now {new.__module__}.{new.__qualname__}; the old name goes in marin-assets"
               f" {REMOVED_IN}")

    @functools.wraps(new)
    def old(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)

    old.__name__ = old.__qualname__ = old_name
    return old  # type: ignore[return-value]


def moved_names(package: str, new: str) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`, a module that became a folder: a name that the old module defined
    is found in `new` (the module that now holds it), with a warning naming it there. Submodules of the folder
    and names `new` lacks are not forwarded, so they import, or fail, as usual."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(importlib.import_module(new), name, _MISSING)
        if value is _MISSING or name == new.rpartition(".")[2]:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(f"{package}.{name} moved to {new}.{name}; the old path goes in marin-assets {REMOVED_IN}",
                      DeprecationWarning, stacklevel=2)
        return value

    return __getattr__


_MISSING = object()
