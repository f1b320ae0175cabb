"""Light step functions: quick pure-Python work that may run in the calling process instead of a Ray task.

Starting an embedded Ray costs seconds; a step that counts a few files or writes a summary should
not pay them. Marking its function `light` says it needs none of what a Ray task gives: no
isolation from the Dagster process (it does not crash, leak memory or change global state), no
fan-out, no accelerator, no force-cancel mid-function. Where a marked step runs is the execution
layer's choice (README "Execution on Ray"); the mark is not part of the step's identity.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__marin_light__"


def light(fn: F) -> F:
    """Mark `fn` light (as a decorator, or on a `functools.partial` of a function); returns it."""
    try:
        setattr(fn, _MARK, True)
    except (AttributeError, TypeError):  # a builtin or a slotted callable: wrap it
        marked = functools.wraps(fn)(lambda *args, **kwargs: fn(*args, **kwargs))
        setattr(marked, _MARK, True)
        return marked  # type: ignore[return-value]
    return fn


def is_light(fn: Callable[..., Any]) -> bool:
    """Whether `fn` — or the function a `functools.partial` chain wraps — is marked light."""
    while True:
        if getattr(fn, _MARK, False):
            return True
        if not isinstance(fn, functools.partial):
            return False
        fn = fn.func
