"""Checks: cheap verifications of a step's output, run with every materialization.

A check reads the output (and the record's result) after the step succeeded — or was a
cache hit — and says whether it holds. The Dagster adapter serves each as an asset check, so
a failure shows on the asset in the UI; a check that raises fails with the error as message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckOutcome:
    """What a check found: passed or not, one line for a person, and numbers to show."""

    passed: bool
    message: str
    """One line a researcher reads in the UI: what was found."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Numbers or text shown with the result."""


@dataclass(frozen=True)
class Check:
    """One named verification of a step's output."""

    name: str
    """Identifier (letters, digits, `_`), unique among the step's checks."""
    fn: Callable[[str, Any], CheckOutcome] = field(repr=False)
    """`fn(output_path, result)` → outcome; `result` is the record's result as JSON."""
    description: str
    """What the check asserts, shown in the UI."""
    blocking: bool = False
    """A failure stops downstream assets of the same run."""


def run_check(check: Check, output_path: str, result: Any) -> CheckOutcome:
    """Run `check`; a check that raises has failed, with the error as its message."""
    try:
        return check.fn(output_path, result)
    except Exception as e:  # a check that cannot read what it checks has failed
        return CheckOutcome(False, f"{type(e).__name__}: {e}")
