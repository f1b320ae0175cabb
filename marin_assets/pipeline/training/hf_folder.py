"""A Hugging Face model folder as a training run reads it: its `config.json`, and a fingerprint of its weights that
is cheap at definition time (no weight is read). Both the sources of a run's first weights (`sources`) and the
conversion to a Levanter checkpoint (`hf_to_levanter`) read folders through it, so neither imports the other.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import fsspec

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack")


class TrainSourceError(ValueError):
    """The weights a run should start from are missing, or do not fit its model or tokenizer."""


def read_hf_config(folder: str) -> dict[str, Any]:
    """The `config.json` of a Hugging Face model folder (local or URL); `TrainSourceError` if there is none."""
    fs, path = fsspec.core.url_to_fs(folder)
    try:
        config: dict[str, Any] = json.loads(fs.cat_file(f"{path.rstrip('/')}/config.json"))
    except FileNotFoundError:
        raise TrainSourceError(f"{folder} is not a Hugging Face model folder: it has no config.json") from None
    return config


def hf_fingerprint(folder: str) -> str:
    """16 hex of sha256 over a Hugging Face model folder's `config.json`, its weight index (if sharded), and
    each weight file's name, size and version — the store's content checksum where it keeps one (GCS md5
    or crc32c, S3 ETag), else its modification time. Cheap at definition time: no weight is read."""
    fs, path = fsspec.core.url_to_fs(folder)
    path = path.rstrip("/")
    digest = hashlib.sha256(json.dumps(read_hf_config(folder), sort_keys=True).encode())
    weights = 0
    for info in sorted(fs.ls(path, detail=True), key=lambda i: i["name"]):
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        if name.endswith(".index.json"):
            digest.update(name.encode() + b"\0" + fs.cat_file(info["name"]))
        elif name.endswith(WEIGHT_SUFFIXES):
            weights += 1
            version = next((str(info[k]) for k in ("md5Hash", "crc32c", "ETag", "etag", "mtime") if info.get(k)), "")
            digest.update(f"{name}\0{info.get('size')}\0{version}\0".encode())
    if not weights:
        raise TrainSourceError(f"{folder} has a config.json but no weights (*.safetensors, pytorch_model*.bin)")
    return digest.hexdigest()[:16]
