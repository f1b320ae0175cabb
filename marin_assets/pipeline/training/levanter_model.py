"""Our `ModelSpec` / `OptimizerSpec` → Levanter's model and optimizer configs, offline.

Imported only inside step functions (on Ray workers): defining experiments never imports Levanter or JAX.
- No hub: the model's `reference_checkpoint` is a local folder holding a transformers config we write,
  and GPT-2's converter (hardwired to the hub's "gpt2") is overridden.
- A model's vocabulary is its own (the tokenizer's largest id + 1, rounded up), not `len(tokenizer)`:
  Levanter sizes the embedding with `len(config.data.the_tokenizer)` and counts bytes per id over
  `range(len(tokenizer.get_vocab()))`, so the data config we pass hands Levanter a `model_vocab_view`
  of the tokenizer (no Levanter module is patched).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marin_assets.pipeline.tokens.tokenizer import largest_token_id
from marin_assets.pipeline.training.levanter_trainer import restored_root_logging, trainer_config
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec

NO_TOKEN = "<|marin:no-token-{}|>"
"""The name `model_vocab_view` gives, in `get_vocab()`, to an id the tokenizer has no token for."""


class _IdList(list):
    """A list of ids whose `in` is a set lookup: Levanter asks `id in all_special_ids` for every id."""

    def __init__(self, ids: Sequence[int]):
        super().__init__(ids)
        self._set = frozenset(ids)

    def __contains__(self, value: object) -> bool:
        return value in self._set


class _ModelVocabulary:
    """What a `model_vocab_view` changes in the tokenizer it views (see there)."""

    _marin_base: Any
    _marin_vocab_size: int
    _marin_vocab: dict[str, int]
    _marin_special_ids: _IdList

    def __len__(self) -> int:
        return self._marin_vocab_size

    def get_vocab(self) -> dict[str, int]:
        return dict(self._marin_vocab)

    @property
    def all_special_ids(self) -> list[int]:
        return self._marin_special_ids

    def save_pretrained(self, *args: Any, **kwargs: Any) -> Any:
        return self._marin_base.save_pretrained(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return model_vocab_view, (self._marin_base, self._marin_vocab_size)


@functools.cache
def _view_class(cls: type) -> type:
    return type(f"ModelVocab{cls.__name__}", (_ModelVocabulary, cls), {"__doc__": model_vocab_view.__doc__})


def model_vocab_view(tokenizer: Any, vocab_size: int) -> Any:
    """The tokenizer as Levanter must see it for a model with `vocab_size` embedding rows.

    A view sharing the Hugging Face tokenizer's state (an instance of a subclass of its class, so
    Levanter's `isinstance` checks pass) that differs in four ways:
    - `len()` is `vocab_size`: Levanter sizes the model's Vocab axis with `len(tokenizer)`;
    - `get_vocab()` also names every id below `vocab_size` that has no token (cl100k's 100256, the
      rows a rounded-up vocabulary adds) as `<|marin:no-token-ID|>`, so Levanter's bits-per-byte
      table (`range(len(tokenizer.get_vocab()))`) covers every id the model can predict;
    - `all_special_ids` includes those ids and every added token marked special (cl100k's
      `<|endofprompt|>` is not in the tokenizer's own list): Levanter counts a special token as
      zero bytes, and never asks a missing token for its text (which crashes on None);
    - `save_pretrained` saves the tokenizer itself (a Hugging Face export loads without us).
    Encoding, decoding and every other attribute are the tokenizer's own.
    """
    largest = largest_token_id(tokenizer)
    if vocab_size <= largest:
        raise ValueError(f"a vocabulary of {vocab_size} does not cover the tokenizer's largest id {largest}")
    added = getattr(tokenizer, "added_tokens_decoder", {})  # id → AddedToken
    vocab = dict(tokenizer.get_vocab()) | {str(t): i for i, t in added.items()}
    taken = set(vocab.values())
    missing = [i for i in range(vocab_size) if i not in taken]
    vocab.update({NO_TOKEN.format(i): i for i in missing})
    control = {i for i, t in added.items() if getattr(t, "special", False)}  # `<|endofprompt|>`: no text
    cls: Any = type(tokenizer)
    view: Any = object.__new__(_view_class(cls))
    view.__dict__.update(tokenizer.__dict__)
    view._marin_base = tokenizer
    view._marin_vocab_size = vocab_size
    view._marin_vocab = vocab
    view._marin_special_ids = _IdList(sorted(set(tokenizer.all_special_ids) | control | set(missing)))
    return view


def _gpt2_local_class():
    from levanter.compat.hf_checkpoints import HFCheckpointConverter
    from levanter.models.gpt2 import Gpt2Config
    from levanter.models.lm_model import LmConfig

    if "gpt2_local" in LmConfig.get_known_choices():
        return LmConfig.get_choice_class("gpt2_local")

    @LmConfig.register_subclass("gpt2_local")
    @dataclass(frozen=True)
    class LocalGpt2Config(Gpt2Config):
        """Gpt2Config whose HF converter uses a local reference instead of the hub's `gpt2`."""

        reference_checkpoint: str = ""
        tokenizer: str = ""

        def hf_checkpoint_converter(self, ref_checkpoint=None):
            reference = ref_checkpoint or self.reference_checkpoint
            return HFCheckpointConverter(self.__class__, reference_checkpoint=reference, tokenizer=self.tokenizer,
                                         ignore_prefix="transformer")

    return LocalGpt2Config


def write_reference_config(model: ModelSpec, vocab_size: int, directory: str) -> str:
    """A transformers config with the model's shape: Levanter's local 'reference checkpoint'."""
    import transformers

    config: Any
    if model.family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=model.hidden_dim, intermediate_size=model.intermediate_dim,
            num_hidden_layers=model.num_layers, num_attention_heads=model.num_heads,
            num_key_value_heads=model.num_kv_heads, max_position_embeddings=model.max_seq_len,
            rms_norm_eps=model.norm_epsilon, rope_theta=model.rope_theta, tie_word_embeddings=model.tie_embeddings,
            vocab_size=vocab_size, architectures=["LlamaForCausalLM"])
    else:
        config = transformers.GPT2Config(n_embd=model.hidden_dim, n_layer=model.num_layers, n_head=model.num_heads,
                                         n_positions=model.max_seq_len, vocab_size=vocab_size,
                                         layer_norm_epsilon=model.norm_epsilon, architectures=["GPT2LMHeadModel"])
    config.save_pretrained(directory)
    return directory


