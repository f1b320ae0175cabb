"""normalize: any supported dataset → the curated format (`shards`), the input of every other stage.

Each input file (JSON lines plain or compressed, parquet, text; see `readers`) is read in order and
cut into parquet shards of about `target_shard_bytes` of text, one input file's documents never
sharing a shard with another's, so files are the unit of resumption and of fan-out. Every document
gets its `id` (xxh3-128 of the text) and `source` (`file:line`, the file relative to the dataset).
Documents whose text is empty or only whitespace are removed (reason `empty`). When every file is
done, the shards are numbered in input order (`part-00000` …): the same input gives the same shards.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.curation.shards import FileShardWriter, place_file_shards, work_path
from marin_assets.pipeline.curation.stage import (
    CurationResult,
    Removed,
    ShardStats,
    curation_step,
    placed,
    run_phase,
    summarize,
)
from marin_assets.pipeline.data.readers import iter_documents
from marin_assets.pipeline.data.text_files import expand_files, find_splits

STAGE = "normalize"


def _normalize_file(dataset_path: str, output_path: str, text_field: str, text_format: str, target_shard_bytes: int,
                    item: tuple[str, int, str]) -> dict[str, Any]:
    """One input file → `_work/files/{split}-{n}/part-NNNNN.parquet`; its counts and shard count."""
    split, number, file = item
    relative = file[len(dataset_path):].lstrip("/") if file.startswith(dataset_path) else file
    writer = FileShardWriter(_files_folder(output_path, split, number), target_shard_bytes)
    documents_in = bytes_in = 0
    empty = Removed()
    for _, line, text in iter_documents([file], text_field, text_format):  # line: the file's own line or row
        documents_in += 1
        if not text.strip():
            size = len(text.encode("utf-8", "surrogatepass"))
            bytes_in += size
            empty += Removed(1, size, 0)
            continue
        writer.add(text, f"{relative}:{line}")
    writer.close()
    bytes_in += writer.bytes
    stats = ShardStats(split, documents_in, bytes_in, documents_in - empty.documents, writer.bytes,
                       {"empty": empty} if empty.documents else {})
    return {"stats": stats.to_json(), "shards": writer.shards}


def normalize(output_path: str, dataset_path: str, splits: dict[str, list[str]] | None = None,
              text_field: str = "text", text_format: str = "auto", target_shard_bytes: int = 64 << 20,
              workers: int = 1) -> CurationResult:
    """Read a dataset's splits (`{split: [glob, …]}`, or found from its layout) into curated parquet shards."""
    chosen = dict(splits) if splits else find_splits(dataset_path)
    items = [(split, n, file) for split, patterns in chosen.items()
             for n, file in enumerate(expand_files(dataset_path, patterns))]
    outcomes = run_phase(output_path, "normalized", items,
                         functools.partial(_normalize_file, dataset_path.rstrip("/"), output_path, text_field,
                                           text_format, target_shard_bytes),
                         key_of=lambda item: f"{item[0]}-{item[1]:05d}", workers=workers,
                         name=f"{STAGE} {len(items)} files")
    counter = place_file_shards(output_path, [(split, _files_folder(output_path, split, number), o["shards"])
                                              for (split, number, _), o in zip(items, outcomes, strict=True)])
    stats = [ShardStats.from_json(o["stats"]) for o in outcomes]
    return placed(summarize(STAGE, output_path, stats), counter)


def _files_folder(output_path: str, split: str, number: int) -> str:
    """Where input file `number` of `split` writes its shards before they are numbered into the dataset."""
    return work_path(output_path, "files", f"{split}-{number:05d}")


def normalize_step(name: str, dataset: Step, splits: dict[str, list[str]] | None = None, text_field: str = "text",
                   text_format: str = "auto", target_shard_bytes: int = 64 << 20, workers: int = 1,
                   max_removed_fraction: float = 0.5) -> Step:
    """`dataset` (any supported format) as curated parquet shards of about `target_shard_bytes` each.

    Identity: `splits`, `text_field`, `text_format`, `target_shard_bytes` (and `dataset`); not `workers` nor
    `max_removed_fraction` (its check's limit).
    """
    chosen: Sequence[Any] | dict[str, list[str]] | str = ({k: list(v) for k, v in splits.items()} if splits is not None
                                                           else "from-layout")
    return curation_step(
        name, STAGE,
        lambda out: normalize(out, dataset.output_path, splits, text_field, text_format, target_shard_bytes, workers),
        dataset, {"splits": chosen, "text_field": text_field, "text_format": text_format,
                  "target_shard_bytes": target_shard_bytes, "id": "xxh3-128"},
        description=made_by(normalize), max_removed_fraction=max_removed_fraction, cpu=1)
