"""Preference pairs → a Levanter preference cache: per pair, the chosen and the rejected conversation as ids with
assistant masks — Levanter's preference chat format (`PreferenceChatLmDatasetFormat`), what `train_dpo` reads.

Input: what `pipeline/data/preference.py` writes (`{split}/shard-NNNNN.jsonl.gz`, rows `{chosen, rejected, hash}`,
whole conversations, listed in its manifest). Each side is rendered as our chat caches are (`chat.render_chats`:
the ids `apply_chat_template` gives, a mask on the tokens wholly inside the template's `{% generation %}` blocks),
in the four fields of Levanter's `PreferenceChatProcessor`, whose metadata (the template, per side) goes in the
ledger. A cache split is named as Levanter's DPO data config reads it (`{output}/train`, `{output}/validation`):
`splits` maps cache splits to the preference data's (`{"train": "train_prefs", "validation": "test_prefs"}`).

Written by our writer as chat caches are: one ledger per split committed after each shard, so a re-run skips
committed shards and redoes the one a crash interrupted; a finished split is read, not rebuilt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.data.preference import MANIFEST
from marin_assets.pipeline.data.readers import DatasetError, iter_records
from marin_assets.pipeline.tokens import levanter_cache as lc
from marin_assets.pipeline.tokens.array_store import refuse_unsupported_array_store, s3_arrays
from marin_assets.pipeline.tokens.chat import (
    DEFAULT_CHAT_TEMPLATE,
    GENERATION_TAG,
    LevanterRows,
    chat_template_for,
    render_chats,
    write_files_resumably,
)
from marin_assets.pipeline.tokens.encoders import hf_tokenizer
from marin_assets.pipeline.tokens.tokenize import (
    CACHE_NOT_EMPTY,
    SplitStats,
    TokenizedCache,
    TokenizeStep,
    check_tokenizer,
    tokenizer_fingerprint,
    tokenizer_matches,
)
from marin_assets.pipeline.tokens.tokenizer import largest_token_id

SIDES = ("chosen", "rejected")
"""The preference data's fields, and the prefixes of the cache's (`chosen_input_ids`, …)."""
FORMAT = "levanter-preference-chat-cache-v1"

Splits = Sequence[str] | Mapping[str, str] | None
"""None: every split of the preference data, named as there; names: those; `{cache split: data split}`."""


class PreferenceRenderer(LevanterRows):
    """Levanter's `PreferenceChatProcessor` (its row fields and ledger metadata: what `train_dpo` reads) with each
    side rendered by `render_chats`, as our chat caches are. `tokenizer`: loaded from its folder (`name_or_path`)."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self._levanter = lc.preference_processor(tokenizer.name_or_path, template)
        self.tokenizer = tokenizer
        self.chat_template = template

    def __call__(self, batch: Sequence[dict]) -> list[dict]:
        sides = {side: render_chats(self.tokenizer, self.chat_template, [row[side] for row in batch])
                 for side in SIDES}
        return [{f"{side}_{key}": sides[side][i][key] for side in SIDES for key in ("input_ids", "assistant_masks")}
                for i in range(len(batch))]


def preference_exemplar(tokenizer: Any, template: str) -> dict:
    """The fields of a preference cache's rows, as Levanter's store opens them."""
    return PreferenceRenderer(tokenizer, template).output_exemplar


def _split_files(dataset_path: str, splits: Splits) -> dict[str, tuple[str, list[str]]]:
    """{cache split: (data split, its shard files)} from the preference data's manifest."""
    raw = read_bytes(join_path(dataset_path, MANIFEST))
    if raw is None:
        raise DatasetError(f"{dataset_path} is not finished preference data (no {MANIFEST}; make it with"
                           " preference_data)")
    held = json.loads(raw)["result"]["splits"]
    if splits is None:
        wanted = {s: s for s in held}
    elif isinstance(splits, str):
        raise ValueError(f"splits={splits!r} is one name: give a list ([{splits!r}]) or {{cache split: data split}}")
    elif isinstance(splits, Mapping):
        wanted = {str(k): str(v) for k, v in splits.items()}
    else:
        wanted = {s: s for s in splits}
    if not wanted:
        raise ValueError("splits= is empty: give split names, {cache split: data split}, or None for every split")
    unknown = sorted(set(wanted.values()) - set(held))
    if unknown:
        raise DatasetError(f"{dataset_path}: no preference split {', '.join(map(repr, unknown))} (it holds:"
                           f" {', '.join(held)})")
    return {cache: (data, [join_path(dataset_path, shard) for shard in held[data]["shards"]])
            for cache, data in wanted.items()}