def model_config(model: ModelSpec, reference: str, tokenizer: str):
    """Levanter's model config for a `ModelSpec`, with its local reference checkpoint."""
    if model.family == "llama":
        from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig
        from levanter.models.llama import LlamaConfig

        return LlamaConfig(seq_len=model.seq_len, hidden_dim=model.hidden_dim, intermediate_dim=model.intermediate_dim,
                           num_layers=model.num_layers, num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                           layer_norm_epsilon=model.norm_epsilon, tie_word_embeddings=model.tie_embeddings,
                           rope=DefaultRotaryEmbeddingsConfig(theta=model.rope_theta),
                           reference_checkpoint=reference, tokenizer=tokenizer)
    return _gpt2_local_class()(seq_len=model.seq_len, hidden_dim=model.hidden_dim, num_layers=model.num_layers,
                               num_heads=model.num_heads, layer_norm_epsilon=model.norm_epsilon,
                               reference_checkpoint=reference, tokenizer=tokenizer)


def export_checkpoint(checkpoint: str, output_dir: str, model: ModelSpec, tokenizer_path: str,
                      vocab_size: int) -> str:
    """Write a Levanter checkpoint of `model` (`vocab_size` embedding rows) as a Hugging Face folder."""
    from levanter.main.export_lm_to_hf import ConvertLmConfig, main

    with tempfile.TemporaryDirectory(prefix="marin-export-") as scratch:
        reference = write_reference_config(model, vocab_size, os.path.join(scratch, "ref"))
        cwd = os.getcwd()
        os.chdir(scratch)  # Levanter's converter writes ./logs wherever it runs
        try:
            trainer = trainer_config(TrainerSpec(num_train_steps=1), "export", scratch, "marin.export")
            with restored_root_logging():
                main(ConvertLmConfig(trainer=trainer, checkpoint_path=checkpoint, output_dir=output_dir,
                                     model=model_config(model, reference, tokenizer_path), tokenizer=tokenizer_path,
                                     override_vocab_size=vocab_size, save_tokenizer=True, use_cpu=True))
        finally:
            os.chdir(cwd)
    return output_dir


def optimizer_config(optimizer: OptimizerSpec):
    """Levanter's AdamW config for an `OptimizerSpec`."""
    from levanter.optim import AdamConfig

    return AdamConfig(learning_rate=optimizer.learning_rate, weight_decay=optimizer.weight_decay,
                      warmup=optimizer.warmup, lr_schedule=optimizer.lr_schedule,
                      min_lr_ratio=optimizer.min_lr_ratio)
