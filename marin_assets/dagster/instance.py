"""The Dagster instance settings marin-assets writes and ships, so that no queued or requested work is lost.

Dagster's defaults drop a queued run for good when the daemon cannot reach the code server while dequeuing
it (a deploy, a restart, a slow machine: "Caught an unrecoverable error while dequeuing the run"), never
retry a run whose worker died, and leave a run stuck `STARTING` when its launch was lost. `RELIABILITY`
turns on what Dagster has for each: the run queue retries a run whose code server was unreachable
(`run_queue`), a run that failed for any reason but a step's own error is retried (`run_retries`), and a
run that never got going is failed after a while, so that it can be retried (`run_monitoring`). The sensors
ask again for what is lost around those (`marin_assets.dagster.resubmit`).

The Makefile's project-local instance (`make demo`, `make dev`) is written by `python -m
marin_assets.dagster.instance PATH`, `deploy/dagster.yaml` carries the same settings (a test holds them
equal), and the tests' instances use `instance_settings()`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

RELIABILITY: dict[str, Any] = {
    "run_queue": {
        "max_user_code_failure_retries": 30,
        "user_code_failure_retry_delay": 5,
    },
    "run_retries": {
        "enabled": True,
        "max_retries": 2,
        "retry_on_asset_or_op_failure": False,
    },
    "run_monitoring": {
        "enabled": True,
        "start_timeout_seconds": 180,
        "poll_interval_seconds": 10,
    },
}
"""What keeps queued and requested work through a daemon restart or a slow code server: 30 tries 5 s apart
to reach the code server (2.5 minutes of it down), two retries of a run that failed for any reason but a
step's error, and a run that has not started after 3 minutes failed (and so retried)."""

LOCAL: dict[str, Any] = {
    "telemetry": {"enabled": False},
    "nux": {"enabled": False},  # no "Join the Dagster community" modal: the UI opens on the asset graph
    **RELIABILITY,
}
"""The project-local instance: no telemetry, no sign-up modal, and `RELIABILITY`."""


def instance_settings(**overrides: Any) -> dict[str, Any]:
    """`LOCAL`, with top-level keys replaced by `overrides` (a test's shorter delays, say)."""
    return {**LOCAL, **overrides}


def write_instance_yaml(path: str | Path, settings: dict[str, Any] | None = None) -> list[str]:
    """Make `path` hold `settings` (default `LOCAL`): a new file gets them all; an existing file keeps every
    setting it has and gains the top-level keys it lacks. Returns the keys added."""
    path = Path(path)
    settings = LOCAL if settings is None else settings
    current = yaml.safe_load(path.read_text()) if path.exists() else None
    current = current if isinstance(current, dict) else {}
    added = [key for key in settings if key not in current]
    if added or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text() if path.exists() else ""
        extra = yaml.safe_dump({k: settings[k] for k in added}, sort_keys=False)
        path.write_text(text + ("\n" if text and not text.endswith("\n") else "") + extra)
    return added


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m marin_assets.dagster.instance PATH/dagster.yaml", file=sys.stderr)
        return 2
    added = write_instance_yaml(argv[0])
    if added:
        print(f"{argv[0]}: set {', '.join(added)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
