"""Chat data → a Levanter chat cache: conversations rendered with a chat template, loss on assistant turns only.

Conversations come in OpenAI form (`{"messages": [{"role", "content"}]}`) or ShareGPT form
(`{"conversations": [{"from", "value"}]}`), from JSON lines or parquet (`readers.iter_records`), in the
splits `find_splits` reads from the layout, as tokenize does. Each is checked (known roles, text in every
turn, at least one assistant turn) — a bad one is an error naming the file and its line or row — and then
rendered with the template and tokenized as `apply_chat_template` does (the same ids), with a mask that is 1
on exactly the tokens every character of which lies inside the template's `{% generation %}` blocks
(`render_chats`: masks from character spans, so no token carrying loss holds template text, whatever the
tokenizer; Levanter's `ChatProcessor`, built as `ChatLmDatasetFormat` builds it, keeps its checks and ledger
metadata).

The cache holds those two arrays per conversation, with Levanter's ledger recording the template: the
layout `ChatLmDatasetFormat` reads. `training.levanter_data.data_config` therefore reads every such cache as
chat — Levanter's `ChatDataset`, whose loss weights come from the mask — in training and evaluation alike.
Without a tokenizer template of its own, `DEFAULT_CHAT_TEMPLATE` renders, and its text is identity.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.paths import join_path
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.data.messages import checked_turns, json_kind
from marin_assets.pipeline.data.readers import DatasetError, format_of, iter_records
from marin_assets.pipeline.data.text_files import expand_files
from marin_assets.pipeline.tokens import levanter_cache as lc
from marin_assets.pipeline.tokens.array_store import refuse_unsupported_array_store, s3_arrays
from marin_assets.pipeline.tokens.encoders import hf_tokenizer
from marin_assets.pipeline.tokens.tokenize import (
    CACHE_NOT_EMPTY,
    SplitStats,
    TokenizedCache,
    TokenizeStep,
    check_tokenizer,
    splits_identity,
    splits_to_read,
    tokenizer_fingerprint,
    tokenizer_matches,
)
from marin_assets.pipeline.tokens.tokenizer import largest_token_id

MESSAGES_FIELD = "messages"
"""OpenAI form: a list of `{"role": "system"|"user"|"assistant", "content": str}`; also the cache's field."""
SHAREGPT_FIELD = "conversations"
"""ShareGPT form: a list of `{"from": "system"|"human"|"gpt", "value": str}`."""
OPENAI_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
FORMS = {MESSAGES_FIELD: ("role", "content", OPENAI_ROLES), SHAREGPT_FIELD: ("from", "value", SHAREGPT_ROLES)}
"""A conversation's field → its turns' role key, text key, and roles (as OpenAI names them)."""
CHAT_FORMATS = ("auto", "jsonl", "parquet")
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%}")
"""What transformers (and Levanter's `ChatProcessor`) look for to mark assistant tokens."""

