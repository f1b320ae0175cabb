"""Paths, settings and small helpers the tests share."""

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from marin_assets.core.lease import LeaseSettings

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FAST = LeaseSettings(heartbeat_interval=0.2, stale_timeout=1.5, poll_interval=0.05)
"""Lease timing for tests: a dead holder is noticed in 1.5 s."""


def wait_for(condition: Callable[[], object], what: str, timeout: float = 120.0, interval: float = 0.01):
    """Poll `condition` until it returns something truthy, and return that. `timeout` is a bound against a
    hang, not a timing assertion: it fails the test (AssertionError naming `what`) only if the condition never
    comes; on a loaded machine it simply comes later."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(interval)
    return value


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment plus `extra`, with the project root importable."""
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def record_call(events_file: str, fn, output_path: str):
    """Append the worker's pid to `events_file`, then run `fn`: counts calls across processes."""
    with open(events_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    return fn(output_path)


def calls(events_file) -> list[int]:
    """The pids `record_call` wrote, one per call."""
    return [int(x) for x in Path(events_file).read_text().split()] if Path(events_file).exists() else []


def corpus_and_tokenizer(root: Path, train_documents: int, validation_documents: int, seed: int, shards: int,
                         vocab_size: int = 400) -> tuple[str, str]:
    """A generated corpus under `root/raw` and a BPE tokenizer trained on it under `root/tok`."""
    from marin_assets.pipeline.data.corpus import generate_corpus
    from marin_assets.pipeline.tokens.tokenizer import train_tokenizer

    raw = str(root / "raw")
    generate_corpus(raw, train_documents=train_documents, validation_documents=validation_documents, seed=seed,
                    shards=shards)
    return raw, train_tokenizer(str(root / "tok"), raw, vocab_size=vocab_size).path


def run_cli(*args, env, cwd=ROOT, check=True) -> subprocess.CompletedProcess:
    """Run a command line (a real CLI) and fail the test with its output if it fails."""
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def output_files(folder) -> dict[str, bytes]:
    """Every file of a folder that is output (no hidden bookkeeping such as .artifact.json), by relative path."""
    found = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if not name.startswith("."):
                path = os.path.join(root, name)
                found[os.path.relpath(path, folder)] = Path(path).read_bytes()
    return found


@contextlib.contextmanager
def trained_tiny_stories(storage_prefix: str, /, **build: object) -> Iterator[dict]:
    """`tiny_stories.build(**build)` trained under `storage_prefix` (exported as MARIN_PREFIX meanwhile): its steps."""
    import pytest

    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import walk
    from marin_assets.experiments import tiny_stories

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARIN_PREFIX", storage_prefix)
        pipeline = tiny_stories.build(**build)  # type: ignore[arg-type]
        for step in walk([pipeline["train"]]):
            materialize_step(step, prefix=storage_prefix)
        yield pipeline
