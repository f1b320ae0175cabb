"""Tokenizers: train a byte-level BPE on a raw dataset, or adopt an existing one.

Either way the output is a Hugging Face tokenizer folder (`AutoTokenizer.from_pretrained`
and Levanter's `levanter.tokenizers.load_tokenizer` read it offline), so downstream steps depend on a
content-addressed copy rather than on whatever a hub name means today.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from marin_assets.core.record_types import record_type
from marin_assets.core.step import Resources, Step, made_by
from marin_assets.pipeline.data.text_files import (
    DatasetError,
    expand_files,
    iter_documents,
    local_copy_of,
    local_dir_for,
)

EOS = "<|endoftext|>"
BYTE_ALPHABET = 256


class TokenizerError(ValueError):
    """A tokenizer cannot be trained or loaded."""


@record_type("tokenizer_info")
@dataclass(frozen=True)
class TokenizerInfo:
    """A tokenizer folder: where it is, its vocabulary, EOS token and where it came from."""

    path: str
    vocab_size: int
    """Largest token id + 1 (what a model's embedding must cover)."""
    eos_token: str
    source: str
    """`trained on <dataset>` or the adopted name/path."""
    documents: int = 0
    bos_token: str | None = None
    tokens: int = 0
    """How many tokens it has (`len(tokenizer)`); fewer than `vocab_size` when its ids have gaps."""


def train_tokenizer(output_path: str, dataset_path: str, vocab_size: int, files: Sequence[str] = ("train/*",),
                    special_tokens: Sequence[str] = (EOS,), text_field: str = "text",
                    max_documents: int | None = None, text_format: str = "auto") -> TokenizerInfo:
    """Train a byte-level BPE tokenizer on a raw dataset and save it as a Hugging Face tokenizer."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    special_tokens = list(special_tokens) or [EOS]
    minimum = BYTE_ALPHABET + len(special_tokens) + 1
    if vocab_size < minimum:
        raise TokenizerError(f"vocab_size {vocab_size} is too small: a byte-level BPE needs at least {minimum}"
                             f" (256 bytes + {len(special_tokens)} special tokens + 1 merge)")
    counted = {"documents": 0}

    def texts():
        for _, _, text in iter_documents(expand_files(dataset_path, files), text_field, text_format):
            counted["documents"] += 1
            yield text
            if max_documents and counted["documents"] >= max_documents:
                return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    if counted["documents"] == 0:
        raise DatasetError(f"no documents in {dataset_path} matching {list(files)}")
    eos = special_tokens[0]
    # EOS on both ends of every document, by the tokenizer itself: Levanter then adds nothing
    # (otherwise it builds "eos text eos" strings, and byte-level BPE adds two space tokens).
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{eos} $A {eos}", special_tokens=[(eos, tokenizer.token_to_id(eos))]),
    ])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=eos, eos_token=eos, unk_token=eos,
                                   model_input_names=["input_ids", "attention_mask"])
    with local_dir_for(output_path) as local:
        fast.save_pretrained(local)
    return TokenizerInfo(output_path, len(fast), eos, f"trained on {dataset_path}", counted["documents"],
                         bos_token=eos, tokens=len(fast))


def adopt_tokenizer(output_path: str, name_or_path: str, revision: str | None = None) -> TokenizerInfo:
    """Copy an existing tokenizer (a local folder, or a hub name in the local HF cache) into the output."""
    from transformers import AutoTokenizer

    with local_copy_of(name_or_path) if "://" in name_or_path else contextlib.nullcontext(name_or_path) as source:
        try:
            _require_tokenizer_files(source, name_or_path)
            # A language model reads only input ids: tokenizers that also return token_type_ids (BERT-style
            # defaults) would make Levanter expect a second array in every cache.
            tokenizer = AutoTokenizer.from_pretrained(source, revision=revision,
                                                      model_input_names=["input_ids", "attention_mask"])
        except TokenizerError:
            raise
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise TokenizerError(f"tokenizer {name_or_path!r} does not load: {_brief(e)}") from None
        if getattr(tokenizer, "backend_tokenizer", None) is None:
            raise TokenizerError(f"tokenizer {name_or_path!r} loads only as a slow (Python) tokenizer; tokenizing"
                                 " needs its fast form (a tokenizer.json): convert it with transformers and adopt"
                                 " that folder")
        with local_dir_for(output_path) as local:
            tokenizer.save_pretrained(local)
            for name in openai_rank_files(source):  # what gigatoken loads an OpenAI encoding from
                shutil.copyfile(os.path.join(source, name), os.path.join(local, name))
    return TokenizerInfo(output_path, largest_token_id(tokenizer) + 1, tokenizer.eos_token or "", name_or_path,
                         bos_token=tokenizer.bos_token, tokens=len(tokenizer))


OPENAI_ENCODINGS = ("cl100k_base", "o200k_base", "r50k_base")
"""OpenAI encodings whose `.tiktoken` rank files an adopted tokenizer keeps beside its `tokenizer.json`: gigatoken
loads them by name (their split regex and special tokens are known from it; the ones its loader names)."""


def openai_rank_files(folder: str) -> list[str]:
    """The OpenAI encodings' rank files (`cl100k_base.tiktoken`, …) in a local folder (none for a hub name)."""
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in os.listdir(folder) if n.removesuffix(".tiktoken") in OPENAI_ENCODINGS
                  and n.endswith(".tiktoken"))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "tekken.json")
