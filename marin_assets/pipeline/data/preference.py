"""Preference pairs for DPO: a Hugging Face preference dataset or plain JSON lines, in one preference format.

Read: the `ultrafeedback_binarized` layout (parquet with `prompt`, and `chosen` / `rejected` as lists of
`{role, content}` messages that begin with the prompt; splits such as `train_prefs` / `test_prefs` in
`data/{split}-00000-of-00001.parquet`, found as `find_splits` finds any layout's), and JSON lines
`{prompt, chosen, rejected}` whose `chosen` and `rejected` are the assistant's answer (a string) or messages.
Written: `{split}/shard-NNNNN.jsonl.gz`, rows `{"chosen": [messages], "rejected": [messages], "hash": sha256}`,
both conversations whole (the prompt's turns, then the answer): what Marin's `transform_preference_dataset`
writes and Levanter's `PreferenceChatLmDatasetFormat` reads.

Every pair is checked — known roles, text in every turn, each side ending with the assistant's answer, the same
prompt on both sides (a pair that differs before the answer says nothing about the answer) — and a bad row is an
error naming the file and its line or row. Exact duplicates (by hash; the first is kept) and pairs whose two
sides are the same are dropped and counted per split. The splits are written to a hidden folder, moved into place,
and a manifest is written last: a failed run leaves nothing, and a re-run of a finished output reads the manifest
and does nothing more.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.estimate import bytes_read_estimate
from marin_assets.core.files import atomic_write, open_file, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.results import from_jsonable, to_jsonable
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.data.messages import checked_turns, json_kind
from marin_assets.pipeline.data.readers import DatasetError, format_of, iter_records
from marin_assets.pipeline.data.text_files import expand_files, find_splits

FORMAT = "preference-chat-jsonl-v1"
"""Enters the step's identity: the layout and row schema written."""
MANIFEST = ".preference-data.json"
"""Written last: its presence means the output is whole."""
TEMP_PREFIX = ".preference-tmp-"
FIELDS = ("prompt", "chosen", "rejected")
TEXT_FORMATS = ("auto", "jsonl", "parquet")
ROWS_PER_SHARD = 10_000

Splits = Sequence[str] | Mapping[str, Sequence[str]] | None
"""None: every split the layout holds; names: those of them; `{split: [glob, …]}`: files under the dataset."""


@dataclass(frozen=True)
class PreferenceSplit:
    """One split as written: pairs kept, rows read and dropped, its input files and output shards."""

    pairs: int
    rows: int
    duplicates: int
    """Rows repeating a pair (same hash) seen earlier in the split; the first is kept."""
    identical: int
    """Rows whose chosen and rejected conversations are the same: no preference to learn."""
    files: list[str]
    """Input files, relative to the dataset."""
    shards: list[str]
    """Relative to the output: `{split}/shard-NNNNN.jsonl.gz`."""
    sha256: str
    """Of the split's uncompressed JSON lines in order: changes exactly when its pairs do."""


@record_type("preference_data")
@dataclass(frozen=True)
class PreferenceData:
    """Preference pairs as written: per split, pairs and drops; the format readers rely on."""

    path: str
    dataset_path: str
    splits: dict[str, PreferenceSplit]
    pairs: int
    dropped: int
    """Duplicates and identical pairs, over all splits."""
    format: str = FORMAT


Message = dict[str, str]


