"""The data a Levanter run reads: a mixture of our caches (constant or staged weights, token budgets),
each read in its own format (text, or chat with assistant masks). Levanter is imported inside functions.

Levanter reads the caches our tokenize step made and never builds one: each component names its cache
folder and a source with no files, so a split the cache lacks is skipped rather than built.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from marin_assets.pipeline.training.levanter_model import model_vocab_view
from marin_assets.pipeline.training.specs import MIXTURE_BLOCK_SIZE


@functools.cache
def _mixture_class():
    from levanter.data.text.datasets import LmDataConfig

    return _with_model_vocab(LmDataConfig)


@functools.cache
def _preference_class():
    from levanter.data.text.preference import PreferenceLmDataConfig

    return _with_model_vocab(PreferenceLmDataConfig)


def _with_model_vocab(base: type) -> type:
    """`base` (one of Levanter's data configs) whose tokenizer is a `model_vocab_view` for the model's vocabulary."""
    from levanter.tokenizers import load_tokenizer

    @dataclass(frozen=True)
    class ModelVocabDataConfig(base):
        """Levanter's data config whose tokenizer is a `model_vocab_view` for the model's vocabulary."""

        model_vocab_size: int | None = None
        """Rows of the model's embedding; None: `len(tokenizer)`, as Levanter has it."""

        @cached_property
        def the_tokenizer(self):
            tokenizer = load_tokenizer(self.tokenizer)
            return tokenizer if self.model_vocab_size is None else model_vocab_view(tokenizer, self.model_vocab_size)

    return ModelVocabDataConfig


def data_config(tokenizer: str, caches: dict[str, str],
                weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
                vocab_size: int | None = None, max_train_batches: Mapping[str, int] | None = None,
                block_size: int = MIXTURE_BLOCK_SIZE):
    """A mixture over finished caches (`{cache}/{train,validation}`); weight 0 → validation only.

    `weights`: constant, or staged as (start step, weights) pairs (Levanter's `train_weights`);
    `vocab_size`: the model's vocabulary (Levanter then sees a `model_vocab_view` of the tokenizer);
    `max_train_batches`: component → train on only its first that many batches' worth of sequences;
    `block_size`: the mixing block in sequences; stage starts (step × batch size) must fall on one.
    A chat cache (`pipeline/tokens/chat.py`) is read in Levanter's chat format, whatever reads it: loss only on
    its assistant tokens, in training and in evaluation alike. Sequences are read in the caches' order
    (`shuffle=False`, Levanter's default is a block shuffle): a token budget is a component's first tokens.
    """
    from levanter.data.text.datasets import DatasetComponent, UrlDatasetSourceConfig

    train_weights: dict[str, float] | list[tuple[int, dict[str, float]]]
    if isinstance(weights, Mapping):
        train_weights = dict(weights)
    else:
        stages = [(int(start), dict(w)) for start, w in weights]
        train_weights = stages[0][1] if len(stages) == 1 else stages
    components = {k: DatasetComponent(source=UrlDatasetSourceConfig(), cache_dir=path, format=cache_format(path))
                  for k, path in caches.items()}
    return _mixture_class()(tokenizer=tokenizer, cache_dir=None, components=components, auto_build_caches=False,
                            shuffle=False, train_weights=train_weights, model_vocab_size=vocab_size,
                            max_train_batches=dict(max_train_batches) if max_train_batches else None,
                            mixture_block_size=block_size)


class PreferenceCacheError(ValueError):
    """A preference cache was given where language-model data is read (training, SFT, loss evaluation)."""


def cache_format(cache_dir: str):
    """Levanter's format for a finished cache: `ChatLmDatasetFormat` (packed conversations, loss on the tokens
    its assistant masks mark) when its ledger records a chat template, else text. A preference cache is refused
    (`PreferenceCacheError`): its rows are pairs, which only DPO reads (`preference_data_config`)."""
    from levanter.data.text.formats import ChatLmDatasetFormat, TextLmDatasetFormat

    from marin_assets.pipeline.tokens.chat import MESSAGES_FIELD, chat_template_of_cache, is_preference_cache

    if is_preference_cache(cache_dir):
        raise PreferenceCacheError(f"{cache_dir} is a preference cache (chosen/rejected pairs): only DPO reads it"
                                   " (dpo_step); language-model training and evaluation read text or chat caches")
    template = chat_template_of_cache(cache_dir)
    if template is None:
        return TextLmDatasetFormat()
    return ChatLmDatasetFormat(messages_field=MESSAGES_FIELD, chat_template=template, pack=True,
                               mask_user_turns=True)


PREFERENCE_COMPONENT = "prefs"
"""The one component of a DPO run's data config (Levanter's DPO reads a single preference component)."""


def preference_data_config(tokenizer: str, cache_dir: str, vocab_size: int | None = None):
    """Levanter's DPO data config (`PreferenceLmDataConfig`) over one finished preference cache
    (`{cache}/{train,validation}`), read in Levanter's preference chat format (unpacked pairs; a side longer than
    the sequence is an error, never cut) with the template its ledger records. `vocab_size`: the model's
    vocabulary (Levanter then sees a `model_vocab_view` of the tokenizer), as `data_config` does."""
    from levanter.data.text.datasets import DatasetComponent, UrlDatasetSourceConfig
    from levanter.data.text.preference import PreferenceChatLmDatasetFormat

    from marin_assets.pipeline.tokens.chat import chat_template_of_cache, is_preference_cache

    if not is_preference_cache(cache_dir):
        raise PreferenceCacheError(f"{cache_dir} is not a preference cache (made by preference_tokenize_step): DPO"
                                   " reads chosen/rejected pairs")
    format = PreferenceChatLmDatasetFormat(chat_template=chat_template_of_cache(cache_dir))
    component = DatasetComponent(source=UrlDatasetSourceConfig(), cache_dir=cache_dir, format=format)
    return _preference_class()(tokenizer=tokenizer, cache_dir=None, components={PREFERENCE_COMPONENT: component},
                               auto_build_caches=False, shuffle=False, model_vocab_size=vocab_size)