"""Files transformers builds a tokenizer from (and `*.tiktoken` ranks): a folder with none holds no tokenizer."""


def _require_tokenizer_files(folder: str, name_or_path: str) -> None:
    """A local folder holding none of `TOKENIZER_FILES` is refused by name (transformers fails on it with an
    AttributeError about a missing vocabulary file); anything else — a hub name — is transformers' to load."""
    if not os.path.isdir(folder):
        return
    names = sorted(os.listdir(folder))
    if not any(n in TOKENIZER_FILES or n.endswith(".tiktoken") for n in names):
        shown = ", ".join(names[:10]) + (f", … ({len(names)} in all)" if len(names) > 10 else "")
        raise TokenizerError(f"tokenizer {name_or_path!r} does not load: the folder holds no tokenizer files"
                             f" ({', '.join(TOKENIZER_FILES[:3])}, …; it contains: {shown or 'nothing'})")


def load_hf_tokenizer(path: str):
    """The tokenizer saved at `path` (local or remote), as a transformers fast tokenizer whose `name_or_path` is
    `path` (not the temporary copy a remote one loads from): where Levanter loads it from too."""
    from transformers import AutoTokenizer

    with local_copy_of(path) as local:
        _require_tokenizer_files(local, path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(local)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise TokenizerError(f"tokenizer at {path} does not load: {_brief(e)}") from None
    tokenizer.name_or_path = path
    return tokenizer


def largest_token_id(tokenizer) -> int:
    """The largest id any token of a transformers tokenizer has, added and special tokens included.

    Real tokenizers are not contiguous (cl100k has no id 100256; Llama-3 reserves ranges), so this,
    not `len(tokenizer)`, is what a model's embedding must cover.
    """
    ids = list(tokenizer.get_vocab().values()) + list(getattr(tokenizer, "added_tokens_decoder", {}))
    return max(ids)


def model_vocab_size(tokenizer_path: str, multiple: int = 1) -> int:
    """The vocabulary a model trained on `tokenizer_path`'s ids needs: largest id + 1, rounded up to `multiple`."""
    size = largest_token_id(load_hf_tokenizer(tokenizer_path)) + 1
    return -(-size // multiple) * multiple


def _brief(error: Exception, limit: int = 200) -> str:
    """The first line of an error, cut short: transformers lists every model type it knows. A KeyError says
    only the key (transformers 5 reads a malformed tokenizer.json until a key is missing)."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, KeyError):
        text = f"its files lack the key {text}"
    return text if len(text) <= limit else text[:limit] + "…"


def bpe_tokenizer_step(name: str, dataset: Step, vocab_size: int, files: Sequence[str] = ("train/*",),
                       special_tokens: Sequence[str] = (EOS,), max_documents: int | None = None,
                       text_field: str = "text", text_format: str = "auto") -> Step:
    """A byte-level BPE tokenizer trained on a dataset step's files.

    Identity: `vocab_size`, `files`, `special_tokens`, `max_documents`, `text_field`, `text_format` (and `dataset`).
    """
    return Step(
        name=name,
        fn=lambda out: train_tokenizer(out, dataset.output_path, vocab_size, files, special_tokens, text_field,
                                       max_documents=max_documents, text_format=text_format),
        deps=[dataset],
        hash_attrs={"vocab_size": vocab_size, "files": list(files), "special_tokens": list(special_tokens),
                    "max_documents": max_documents, "kind": "byte-level-bpe", "text_field": text_field,
                    "text_format": text_format},
        resources=Resources(cpu=1),
        kind="tokenizer",
        description=made_by(train_tokenizer),
        kinds=["huggingface"],
    )


def existing_tokenizer_step(name: str, name_or_path: str, revision: str | None = None) -> Step:
    """A content-addressed copy of an existing tokenizer (a Hugging Face folder or hub name).

    Identity: `name_or_path`, `revision`.
    """
    return Step(
        name=name,
        fn=lambda out: adopt_tokenizer(out, name_or_path, revision),
        hash_attrs={"name_or_path": name_or_path, "revision": revision},
        kind="tokenizer",
        description=made_by(adopt_tokenizer),
        kinds=["huggingface"],
    )