DEFAULT_CHAT_TEMPLATE = (
    "{{- bos_token or '' -}}"
    "{%- for message in messages -%}"
    "{%- if not loop.first -%}{{ '\\n' }}{%- endif -%}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{ message['content'] | trim }}{{ eos_token }}{% endgeneration %}"
    "{%- else -%}"
    "{{ message['content'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{%- if messages -%}{{ '\\n' }}{%- endif -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)
"""`<|role|>` headers on their own line, the text trimmed; an assistant turn's text and EOS (so the model learns
to stop) are its generation block, and nothing else of the turn is. Plain text headers need no new tokens, and a
turn's end is EOS or the newline before the next header, so rendering a prefix tokenizes as the whole does."""


def conversation_turns(record: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    """A record's conversation (OpenAI or ShareGPT form) as OpenAI messages, checked: a list of turns, each with a
    known role and non-blank text. `where`: `file, line N`."""
    field = next((f for f in FORMS if record.get(f) is not None), None)
    if field is None:
        fields = ", ".join(repr(k) for k in list(record)[:12]) or "none"
        raise DatasetError(f"{where}: no {MESSAGES_FIELD!r} (OpenAI) or {SHAREGPT_FIELD!r} (ShareGPT) conversation"
                           f" (fields: {fields})")
    turns = record[field]
    role_key, text_key, roles = FORMS[field]
    if type(turns) is not list:
        raise DatasetError(f"{where}: {field!r} is {json_kind(turns)}, not a list of turns")
    return checked_turns(turns, where, "turn", role_key, text_key, roles)


def conversation_messages(record: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    """A record's conversation as checked OpenAI messages (`conversation_turns`), at least one by the assistant (SFT
    learns from nothing else). `where`: `file, line N`."""
    messages = conversation_turns(record, where)
    if not any(m["role"] == "assistant" for m in messages):
        field = next(f for f in FORMS if record.get(f) is not None)
        turns, role_key = record[field], FORMS[field][0]
        said = f"roles: {', '.join(dict.fromkeys(str(t[role_key]) for t in turns))}" if turns else "no turns"
        raise DatasetError(f"{where}: no assistant turn ({said}); SFT learns only from assistant turns")
    return messages


def iter_conversations(file: str, text_format: str = "auto",
                       batch_size: int = 256) -> Iterator[tuple[Sequence[int], list[list[dict[str, str]]]]]:
    """(line or row numbers, checked conversations as OpenAI messages) of a JSON lines or parquet file."""
    unit = "row" if format_of(file, text_format) == "parquet" else "line"
    for numbers, records in iter_records(file, tuple(FORMS), text_format, batch_size):
        yield numbers, [conversation_messages(r, f"{file}, {unit} {n}") for n, r in zip(numbers, records, strict=True)]


class ChatTemplateError(ValueError):
    """No chat template that marks the assistant's tokens (`{% generation %}`) can be used."""


def chat_template_for(tokenizer: Any, chat_template: str | None = None) -> str:
    """The template conversations are rendered with: `chat_template`, else the tokenizer's own, else
    `DEFAULT_CHAT_TEMPLATE`. It must mark the assistant's tokens with `{% generation %}` blocks."""
    own = getattr(tokenizer, "chat_template", None)
    template = chat_template or own or DEFAULT_CHAT_TEMPLATE
    if not isinstance(template, str):  # a tokenizer with several named templates
        raise ChatTemplateError(f"the tokenizer has named chat templates {sorted(template)}; pass chat_template=")
    if not GENERATION_TAG.search(template):
        whose = "the given chat template" if chat_template else "the tokenizer's own chat template"
        raise ChatTemplateError(f"{whose} has no {{% generation %}} block, so the assistant's tokens cannot be told"
                                " from the rest; wrap each assistant turn's content in {% generation %}…"
                                "{% endgeneration %}, or pass chat_template=DEFAULT_CHAT_TEMPLATE")
    if template == DEFAULT_CHAT_TEMPLATE and tokenizer.eos_token is None:
        raise ChatTemplateError("the tokenizer has no EOS token, which the default chat template ends each assistant"
                                " turn with (for the model to learn to stop); pass a chat_template=")
    return template


def _cache_metadata(cache_dir: str) -> dict[str, Any]:
    """The processor metadata Levanter's ledger of a cache's `train` or `validation` split records ({}: none)."""
    for split in ("train", "validation"):
        ledger = lc.load_ledger(join_path(cache_dir, split))
        if ledger is not None:
            return dict(ledger.metadata.preprocessor_metadata or {})
    return {}


def is_preference_metadata(metadata: Mapping[str, Any]) -> bool:
    """Whether a ledger's processor metadata is that of Levanter's `PreferenceChatProcessor` (a `ChatProcessor`'s per
    side, under `chosen` and `rejected`): the rows are preference pairs."""
    return all(isinstance(metadata.get(side), Mapping) for side in ("chosen", "rejected"))


def is_preference_cache(cache_dir: str) -> bool:
    """Whether a cache holds preference pairs (`tokens/preference_cache.py`), from its ledger: only DPO reads it."""
    return is_preference_metadata(_cache_metadata(cache_dir))


def chat_template_of_cache(cache_dir: str) -> str | None:
    """The template a cache's conversations were rendered with (from Levanter's ledger of its `train` or
    `validation` split; of a preference cache, its sides'), or None for a text cache: how a reader of the cache
    tells the format (`is_preference_cache` tells a preference cache from a chat cache)."""
    metadata = _cache_metadata(cache_dir)
    if is_preference_metadata(metadata):
        return metadata["chosen"].get("chat_template")
    return metadata.get("chat_template")


def span_masks(offsets: Any, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """1 on the tokens whose characters (`offsets`: (start, end) per token) all lie inside one of the assistant's
    character `spans` (a zero-width token: its position does), else 0."""
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    start, end = bounds[:, 0], bounds[:, 1]
    inside = np.zeros(len(bounds), dtype=bool)
    for first, stop in spans:
        inside |= (start >= first) & (end <= stop) & (start < stop)
    return inside.astype(np.int32)


def render_chats(tokenizer: Any, template: str, conversations: Sequence[list[dict[str, str]]]) -> list[dict]:
    """Each conversation rendered with `template` and tokenized as `apply_chat_template` does (the same ids), with
    its assistant mask from character spans: a token carries loss only if every character it covers is inside the
    template's `{% generation %}` block. (transformers marks every token from the one holding a block's first
    character, so a SentencePiece token fusing the header's newline with the answer's first word — `▁The` for
    `\nThe` — would train the model on the template's newline; byte-level BPEs split there, so for them the two
    rules agree. A token fused across the boundary thus carries no loss: a template whose header ends on a token
    boundary keeps the answer's first word.)"""
    from transformers.utils.chat_template_utils import render_jinja_template

    made: Any = render_jinja_template(conversations=list(conversations), chat_template=template,
                                      return_assistant_tokens_mask=True, **tokenizer.special_tokens_map)
    rendered, spans = made  # (texts, each text's assistant character spans)
    encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    return [{"input_ids": np.asarray(ids, dtype=np.int32), "assistant_masks": span_masks(offsets, chat_spans)}
            for ids, offsets, chat_spans in zip(encoded["input_ids"], encoded["offset_mapping"], spans, strict=True)]


class LevanterRows:
    """A processor whose rows we render but whose row fields (`output_exemplar`) and ledger metadata are those of
    the Levanter processor in `_levanter`: what Levanter's dataset format compares when it reads the cache."""

    _levanter: Any

    @property
    def output_exemplar(self) -> dict:
        return self._levanter.output_exemplar

    @property
    def metadata(self) -> dict[str, Any]:
        return self._levanter.metadata


class ChatRenderer(LevanterRows):
    """Levanter's `ChatProcessor` (its checks, row fields and ledger metadata: what `ChatLmDatasetFormat` reads)
    with `render_chats`' assistant masks in place of its own. `tokenizer`: a transformers tokenizer loaded by
    `load_hf_tokenizer`, whose `name_or_path` is its folder (Levanter's processor loads that folder too)."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self._levanter = lc.chat_processor(tokenizer.name_or_path, template, MESSAGES_FIELD)
        self.tokenizer = tokenizer
        self.chat_template: str = self._levanter.chat_template

    def __call__(self, batch: Sequence[dict]) -> list[dict]:
        rows = render_chats(self.tokenizer, self.chat_template, [row[MESSAGES_FIELD] for row in batch])
        for row, given in zip(rows, batch, strict=True):
            if not row["assistant_masks"].any():  # ChatProcessor's words, which `_render` looks for
                raise ValueError(f"Chat did not contain an assistant message for sequence {given}")
        return rows


def _chat_processor(tokenizer: Any, template: str) -> ChatRenderer:
    """The processor for chat: it renders, tokenizes and masks, and its metadata goes in the ledger."""
    return ChatRenderer(tokenizer, template)


def chat_exemplar(tokenizer: Any, template: str) -> dict:
    """The fields of a chat cache's rows (ids and assistant masks), as Levanter's store opens them."""
    return _chat_processor(tokenizer, template).output_exemplar


def assistant_token_counts(cache_dir: str, splits: Sequence[str], exemplar: dict) -> dict[str, int]:
    """Tokens that carry loss (assistant-mask ones) in each split of a finished chat cache (either layout)."""
    return {split: _split_counts(lc.load_cache(join_path(cache_dir, split), exemplar).jagged_array_tree())[1]
            for split in splits}


def _render(processor: Any, conversations: list[list[dict[str, str]]], file: str, numbers: Sequence[int],
            unit: str) -> list[dict]:
    """The processor's rows for a batch; a conversation it masks nothing of names its line."""
    rows = [{MESSAGES_FIELD: c} for c in conversations]
    try:
        return list(processor(rows))
    except ValueError as e:
        if "did not contain an assistant message" not in str(e):  # ChatRenderer's words (with the whole chat)
            raise
        for number, row in zip(numbers, rows, strict=True):
            try:
                processor([row])
            except ValueError:
                raise DatasetError(f"{file}, {unit} {number}: the chat template marks no assistant token in this"
                                   " conversation (is its assistant content inside {% generation %}, and is some"
                                   " token wholly inside it?)") from None
        raise


def _split_counts(arrays: Any, chunk: int = 1 << 24) -> tuple[int, int]:
    """(tokens, assistant tokens) of a split's arrays (a store's `tree`, or a cache's `jagged_array_tree()`),
    its masks read a chunk at a time."""
    size = int(arrays["input_ids"].data_size)
    masks = arrays["assistant_masks"].data
    return size, sum(int(masks[i:min(i + chunk, size)].read().result().sum()) for i in range(0, size, chunk))


def write_files_resumably(files: Sequence[str], cache_dir: str, processor: Any,
                          rendered: Callable[[str], Iterator[list[dict]]]) -> tuple[int, Any]:
    """Files, in order, into one cache whose ledger commits after each file (`rendered(file)` yields its rows,
    in batches); a re-run skips committed files and redoes the one a crash interrupted. Returns the cache's
    rows and its arrays (for the caller's counts). Chat caches and preference caches are written by it."""
    metadata = lc.cache_metadata(processor)
    exemplar = processor.output_exemplar
    ledger = lc.load_ledger(cache_dir)
    if ledger is not None and ledger.is_finished:
        return ledger.total_num_rows, lc.load_cache(cache_dir, exemplar).jagged_array_tree()
    if ledger is None:
        ledger = lc.new_ledger(0, {}, [], False, metadata)
        lc.commit_ledger(cache_dir, ledger)
    store = lc.open_store(exemplar, cache_dir, mode="a", sole_writer=True)
    lc.drop_rows_after(store, ledger.total_num_rows)  # crashed inside a file: drop its rows, read it again
    rows, shard_rows, finished = ledger.total_num_rows, dict(ledger.shard_rows), list(ledger.finished_shards)
    for index, file in enumerate(files):
        shard = f"{index:05d}-{file.rstrip('/').rsplit('/', 1)[-1]}".replace(".", "_")
        if shard in finished:
            continue
        written = 0
        for batch in rendered(file):
            store.extend(batch)
            written += len(batch)
        rows += written
        shard_rows[shard] = written
        finished.append(shard)
        lc.commit_ledger(cache_dir, lc.new_ledger(rows, shard_rows, finished, False, metadata, lc.data_sizes(store)))
    lc.commit_ledger(cache_dir, lc.new_ledger(rows, shard_rows, finished, True, metadata, lc.data_sizes(store)))
    return rows, store.tree


def tokenize_chat_files(files: Sequence[str], cache_dir: str, processor: Any, text_format: str = "auto",
                        batch_size: int = 256) -> tuple[int, int, int]:
    """Conversation files, in order, into one chat cache, resumably (`write_files_resumably`). Returns
    (conversations, tokens, assistant tokens)."""
    def rendered(file: str) -> Iterator[list[dict]]:
        unit = "row" if format_of(file, text_format) == "parquet" else "line"
        for numbers, conversations in iter_conversations(file, text_format, batch_size):
            yield _render(processor, conversations, file, numbers, unit)

    rows, arrays = write_files_resumably(files, cache_dir, processor, rendered)
    return (rows, *_split_counts(arrays))


def chat_tokenize(output_path: str, dataset_path: str, tokenizer_path: str,
                  splits: dict[str, list[str]] | None = None, chat_template: str | None = None,
                  text_format: str = "auto", batch_size: int = 256, config: str | None = None) -> TokenizedCache:
    """Tokenize a conversation dataset's splits (`{split: [glob, …]}`; None: found from its layout, in the
    config folder `config` when it has several) into a Levanter chat cache — ids and assistant masks —
    rendered with `chat_template_for(tokenizer, chat_template)`."""
    refuse_unsupported_array_store(output_path, "chat_tokenize")
    with s3_arrays([output_path]):
        if text_format not in CHAT_FORMATS:
            raise ValueError(f"text_format {text_format!r} is not one of {', '.join(CHAT_FORMATS)}")
        chosen = splits_to_read(dataset_path, splits, config)
        fingerprint = tokenizer_fingerprint(tokenizer_path)
        check_tokenizer(output_path, tokenizer_path, fingerprint, None)
        tokenizer = hf_tokenizer(tokenizer_path)
        processor = _chat_processor(tokenizer, chat_template_for(tokenizer, chat_template))
        started = time.monotonic()
        stats: dict[str, SplitStats] = {}
        assistant: dict[str, int] = {}
        for split, patterns in chosen.items():
            files = expand_files(dataset_path, patterns)
            conversations, tokens, assistant[split] = tokenize_chat_files(
                files, join_path(output_path, split), processor, text_format, batch_size)
            if conversations == 0:
                raise DatasetError(f"split {split!r} of {dataset_path} has no conversations ({len(files)} files)")
            stats[split] = SplitStats(conversations, tokens, len(files))
        tokens = sum(s.tokens for s in stats.values())
        return TokenizedCache(output_path, tokenizer_path, fingerprint, largest_token_id(tokenizer) + 1, stats,
                              round(tokens / max(time.monotonic() - started, 1e-9), 1), None, "tokenizers",
                              "chat templates render through transformers' apply_chat_template", text_format,
                              chat_template=processor.chat_template, assistant_tokens=assistant)


def assistant_tokens_carry_loss(output_path: str, result: dict) -> CheckOutcome:
    """Every split has assistant tokens, and fewer than all its tokens (a template that masks all or nothing
    would train on the prompts too, or on nothing)."""
    shares = {s: (result.get("assistant_tokens") or {}).get(s, 0) / max(st["tokens"], 1)
              for s, st in result["splits"].items()}
    bad = sorted(s for s, share in shares.items() if not 0 < share < 1)
    message = ", ".join(f"{s}: {share:.1%} of tokens carry loss" for s, share in shares.items())
    return CheckOutcome(bool(shares) and not bad, message + (f" (bad: {', '.join(bad)})" if bad else ""),
                        {f"{s}_assistant_share": share for s, share in shares.items()})


ASSISTANT_TOKENS = Check("assistant_tokens_carry_loss", assistant_tokens_carry_loss,
                         "Each split's loss falls on its assistant tokens: some, and not all, of its tokens.")


def chat_tokenize_step(name: str, dataset: Step, tokenizer: Step, chat_template: str | None = None,
                       splits: dict[str, list[str]] | None = None, text_format: str = "auto",
                       cpu: float = 1, config: str | None = None) -> TokenizeStep:
    """A Levanter chat cache of `dataset`'s conversations (OpenAI or ShareGPT; splits found from its layout
    — in its config folder `config`, for a dataset with several — unless given), tokenized with `tokenizer`'s
    folder and `chat_template` — None: the tokenizer's own, else `DEFAULT_CHAT_TEMPLATE`, whose text then
    enters identity (as `config` does when given). A training step reads it as chat.

    Identity: `splits`, `config` (when given), `text_format`, `chat_template` or the default's text (and `dataset`,
    `tokenizer`); not `cpu`.
    """
    if chat_template is not None and not GENERATION_TAG.search(chat_template):
        raise StepDefinitionError(f"chat tokenize step {name!r}: the chat template has no {{% generation %}} block,"
                                  " so the assistant's tokens cannot be told from the rest")
    if text_format not in CHAT_FORMATS:
        raise StepDefinitionError(f"chat tokenize step {name!r}: text_format must be one of {CHAT_FORMATS},"
                                  f" got {text_format!r}")
    chosen, hash_attrs = splits_identity(f"chat tokenize step {name!r}", splits, config)
    hash_attrs.update({"text_format": text_format, "chat_template": chat_template,
                       "default_chat_template": DEFAULT_CHAT_TEMPLATE if chat_template is None else None,
                       "format": "levanter-chat-cache-v1"})
    return TokenizeStep(
        name=name,
        fn=lambda out: chat_tokenize(out, dataset.output_path, tokenizer.output_path, chosen, chat_template,
                                     text_format, config=config),
        deps=[dataset, tokenizer],
        hash_attrs=hash_attrs,
        resources=Resources(cpu=cpu),
        kind="tokenize",
        description=made_by(chat_tokenize),
        kinds=["levanter"],
        checks=[CACHE_NOT_EMPTY, tokenizer_matches(tokenizer), ASSISTANT_TOKENS],
        tokenizer=tokenizer,
        chat=True,
    )