def _render(processor: PreferenceRenderer, records: list[dict], file: str, numbers: Sequence[int]) -> list[dict]:
    """The processor's rows for a batch; a side with no assistant token, or no conversation, names its line."""
    for number, record in zip(numbers, records, strict=True):
        for side in SIDES:
            if not isinstance(record.get(side), list) or not record[side]:
                raise DatasetError(f"{file}, line {number}: {side!r} is not a conversation (is this preference data?)")
    rows = processor(records)
    for number, row in zip(numbers, rows, strict=True):
        for side in SIDES:
            if not row[f"{side}_assistant_masks"].any():
                raise DatasetError(f"{file}, line {number}: the chat template marks no assistant token in the"
                                   f" {side} conversation (is its assistant content inside {{% generation %}}?)")
    return rows


def _split_counts(arrays: Any, chunk: int = 1 << 24) -> tuple[int, int]:
    """(tokens, assistant tokens) of a split's arrays over both sides, read a chunk at a time."""
    tokens = assistant = 0
    for side in SIDES:
        size = int(arrays[f"{side}_input_ids"].data_size)
        masks = arrays[f"{side}_assistant_masks"].data
        tokens += size
        assistant += sum(int(masks[i:min(i + chunk, size)].read().result().sum()) for i in range(0, size, chunk))
    return tokens, assistant


def _longest_row(array: Any) -> int:
    """Tokens of the longest row of one of a cache's jagged arrays, from its row offsets alone (no token is read):
    Levanter's `JaggedArrayStore` keeps the row count at `offsets[0]` and row i's end at `offsets[i + 1]`."""
    rows = int(array.num_rows)
    if rows == 0:
        return 0
    ends = np.asarray(array.offsets[1:rows + 1].read().result(), dtype=np.int64)
    return int(np.diff(ends, prepend=0).max())


def longest_side(cache_dir: str, exemplar: dict) -> int:
    """Tokens of the longer side of the longest pair of a finished preference cache split: the sequence a DPO run
    needs (for records made before `SplitStats.max_tokens` was)."""
    arrays = lc.load_cache(cache_dir, exemplar).jagged_array_tree()
    return max(_longest_row(arrays[f"{side}_input_ids"]) for side in SIDES)


def tokenize_preference_files(files: Sequence[str], cache_dir: str, processor: PreferenceRenderer,
                              batch_size: int = 256) -> tuple[int, int, int]:
    """Preference shards, in order, into one preference cache, resumably (`chat.write_files_resumably`).
    Returns (pairs, tokens, assistant tokens) over both sides."""
    def rendered(file: str) -> Iterator[list[dict]]:
        for numbers, records in iter_records(file, SIDES, "jsonl", batch_size):
            yield _render(processor, records, file, numbers)

    rows, arrays = write_files_resumably(files, cache_dir, processor, rendered)
    return (rows, *_split_counts(arrays))


def preference_tokenize(output_path: str, dataset_path: str, tokenizer_path: str, splits: Splits = None,
                        chat_template: str | None = None, batch_size: int = 256) -> TokenizedCache:
    """Tokenize preference data (`preference_data`'s output) into a Levanter preference cache, each side rendered
    with `chat_template_for(tokenizer, chat_template)`. The record's documents are pairs, its tokens and
    assistant tokens those of both sides."""
    refuse_unsupported_array_store(output_path, "preference_tokenize")
    with s3_arrays([output_path]):
        chosen = _split_files(dataset_path, splits)
        fingerprint = tokenizer_fingerprint(tokenizer_path)
        check_tokenizer(output_path, tokenizer_path, fingerprint, None)
        tokenizer = hf_tokenizer(tokenizer_path)
        processor = PreferenceRenderer(tokenizer, chat_template_for(tokenizer, chat_template))
        started = time.monotonic()
        stats: dict[str, SplitStats] = {}
        assistant: dict[str, int] = {}
        for split, (data_split, files) in chosen.items():
            pairs, tokens, assistant[split] = tokenize_preference_files(files, join_path(output_path, split),
                                                                        processor, batch_size)
            if pairs == 0:
                raise DatasetError(f"preference split {data_split!r} of {dataset_path} has no pairs")
            longest = longest_side(join_path(output_path, split), processor.output_exemplar)
            stats[split] = SplitStats(pairs, tokens, len(files), max_tokens=longest)
        tokens = sum(s.tokens for s in stats.values())
        return TokenizedCache(output_path, tokenizer_path, fingerprint, largest_token_id(tokenizer) + 1, stats,
                              round(tokens / max(time.monotonic() - started, 1e-9), 1), None, "tokenizers",
                              "chat templates render through transformers' apply_chat_template", "jsonl",
                              chat_template=processor.chat_template, assistant_tokens=assistant, preference=True)


