"""A small English-like corpus the project generates deterministically, for fast tests.

Short stories from a little grammar (characters, places, objects, feelings), in the spirit
of TinyStories: enough structure for a tiny model's loss to fall visibly. Train and
validation come from different seeds, so validation is held out. Written as JSON lines
(`{"text": ...}`) in `train/` and `validation/`, the layout the tokenize step reads. Its
template sentences are learned almost perfectly in a few hundred steps, so the demo trains
on real text instead (`python_docs.py`).
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by

NAMES = ["Lily", "Tom", "Mia", "Ben", "Sara", "Max", "Anna", "Leo", "Zoe", "Sam", "Ella", "Jack"]
ANIMALS = ["cat", "dog", "bird", "fox", "rabbit", "bear", "duck", "frog", "mouse", "owl"]
PLACES = ["the park", "the garden", "the forest", "the beach", "the kitchen", "the school", "the farm", "the river"]
OBJECTS = ["a red ball", "a big box", "a shiny key", "a small boat", "a blue kite", "a old book", "a warm hat",
           "a funny drum", "a green apple", "a tiny car"]
FEELINGS = ["happy", "sad", "scared", "excited", "tired", "proud", "curious", "angry"]
VERBS = ["found", "lost", "saw", "wanted", "made", "shared", "hid", "carried"]
ENDINGS = [
    "From that day on, {a} and {b} were best friends.",
    "{a} learned that sharing makes everyone {f}.",
    "Then they went home and had a big dinner.",
    "{a} smiled and gave {b} a big hug.",
    "It was the best day ever.",
]


@record_type("corpus_files")
@dataclass(frozen=True)
class CorpusFiles:
    """What a raw text dataset holds, per split."""

    train_files: list[str]
    validation_files: list[str]
    train_documents: int
    validation_documents: int
    bytes: int


def story(rng: random.Random) -> str:
    """One synthetic story: a few sentences drawn from small word lists by `rng`."""
    a, b = rng.sample(NAMES, 2)
    animal, place, obj = rng.choice(ANIMALS), rng.choice(PLACES), rng.choice(OBJECTS)
    feeling, feeling2, verb = rng.choice(FEELINGS), rng.choice(FEELINGS), rng.choice(VERBS)
    lines = [
        f"Once upon a time, there was a little {animal} named {a}.",
        f"One day, {a} went to {place} with {b}.",
        f"At {place}, {a} {verb} {obj}.",
        f"{a} felt {feeling}. \"Look, {b}!\" said {a}.",
        f"{b} was {feeling2} too, and they played with {obj} all day.",
    ]
    if rng.random() < 0.5:
        lines.append(f"Then it started to rain, so {a} and {b} ran under a big tree.")
    lines.append(rng.choice(ENDINGS).format(a=a, b=b, f=rng.choice(FEELINGS)))
    return " ".join(lines)


def write_jsonl_shards(output_path: str, split: str, records: Sequence[dict], shards: int,
                       digests: Sequence[Any] = ()) -> tuple[list[str], int]:
    """`records` as `shards` gzipped JSONL files `{split}/shard-NNNNN.jsonl.gz`, in order, each
    written to a temporary name and renamed, byte-identical on every run (gzip mtime 0). Every
    uncompressed line also feeds the `digests` (hashlib objects), so a content hash costs no re-read.

    Returns (relative paths, uncompressed bytes)."""
    files, total = [], 0
    per_shard = -(-len(records) // shards)
    for shard in range(shards):
        chunk = records[shard * per_shard:(shard + 1) * per_shard]
        if not chunk:
            break
        rel = f"{split}/shard-{shard:05d}.jsonl.gz"
        url = join_path(output_path, rel)
        with fsspec.open(url + ".tmp", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            for record in chunk:
                line = (json.dumps(record) + "\n").encode()
                gz.write(line)
                total += len(line)
                for digest in digests:
                    digest.update(line)
        fs, path = fsspec.core.url_to_fs(url)
        fs.mv(path + ".tmp", path)
        files.append(rel)
    return files, total


def write_split(output_path: str, split: str, seed: int, documents: int, shards: int) -> tuple[list[str], int]:
    """`shards` gzipped JSONL files of `documents` stories in total; returns (relative paths, bytes)."""
    rng = random.Random(seed)
    return write_jsonl_shards(output_path, split, [{"text": story(rng)} for _ in range(documents)], shards)


def generate_corpus(output_path: str, train_documents: int, validation_documents: int, seed: int,
                    shards: int = 4) -> CorpusFiles:
    """Generate synthetic short stories: train and validation splits from different seeds."""
    train, train_bytes = write_split(output_path, "train", seed, train_documents, shards)
    validation, val_bytes = write_split(output_path, "validation", seed + 1_000_003, validation_documents, 1)
    return CorpusFiles(train, validation, train_documents, validation_documents, train_bytes + val_bytes)


def corpus_step(name: str, train_documents: int, validation_documents: int, seed: int = 0, shards: int = 4) -> Step:
    """A generated corpus of short stories (`train/` and `validation/` from different seeds).

    Identity: `train_documents`, `validation_documents`, `seed`, `shards` and the generator's version.
    """
    return Step(
        name=name,
        fn=lambda out: generate_corpus(out, train_documents, validation_documents, seed, shards),
        hash_attrs={"train_documents": train_documents, "validation_documents": validation_documents,
                    "seed": seed, "shards": shards, "generator": "stories-v1"},
        kind="generate",
        description=made_by(generate_corpus),
    )
