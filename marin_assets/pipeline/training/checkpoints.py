"""Where a training run's Levanter checkpoints live, and which of them are complete.

Every training method writes `{output}/checkpoints/{run id}/step-N`; evaluation, export, the checkpoint
sensor and resumption all find checkpoints here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

import fsspec

from marin_assets.core.paths import join_path


def run_dir_of(output_path: str) -> str:
    """Where Levanter writes the checkpoints (`step-N/`) of the training run at `output_path`."""
    run_id = output_path.rstrip("/").rsplit("/", 1)[-1]
    return join_path(output_path, "checkpoints", run_id)


def list_checkpoints(run_dir: str, known: Collection[int] = ()) -> dict[int, bool]:
    """Complete checkpoints under a run folder (local or any fsspec URL) → whether temporary.

    A checkpoint counts once Levanter has written its `metadata.json`, which it does after the
    arrays are committed; a folder without it is still being written. One listing of the run
    folder, then one small read per checkpoint not in `known` — never a walk of the arrays.
    """
    fs, path = fsspec.core.url_to_fs(run_dir)
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=False)
    except FileNotFoundError:
        return {}
    found: dict[int, bool] = {}
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if not re.fullmatch(r"step-\d+", name) or int(name[5:]) in known:
            continue
        try:
            metadata = json.loads(fs.cat_file(f"{entry.rstrip('/')}/metadata.json"))
        except FileNotFoundError:
            continue
        except ValueError:  # Levanter is writing it (not atomically): still being written
            continue
        found[int(name[5:])] = bool(metadata.get("is_temporary", False))
    return found


def checkpoint_steps(run_dir: str) -> list[int]:
    """Steps of the complete checkpoints in a run folder, temporary ones included."""
    return sorted(list_checkpoints(run_dir))