def pair_hash(chosen: list[Message], rejected: list[Message]) -> str:
    """sha256 of the pair's canonical JSON (sorted keys, no whitespace, UTF-8): the same pair, the same hash."""
    text = json.dumps({"chosen": chosen, "rejected": rejected}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def preference_pair(record: Mapping[str, Any], where: str) -> tuple[list[Message], list[Message]]:
    """A record's (chosen, rejected) conversations, whole and checked. `where`: `file, row N` for errors.

    `chosen` / `rejected`: the answer as a string, or messages. Messages with no user or system turn are the
    answer only; either kind of answer follows the `prompt` (a string: one user turn; or messages). Messages
    that hold the prompt themselves are the whole conversation, and a `prompt` beside them must be how they
    begin (its first user turn, for a string). Both must end with an assistant turn, after the same prompt."""
    for field in ("chosen", "rejected"):
        if record.get(field) is None:
            if field in record:
                raise DatasetError(f"{where}: {field!r} is null")
            fields = ", ".join(repr(k) for k in list(record)[:12]) or "none"
            raise DatasetError(f"{where}: no {field!r} field (fields: {fields})")
    prompt, prompt_is_text = _prompt_turns(record.get("prompt"), where)
    chosen = _conversation(record["chosen"], "chosen", prompt, prompt_is_text, where)
    rejected = _conversation(record["rejected"], "rejected", prompt, prompt_is_text, where)
    asked, other = chosen[:-1], rejected[:-1]
    if asked != other:
        differs = next((i for i, (a, b) in enumerate(zip(asked, other, strict=False)) if a != b), None)
        if differs is None:
            raise DatasetError(f"{where}: 'chosen' and 'rejected' have different prompts ({len(asked)} turns before"
                               f" the answer in 'chosen', {len(other)} in 'rejected')")
        raise DatasetError(f"{where}: 'chosen' and 'rejected' have different prompts (turn {differs + 1},"
                           f" {asked[differs]['role']}, differs)")
    return chosen, rejected


def _prompt_turns(value: Any, where: str) -> tuple[list[Message] | None, bool]:
    """The prompt as messages (None when absent), and whether it was given as text."""
    if value is None:
        return None, False
    if type(value) is str:
        if not value.strip():
            raise DatasetError(f"{where}: 'prompt' is empty")
        return [{"role": "user", "content": value}], True
    if type(value) is not list:
        raise DatasetError(f"{where}: 'prompt' is {json_kind(value)}, not text or a list of turns")
    if not value:
        raise DatasetError(f"{where}: 'prompt' has no turns")
    turns = checked_turns(value, where, "'prompt' turn")
    if turns[-1]["role"] == "assistant":
        raise DatasetError(f"{where}: 'prompt' ends with an assistant turn; the answers are 'chosen' and 'rejected'")
    return turns, False


def _conversation(value: Any, field: str, prompt: list[Message] | None, prompt_is_text: bool,
                  where: str) -> list[Message]:
    if type(value) is str:
        if not value.strip():
            raise DatasetError(f"{where}: {field!r} is empty")
        turns = [{"role": "assistant", "content": value}]
    elif type(value) is list:
        if not value:
            raise DatasetError(f"{where}: {field!r} has no turns")
        turns = checked_turns(value, where, f"{field!r} turn")
    else:
        raise DatasetError(f"{where}: {field!r} is {json_kind(value)}, not text or a list of turns")
    if all(t["role"] == "assistant" for t in turns):  # the answer only
        if prompt is None:
            raise DatasetError(f"{where}: {field!r} is only an answer, and there is no 'prompt' it answers")
        turns = prompt + turns
    elif prompt is not None:
        _check_begins_with(turns, prompt, prompt_is_text, field, where)
    if turns[-1]["role"] != "assistant":
        raise DatasetError(f"{where}: {field!r} ends with a {turns[-1]['role']} turn, not the assistant's answer")
    return turns


def _check_begins_with(turns: list[Message], prompt: list[Message], prompt_is_text: bool, field: str,
                       where: str) -> None:
    """A `prompt` beside whole conversations must say what they say: as text, their first user turn; as
    messages, their first turns (text compared without surrounding whitespace)."""
    if prompt_is_text:
        first = next((t for t in turns if t["role"] == "user"), None)
        if first is None or first["content"].strip() != prompt[0]["content"].strip():
            said = "it has no user turn" if first is None else "its first user turn differs"
            raise DatasetError(f"{where}: 'prompt' is not the question of {field!r} ({said})")
        return
    for i, asked in enumerate(prompt):
        turn = turns[i] if i < len(turns) else None
        if turn is None or turn["role"] != asked["role"] or turn["content"].strip() != asked["content"].strip():
            raise DatasetError(f"{where}: 'prompt' is not how {field!r} begins ({field!r} turn {i + 1} differs)")


def normalized_splits(splits: Splits, config: str | None) -> list[str] | dict[str, list[str]] | None:
    """`splits` as plain lists (what identity and the manifest hold); a bad choice is a `ValueError`."""
    if splits is None:
        return None
    if isinstance(splits, str):
        raise ValueError(f"splits={splits!r} is one name: give a list ([{splits!r}]) or {{split: [glob, …]}}")
    if not splits:
        raise ValueError("splits= is empty: give split names, {split: [glob, …]}, or None for every split")
    if isinstance(splits, Mapping):
        if config is not None:
            raise ValueError(f"give split globs or config=, not both (config {config!r} chooses among the splits"
                             f" the layout holds; given globs, write the config folder into them: '{config}/…')")
        return {str(k): [v] if isinstance(v, str) else list(v) for k, v in splits.items()}
    return list(splits)


def splits_to_read(dataset_path: str, splits: Splits, config: str | None = None) -> dict[str, list[str]]:
    """The splits to transform as `{split: [glob, …]}`: the given globs, or from the dataset's layout all its
    splits or those named (an unknown name is an error naming the ones there)."""
    chosen = normalized_splits(splits, config)
    if isinstance(chosen, dict):
        return chosen
    found = find_splits(dataset_path, config)
    if chosen is None:
        return found
    unknown = [s for s in chosen if s not in found]
    if unknown:
        raise DatasetError(f"{dataset_path}: no split {', '.join(map(repr, unknown))} (it holds:"
                           f" {', '.join(found)})")
    return {split: found[split] for split in chosen}


class _ShardWriter:
    """JSON lines into `{folder}/{split}/shard-NNNNN.jsonl.gz`, `rows_per_shard` to a shard, byte-identical on
    every run (gzip with no name and mtime 0)."""

    def __init__(self, folder: str, split: str, rows_per_shard: int) -> None:
        self.folder, self.split, self.rows_per_shard = folder, split, rows_per_shard
        self.shards: list[str] = []
        self._rows = 0
        self._raw: Any = None
        self._gz: gzip.GzipFile | None = None

    def write(self, line: bytes) -> None:
        if self._gz is None or self._rows >= self.rows_per_shard:
            self.close()
            relative = f"{self.split}/shard-{len(self.shards):05d}.jsonl.gz"
            self._raw = open_file(join_path(self.folder, relative), "wb")
            self._gz = gzip.GzipFile(filename="", fileobj=self._raw, mode="wb", compresslevel=6, mtime=0)
            self.shards.append(relative)
            self._rows = 0
        self._gz.write(line)
        self._rows += 1

    def close(self) -> None:
        if self._gz is not None:
            self._gz.close()
            self._raw.close()
            self._gz = self._raw = None


def _relative(dataset_path: str, file: str) -> str:
    """`file` (as `expand_files` names it) relative to the dataset."""
    return file.split("://", 1)[-1].removeprefix(dataset_path.split("://", 1)[-1].rstrip("/") + "/")


def _write_split(dataset_path: str, folder: str, split: str, files: list[str], text_format: str,
                 rows_per_shard: int) -> PreferenceSplit:
    writer = _ShardWriter(folder, split, rows_per_shard)
    seen: set[str] = set()
    rows = duplicates = identical = 0
    digest = hashlib.sha256()
    try:
        for file in files:
            unit = "row" if format_of(file, text_format) == "parquet" else "line"
            for numbers, records in iter_records(file, FIELDS, text_format):
                for number, record in zip(numbers, records, strict=True):
                    rows += 1
                    chosen, rejected = preference_pair(record, f"{file}, {unit} {number}")
                    if chosen == rejected:
                        identical += 1
                        continue
                    key = pair_hash(chosen, rejected)
                    if key in seen:
                        duplicates += 1
                        continue
                    seen.add(key)
                    line = json.dumps({"chosen": chosen, "rejected": rejected, "hash": key}, ensure_ascii=False)
                    data = (line + "\n").encode()
                    digest.update(data)
                    writer.write(data)
    finally:
        writer.close()
    if rows == 0:
        raise DatasetError(f"split {split!r} of {dataset_path} has no rows ({len(files)} files)")
    if not seen:
        raise DatasetError(f"split {split!r} of {dataset_path}: none of its {rows} rows is a preference"
                           f" ({identical} with chosen the same as rejected, {duplicates} duplicates)")
    return PreferenceSplit(len(seen), rows, duplicates, identical, [_relative(dataset_path, f) for f in files],
                           writer.shards, digest.hexdigest())


def preference_data(output_path: str, dataset_path: str, splits: Splits = None, config: str | None = None,
                    text_format: str = "auto", rows_per_shard: int = ROWS_PER_SHARD) -> PreferenceData:
    """Preference pairs from a dataset's splits (the `ultrafeedback_binarized` layout or `{prompt, chosen,
    rejected}` JSON lines) as `{split}/shard-NNNNN.jsonl.gz` rows `{chosen, rejected, hash}`: whole
    conversations, checked, exact duplicates and ties dropped and counted."""
    if text_format not in TEXT_FORMATS:
        raise ValueError(f"text_format {text_format!r} is not one of {', '.join(TEXT_FORMATS)}")
    if rows_per_shard < 1:
        raise ValueError(f"rows_per_shard must be positive, got {rows_per_shard}")
    chosen = splits_to_read(dataset_path, splits, config)
    files_of = {split: expand_files(dataset_path, patterns) for split, patterns in chosen.items()}
    params = {"format": FORMAT, "text_format": text_format, "rows_per_shard": rows_per_shard,
              "files": {s: [_relative(dataset_path, f) for f in files] for s, files in files_of.items()}}

    fs, root = fsspec.core.url_to_fs(output_path)
    finished = read_bytes(join_path(output_path, MANIFEST))
    if finished is not None:
        manifest = json.loads(finished)
        if manifest["params"] != params:
            raise DatasetError(f"{output_path} holds preference data made from other input files or settings"
                               f" ({_difference(manifest['params'], params)}); write to another output")
        return replace(from_jsonable(manifest["result"], PreferenceData), path=output_path)

    # An attempt killed before its manifest left these; we hold the output (the lease), so they go.
    for stale in fs.ls(root, detail=False) if fs.exists(root) else []:
        name = stale.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(TEMP_PREFIX) or name in files_of:
            fs.rm(stale, recursive=True)
    temp = join_path(root, f"{TEMP_PREFIX}{uuid.uuid4().hex[:8]}")
    try:
        written = {split: _write_split(dataset_path, _with_protocol(output_path, temp), split, files, text_format,
                                       rows_per_shard)
                   for split, files in files_of.items()}
        for split in written:
            fs.mv(join_path(temp, split), join_path(root, split), recursive=True)
    finally:
        if fs.exists(temp):
            fs.rm(temp, recursive=True)
    result = PreferenceData(output_path, dataset_path, written, sum(s.pairs for s in written.values()),
                            sum(s.duplicates + s.identical for s in written.values()))
    atomic_write(join_path(output_path, MANIFEST),
                 json.dumps({"params": params, "result": to_jsonable(result)}, indent=1).encode())
    return result


def _with_protocol(url: str, path: str) -> str:
    """`path` (a filesystem path) as a URL of `url`'s store."""
    return f"{url.split('://', 1)[0]}://{path}" if "://" in url else path


def _difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(f"{k}: {old.get(k)!r} then, {new.get(k)!r} now" for k in keys)[:500]


def preference_splits_not_empty(output_path: str, result: dict) -> CheckOutcome:
    """Every split holds pairs, and every shard recorded is in the output (one listing)."""
    fs, root = fsspec.core.url_to_fs(output_path)
    fs.invalidate_cache(root)
    found = {p[len(root.rstrip("/")):].lstrip("/") for p in fs.find(root)}
    splits = result.get("splits") or {}
    empty = [s for s, st in splits.items() if not st["pairs"]]
    missing = [shard for st in splits.values() for shard in st["shards"] if shard not in found]
    message = ", ".join(f"{s}: {st['pairs']} pairs ({st['duplicates'] + st['identical']} dropped)"
                        for s, st in splits.items()) or "no splits"
    if empty:
        message += f"; empty: {', '.join(empty)}"
    if missing:
        message += f"; {len(missing)} shards missing: {', '.join(missing[:5])}"
    return CheckOutcome(bool(splits) and not empty and not missing, message,
                        {f"{s}_pairs": st["pairs"] for s, st in splits.items()})


PREFERENCE_SPLITS = Check("preference_splits_not_empty", preference_splits_not_empty,
                          "Every split holds preference pairs, and every shard recorded is in the output.")


def preference_data_step(name: str, dataset: Step, splits: Splits = None, config: str | None = None,
                         text_format: str = "auto", rows_per_shard: int = ROWS_PER_SHARD) -> Step:
    """Preference pairs of `dataset` (e.g. a download of `HuggingFaceH4/ultrafeedback_binarized` with
    `splits=["train_prefs", "test_prefs"]`) in the one format the preference cache reads.

    Identity: `splits`, `config` (when given), `text_format`, `rows_per_shard` (and `dataset`, its dependency).
    """
    what = f"preference data step {name!r}"
    try:
        chosen = normalized_splits(splits, config)
    except ValueError as e:
        raise StepDefinitionError(f"{what}: {e}") from None
    if text_format not in TEXT_FORMATS:
        raise StepDefinitionError(f"{what}: text_format must be one of {TEXT_FORMATS}, got {text_format!r}")
    if rows_per_shard < 1:
        raise StepDefinitionError(f"{what}: rows_per_shard must be positive, got {rows_per_shard}")
    hash_attrs: dict[str, Any] = {"splits": chosen if chosen is not None else "from-layout",
                                  "text_format": text_format, "rows_per_shard": rows_per_shard, "format": FORMAT}
    if config is not None:
        hash_attrs["config"] = config
    return Step(
        name=name,
        fn=lambda out: preference_data(out, dataset.output_path, chosen, config, text_format, rows_per_shard),
        deps=[dataset],
        hash_attrs=hash_attrs,
        kind="transform",
        description=made_by(preference_data),
        checks=[PREFERENCE_SPLITS],
        estimate=bytes_read_estimate("preference-data", lambda: [dataset]),
    )


__all__ = ["FORMAT", "PREFERENCE_SPLITS", "PreferenceData", "PreferenceSplit", "pair_hash", "preference_data",
           "preference_data_step", "preference_pair", "splits_to_read"]
