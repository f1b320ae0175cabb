"""The long soak of tests/test_crash_trials.py: many kill -9 trials at random moments.

    .venv/bin/python bench/crash_soak.py [TRIALS_PER_KIND] [SEED]

Prints the trials run, how many kills landed mid-function, how many recoveries resumed
partial work, and every failure found (exit status 1 if any).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.crash_trials import run_trials  # noqa: E402


def main() -> int:
    per_kind = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="marin-soak-") as tmp:
        report = run_trials({"download": per_kind, "tokenize": per_kind, "train": per_kind}, Path(tmp),
                            str(Path(tmp) / "outputs"), seed=seed)
    print(json.dumps({**asdict(report), "seconds": round(time.monotonic() - started, 1), "seed": seed}, indent=2))
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
