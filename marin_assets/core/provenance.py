"""Provenance: who, where, from which commit and command an output was made."""

from __future__ import annotations

import datetime as _dt
import functools
import getpass
import re
import socket
import subprocess
import sys

from marin_assets.core.record import Provenance

_SECRET_FLAG = re.compile(r"(token|secret|password|passwd|credential|api[_-]?key|access[_-]?key)", re.I)
_SECRET_VALUE = re.compile(r"^(hf_[A-Za-z0-9]{10,}|ghp_[A-Za-z0-9]{10,}|ya29\.[\w.-]+|AKIA[0-9A-Z]{12,})$")
REDACTED = "***"


def redact_argv(argv: list[str]) -> list[str]:
    """Hide values of secret-looking flags (`--hf-token X`, `--token=X`) and token-shaped args."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("-") and _SECRET_FLAG.search(arg):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
        elif _SECRET_VALUE.match(arg):
            out.append(REDACTED)
        else:
            out.append(arg)
    return out


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """HEAD of the working directory's repository, or None outside one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def current_provenance(run_id: str | None) -> Provenance:
    """Who, where, from which commit and command this process makes an output now."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Provenance(
        run_id=run_id,
        user=user,
        host=socket.gethostname(),
        git_commit=git_commit(),
        created_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        command_line=redact_argv(list(sys.argv)),
    )
