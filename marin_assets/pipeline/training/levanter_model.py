"""Our `ModelSpec` / `OptimizerSpec` → Levanter's model and optimizer configs, offline.

Imported only inside step functions (on Ray workers): defining experiments never imports Levanter or JAX.
- No hub: the model's `reference_checkpoint` and `tokenizer` are local folders (a transformers config we
  write, the run's tokenizer), and GPT-2's reference (the hub's "gpt2" by default) is overridden.
- A model's vocabulary is its own (the tokenizer's largest id + 1, rounded up), not `len(tokenizer)`:
  Levanter sizes the embedding with `len(config.data.the_tokenizer)` and counts bytes per id over
  `range(len(tokenizer.get_vocab()))`, so the data config we pass hands Levanter a `model_vocab_view`
  of the tokenizer (no Levanter module is patched).
- Levanter's model configs have one length, `max_seq_len`: the training sequence (`ModelSpec.seq_len`),
  as GPT-2's learned positions need; a Llama export's `max_position_embeddings` says the same.
"""

from __future__ import annotations

import hashlib
import os
import shutil
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


def _own(name: str) -> property:
    """A property the view takes from the tokenizer it views."""
    return property(lambda self: getattr(self._base, name))


class ModelVocabTokenizer:
    """A tokenizer as Levanter must see it for a model with more embedding rows than the tokenizer has tokens
    (made by `model_vocab_view`, see there): Levanter's `MarinTokenizer` protocol, every member spelled out (a
    runtime protocol check does not look through `__getattr__`)."""

    def __init__(self, base: Any, vocab_size: int, vocab: dict[str, int], special_ids: Sequence[int]):
        self._base = base
        self._size = vocab_size
        self._vocab = vocab
        self._names = {i: name for name, i in vocab.items()}
        self._special_ids = _IdList(special_ids)

    # what the view changes
    def __len__(self) -> int:
        return self._size

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    @property
    def all_special_ids(self) -> list[int]:
        return self._special_ids

    def convert_ids_to_tokens(self, ids: int | list[int]) -> Any:
        if isinstance(ids, int):
            return self._names.get(ids, NO_TOKEN.format(ids))
        return [self._names.get(i, NO_TOKEN.format(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> Any:
        if isinstance(tokens, str):
            return self._vocab.get(tokens, -1)
        return [self._vocab.get(t, -1) for t in tokens]

    def with_chat_template(self, chat_template: str) -> ModelVocabTokenizer:
        return model_vocab_view(self._base.with_chat_template(chat_template), self._size)

    def __reduce__(self) -> tuple[Any, ...]:
        return model_vocab_view, (self._base, self._size)

    # the tokenizer's own
    name_or_path = _own("name_or_path")
    vocab_size = _own("vocab_size")  # the tokenizer's: what a cache's metadata records
    bos_token_id = _own("bos_token_id")
    eos_token_id = _own("eos_token_id")
    pad_token_id = _own("pad_token_id")
    bos_token = _own("bos_token")
    eos_token = _own("eos_token")
    chat_template = _own("chat_template")

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self._base.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return self._base.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = False) -> list[list[int]]:
        return self._base.encode_batch(texts, add_special_tokens=add_special_tokens)

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
        return self._base.apply_chat_template(conversation, **kwargs)

    def apply_chat_template_with_masks(self, conversations: list[list[dict[str, str]]], **kwargs: Any) -> Any:
        return self._base.apply_chat_template_with_masks(conversations, **kwargs)

    def as_hf_tokenizer(self) -> Any:
        """The Hugging Face tokenizer itself: what an export saves (it loads without us)."""
        return self._base.as_hf_tokenizer()


def model_vocab_view(tokenizer: Any, vocab_size: int) -> ModelVocabTokenizer:
    """The tokenizer as Levanter must see it for a model with `vocab_size` embedding rows.

    `tokenizer`: Levanter's (`levanter.tokenizers.load_tokenizer`). The view differs from it in three ways:
    - `len()` is `vocab_size`: Levanter sizes the model's Vocab axis with `len(tokenizer)`;
    - `get_vocab()` (and `convert_ids_to_tokens`) also names every id below `vocab_size` that has no token
      (cl100k's 100256, the rows a rounded-up vocabulary adds) as `<|marin:no-token-ID|>`, so Levanter's
      bits-per-byte table (`range(len(tokenizer.get_vocab()))`) covers every id the model can predict;
    - `all_special_ids` includes those ids and every added token marked special (cl100k's
      `<|endofprompt|>` is not in Levanter's list): Levanter counts a special token as zero bytes.
    Encoding, decoding, chat templates and the Hugging Face tokenizer an export saves are the tokenizer's own.
    """
    hf = tokenizer.as_hf_tokenizer()  # its added tokens say which are special
    largest = largest_token_id(hf)
    if vocab_size <= largest:
        raise ValueError(f"a vocabulary of {vocab_size} does not cover the tokenizer's largest id {largest}")
    added = hf.added_tokens_decoder  # id → AddedToken
    vocab = dict(tokenizer.get_vocab()) | {str(t): i for i, t in added.items()}
    taken = set(vocab.values())
    missing = [i for i in range(vocab_size) if i not in taken]
    vocab.update({NO_TOKEN.format(i): i for i in missing})
    control = {i for i, t in added.items() if getattr(t, "special", False)}  # `<|endofprompt|>`: no text
    return ModelVocabTokenizer(tokenizer, vocab_size, vocab,
                               sorted(set(tokenizer.all_special_ids) | control | set(missing)))


def _gpt2_local_class():
    from levanter.models.gpt2 import Gpt2Config
    from levanter.models.lm_model import LmConfig

    if "gpt2_local" in LmConfig.get_known_choices():
        return LmConfig.get_choice_class("gpt2_local")

    @LmConfig.register_subclass("gpt2_local")
    @dataclass(frozen=True)
    class LocalGpt2Config(Gpt2Config):
        """Gpt2Config whose HF converter uses a local reference instead of the hub's `gpt2`."""

        reference_checkpoint: str = ""

        def hf_checkpoint_converter(self, ref_checkpoint=None):
            return super().hf_checkpoint_converter(ref_checkpoint or self.reference_checkpoint or None)

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
            rms_norm_eps=model.norm_epsilon, tie_word_embeddings=model.tie_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": model.rope_theta},
            vocab_size=vocab_size, architectures=["LlamaForCausalLM"])
    else:
        config = transformers.GPT2Config(n_embd=model.hidden_dim, n_layer=model.num_layers, n_head=model.num_heads,
                                         n_positions=model.max_seq_len, vocab_size=vocab_size,
                                         layer_norm_epsilon=model.norm_epsilon, architectures=["GPT2LMHeadModel"])
    config.save_pretrained(directory)
    return directory


def shared_reference_config(model: ModelSpec, vocab_size: int) -> str:
    """`write_reference_config` in one folder per (model, vocabulary) under the system's temporary folder, written
    once per machine. A model loaded twice in one process (two generation steps on a warm Ray worker) then has the
    same Levanter config — its reference path is part of the model's static structure, which JAX's compile cache
    keys on — so the second reuses what the first compiled (a generation engine's prefill and decode: seconds
    each) instead of compiling it again for a fresh temporary path."""
    digest = hashlib.sha256(repr((model, vocab_size)).encode()).hexdigest()[:16]
    root = os.path.join(tempfile.gettempdir(), f"marin-reference-{os.getuid()}")
    folder = os.path.join(root, digest)
    if not os.path.exists(os.path.join(folder, "config.json")):
        os.makedirs(root, exist_ok=True)
        staging = tempfile.mkdtemp(dir=root, prefix=".writing-")
        write_reference_config(model, vocab_size, staging)
        try:
            os.replace(staging, folder)  # whole or not at all; another process may have won the race
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def model_config(model: ModelSpec, reference: str, tokenizer: str):
    """Levanter's model config for a `ModelSpec`, with its local reference checkpoint."""
    if model.family == "llama":
        from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig
        from levanter.models.llama import LlamaConfig

        return LlamaConfig(max_seq_len=model.seq_len, hidden_dim=model.hidden_dim,
                           intermediate_dim=model.intermediate_dim, num_layers=model.num_layers,
                           num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                           layer_norm_epsilon=model.norm_epsilon, tie_word_embeddings=model.tie_embeddings,
                           rope=DefaultRotaryEmbeddingsConfig(theta=model.rope_theta),
                           reference_checkpoint=reference, tokenizer=tokenizer)
    return _gpt2_local_class()(max_seq_len=model.seq_len, hidden_dim=model.hidden_dim, num_layers=model.num_layers,
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
    from levanter.optim.config import AdamConfig

    return AdamConfig(learning_rate=optimizer.learning_rate, weight_decay=optimizer.weight_decay,
                      warmup=optimizer.warmup, lr_schedule=optimizer.lr_schedule,
                      min_lr_ratio=optimizer.min_lr_ratio)