def pairs_without_answers(cache_dir: str, exemplar: dict, batch: int = 1024) -> tuple[int, int]:
    """(pairs, pairs with no assistant token on one side or both) of a finished preference cache split."""
    cache = lc.load_cache(cache_dir, exemplar)
    total = int(cache.ledger.total_num_rows)
    bad = 0
    for start in range(0, total, batch):
        for row in cache.get_batch_sync(list(range(start, min(start + batch, total)))):
            bad += not all(np.asarray(row[f"{side}_assistant_masks"]).any() for side in SIDES)
    return total, bad


def both_sides_have_answers(output_path: str, result: dict) -> CheckOutcome:
    """Every pair of every split has assistant tokens on both sides (DPO compares the two answers' log-probs)."""
    tokenizer = hf_tokenizer(result["tokenizer"])
    exemplar = preference_exemplar(tokenizer, result.get("chat_template") or DEFAULT_CHAT_TEMPLATE)
    counts = {split: pairs_without_answers(join_path(output_path, split), exemplar) for split in result["splits"]}
    bad = sorted(s for s, (_, missing) in counts.items() if missing)
    message = ", ".join(f"{s}: {missing} of {pairs} pairs lack an answer" if missing else f"{s}: {pairs} pairs"
                        for s, (pairs, missing) in counts.items())
    return CheckOutcome(bool(counts) and not bad, message,
                        {f"{s}_pairs_without_answer": missing for s, (_, missing) in counts.items()})


BOTH_SIDES = Check("both_sides_have_answers", both_sides_have_answers,
                   "Every pair has assistant tokens on both sides: the chosen and the rejected answer carry loss.")


def preference_tokenize_step(name: str, prefs: Step, tokenizer: Step, chat_template: str | None = None,
                             splits: Splits = None, cpu: float = 1) -> TokenizeStep:
    """A Levanter preference cache of `prefs` (a `preference_data_step`), tokenized with `tokenizer`'s folder and
    `chat_template` — None: the tokenizer's own, else `DEFAULT_CHAT_TEMPLATE`, whose text then enters identity.
    `splits`: None (as the data names them), names, or `{cache split: data split}` (DPO reads `train` and
    `validation`).

    Identity: `splits`, `chat_template` or the default's text (and `prefs`, `tokenizer`); not `cpu`.
    """
    if chat_template is not None and not GENERATION_TAG.search(chat_template):
        raise StepDefinitionError(f"preference tokenize step {name!r}: the chat template has no {{% generation %}}"
                                  " block, so the assistant's tokens cannot be told from the rest")
    if isinstance(splits, str) or (splits is not None and not splits):
        raise StepDefinitionError(f"preference tokenize step {name!r}: splits must be None, a list of names or"
                                  f" {{cache split: data split}}, got {splits!r}")
    chosen: list[str] | dict[str, str] | None = (
        None if splits is None else {str(k): str(v) for k, v in splits.items()} if isinstance(splits, Mapping)
        else [str(s) for s in splits])
    hash_attrs: dict[str, Any] = {
        "splits": chosen if chosen is not None else "from-data", "chat_template": chat_template,
        "default_chat_template": DEFAULT_CHAT_TEMPLATE if chat_template is None else None, "format": FORMAT}
    return TokenizeStep(
        name=name,
        fn=lambda out: preference_tokenize(out, prefs.output_path, tokenizer.output_path, chosen, chat_template),
        deps=[prefs, tokenizer],
        hash_attrs=hash_attrs,
        resources=Resources(cpu=cpu),
        kind="tokenize",
        description=made_by(preference_tokenize),
        kinds=["levanter"],
        checks=[CACHE_NOT_EMPTY, tokenizer_matches(tokenizer), BOTH_SIDES],
        tokenizer=tokenizer,
        chat=False,  # not an SFT chat cache: its rows are pairs, which only DPO reads
        preference=True,
    )


__all__ = ["BOTH_SIDES", "FORMAT", "PreferenceRenderer", "longest_side", "pairs_without_answers",
           "preference_exemplar", "preference_tokenize", "preference_tokenize_step", "tokenize_preference_files"]
