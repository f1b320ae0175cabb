"""Reading curated outputs back in tests: which documents a stage kept, and what it wrote."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq

from marin_assets.pipeline.curation.shards import list_shards


def documents(dataset_path: str, columns=("id", "text", "source")) -> list[dict]:
    """Every row of a curated dataset, shard by shard."""
    rows: list[dict] = []
    for shard in list_shards("test", dataset_path):
        rows += pq.read_table(shard.path, columns=list(columns)).to_pylist()
    return rows


def id_counts(dataset_path: str) -> collections.Counter:
    """How many times each document id occurs in a curated dataset."""
    return collections.Counter(row["id"] for row in documents(dataset_path, ("id",)))


def kill_when(command: list[str], ready: str, env: dict | None = None, timeout: float = 120) -> None:
    """Start `command` (its own process group) and SIGKILL it as soon as the path `ready` exists:
    a worker killed part-way through a stage. Fails if it finishes or times out first."""
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        while not os.path.exists(ready):
            if process.poll() is not None:
                raise AssertionError(f"finished before {ready} appeared: {process.stdout.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{ready} did not appear in {timeout} s")
            time.sleep(0.01)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


PYTHON = sys.executable
