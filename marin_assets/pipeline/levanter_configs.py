"""Our specs → Levanter configs, and the sharp edges of Levanter 1.2 on an offline CPU.

Imported only inside step functions (on Ray workers): defining experiments never imports
Levanter or JAX.
- No hub: the model's `reference_checkpoint` is a local folder holding a transformers
  config we write, and GPT-2's converter (hardwired to the hub's "gpt2") is overridden.
- The JSON logger tracker, written to a JSONL file we parse for curves; W&B and TensorBoard beside it
  only when a run's `Tracking` asks.
- No accelerator required; no Ray started by Levanter; no JAX distributed on one host.
- A model's vocabulary is its own (the tokenizer's largest id + 1, rounded up), not
  `len(tokenizer)`: Levanter sizes the embedding with `len(config.data.the_tokenizer)` and
  counts bytes per id over `range(len(tokenizer.get_vocab()))`, so the data config we pass
  hands Levanter a `model_vocab_view` of the tokenizer (no Levanter module is patched).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

from marin_assets.pipeline.specs import MIXTURE_BLOCK_SIZE, ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.tokenizer import largest_token_id
from marin_assets.pipeline.tracking import Tracking

NO_TOKEN = "<|marin:no-token-{}|>"
"""The name `model_vocab_view` gives, in `get_vocab()`, to an id the tokenizer has no token for."""
JAX_BACKENDS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}
"""JAX platform name → the backend `jax.default_backend()` reports for it."""


class AcceleratorError(RuntimeError):
    """The step asked for an accelerator JAX cannot use here."""


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


@functools.cache
def _mixture_class():
    from levanter.compat.hf_checkpoints import load_tokenizer
    from levanter.data.text import LMMixtureDatasetConfig

    @dataclass(frozen=True)
    class ModelVocabMixtureConfig(LMMixtureDatasetConfig):
        """Levanter's mixture config whose tokenizer is a `model_vocab_view` for the model's vocabulary."""

        model_vocab_size: int | None = None
        """Rows of the model's embedding; None: `len(tokenizer)`, as Levanter has it."""

        @cached_property
        def the_tokenizer(self):
            tokenizer = load_tokenizer(self.tokenizer)
            return tokenizer if self.model_vocab_size is None else model_vocab_view(tokenizer, self.model_vocab_size)

    return ModelVocabMixtureConfig


def data_config(tokenizer: str, caches: dict[str, str],
                weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
                vocab_size: int | None = None, max_train_batches: Mapping[str, int] | None = None,
                block_size: int = MIXTURE_BLOCK_SIZE):
    """A mixture over finished caches (`{cache}/{train,validation}`); weight 0 → validation only.

    `weights`: constant, or staged as (start step, weights) pairs (Levanter's `train_weights`);
    `vocab_size`: the model's vocabulary (Levanter then sees a `model_vocab_view` of the tokenizer);
    `max_train_batches`: component → train on only its first that many batches' worth of sequences;
    `block_size`: the mixing block in sequences; stage starts (step × batch size) must fall on one.
    A chat cache (`pipeline/chat.py`) is read in Levanter's chat format, whatever reads it: loss only on
    its assistant tokens, in training and in evaluation alike.
    """
    from levanter.data.text import UrlDatasetSourceConfig

    train_weights: dict[str, float] | list[tuple[int, dict[str, float]]]
    if isinstance(weights, Mapping):
        train_weights = dict(weights)
    else:
        stages = [(int(start), dict(w)) for start, w in weights]
        train_weights = stages[0][1] if len(stages) == 1 else stages
    return _mixture_class()(tokenizer=tokenizer, cache_dir=None,
                            configs={k: UrlDatasetSourceConfig(cache_dir=path, format=cache_format(path))
                                     for k, path in caches.items()},
                            train_weights=train_weights, model_vocab_size=vocab_size,
                            max_train_batches=dict(max_train_batches) if max_train_batches else None,
                            mixture_block_size=block_size)


def cache_format(cache_dir: str):
    """Levanter's format for a finished cache: `ChatLmDatasetFormat` (packed conversations, loss on the tokens
    its assistant masks mark) when its ledger records a chat template, else text."""
    from levanter.data.text import ChatLmDatasetFormat, TextLmDatasetFormat

    from marin_assets.pipeline.chat import MESSAGES_FIELD, chat_template_of_cache

    template = chat_template_of_cache(cache_dir)
    if template is None:
        return TextLmDatasetFormat()
    return ChatLmDatasetFormat(messages_field=MESSAGES_FIELD, chat_template=template, pack=True,
                               mask_user_turns=True)


class _StartOnce:
    """A tracker config whose `init` starts its tracker once: Levanter calls `init` twice per run (its global
    tracker in `TrainerConfig.initialize`, then the `Trainer`'s), which would make W&B start a second run
    folder and TensorBoard a second writer of the same event file."""

    def init(self, run_id):
        if getattr(self, "_marin_tracker", None) is None:
            self._marin_tracker = super().init(run_id)
        return self._marin_tracker


@functools.cache
def _wandb_class():
    from levanter.tracker import TrackerConfig
    from levanter.tracker.wandb import WandbConfig

    if "wandb_local" in TrackerConfig.get_known_choices():
        return TrackerConfig.get_choice_class("wandb_local")

    @TrackerConfig.register_subclass("wandb_local")
    @dataclass
    class LocalDirWandbConfig(_StartOnce, WandbConfig):
        """Levanter's W&B tracker writing its run files under `{dir}/wandb` (`dir`: W&B's `root_dir`); once started, its
        `run_url` (None offline) and `run_dir` (the run's local folder) say where the run went."""

        dir: str = ""

        def _git_settings(self):
            return {**super()._git_settings(), "root_dir": self.dir}

        def init(self, run_id):
            os.makedirs(self.dir, exist_ok=True)
            tracker = super().init(run_id)
            self.run_url = None if tracker.run.offline else tracker.run.url
            self.run_dir = os.path.dirname(tracker.run.dir)  # `.../offline-run-…-ID/files` → its run folder
            return tracker

    return LocalDirWandbConfig


@functools.cache
def _tensorboard_class():
    from levanter.tracker import TrackerConfig
    from levanter.tracker.tensorboard import TensorboardConfig

    if "tensorboard_once" in TrackerConfig.get_known_choices():
        return TrackerConfig.get_choice_class("tensorboard_once")

    @TrackerConfig.register_subclass("tensorboard_once")
    @dataclass
    class OneWriterTensorboardConfig(_StartOnce, TensorboardConfig):
        """Levanter's TensorBoard tracker with one event-file writer per run."""

    return OneWriterTensorboardConfig


def tracker_configs(tracking: Tracking | None, run_id: str, output_dir: str, metrics_logger: str) -> list:
    """Levanter's tracker configs: the JSON logger (the source of our curves) first, then W&B (run files
    under `{output_dir}/wandb`) and TensorBoard (`{output_dir}/tensorboard/{run_id}`) as `tracking` asks."""
    from levanter.tracker.json_logger import JsonLoggerConfig

    from marin_assets.pipeline.tracking import TENSORBOARD_DIR

    configs: list = [JsonLoggerConfig(logger_name=metrics_logger)]
    if tracking is not None and tracking.wandb:
        configs.append(_wandb_class()(project=tracking.wandb_project, entity=tracking.wandb_entity,
                                      tags=list(tracking.wandb_tags), id=run_id, save_code=False,
                                      dir=output_dir))  # W&B writes under `{dir}/wandb`
    if tracking is not None and tracking.tensorboard:
        configs.append(_tensorboard_class()(logdir=os.path.join(output_dir, TENSORBOARD_DIR), flush_secs=10))
    return configs


def trainer_config(trainer: TrainerSpec, run_id: str, output_dir: str, metrics_logger: str,
                   checkpoint_dir: str | None = None, require_accelerator: bool = False,
                   tracking: Tracking | None = None):
    """Levanter's trainer config for a `TrainerSpec`: offline, JSON metrics, checkpoints under `checkpoint_root`.

    `trainer.num_train_steps` is the run's length (a `TokenBudget` has already been applied to it);
    `tracking`: W&B and TensorBoard beside the JSON metrics (`tracker_configs`).
    """
    import jmp
    from levanter.callbacks.watch import WatchConfig
    from levanter.checkpoint import CheckpointerConfig
    from levanter.distributed import DistributedConfig, RayConfig
    from levanter.trainer import TrainerConfig

    # Policies apply in turn: every K steps until the one before last, then every step — which
    # leaves only the last. Levanter alone never forces a checkpoint of the final step.
    trackers = tracker_configs(tracking, run_id, output_dir, metrics_logger)
    last = trainer.num_train_steps - 1
    keep = [dict(every=trainer.checkpoint_every, until=last - 1), dict(every=1, until=None)]
    keep = keep if last >= 1 else [dict(every=1, until=None)]
    return TrainerConfig(
        id=run_id, seed=trainer.seed, mp=jmp.get_policy(trainer.mixed_precision),
        tracker=trackers[0] if len(trackers) == 1 else tuple(trackers),
        log_dir=Path(output_dir) / "logs",
        train_batch_size=trainer.train_batch_size, num_train_steps=trainer.num_train_steps,
        steps_per_eval=trainer.steps_per_eval, max_eval_batches=trainer.max_eval_batches,
        checkpointer=CheckpointerConfig(base_path=checkpoint_dir or os.path.join(output_dir, "checkpoints"),
                                        save_interval=timedelta(minutes=30), keep=keep),
        require_accelerator=require_accelerator, ray=RayConfig(auto_start_cluster=False),
        distributed=DistributedConfig(initialize_jax_distributed=False),
        watch=WatchConfig(watch_targets=[]), log_jaxprs=False, log_xla_hlo=False,
    )


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


def use_platform(platform: str | None, who: str) -> None:
    """Make JAX in this process run on `platform` (`cuda`, `tpu`, `cpu`), whatever `JAX_PLATFORMS` says.

    The environment may say `cpu` (the Makefile exports it, and the Ray resource forwards it to
    every worker): an accelerator step overrides it here, before Levanter starts JAX. A worker
    whose JAX already runs elsewhere (it ran a CPU step before) has its backends cleared and
    started again. JAX without the platform's plugin is an `AcceleratorError` naming `who`,
    before any compute. None: leave JAX to `JAX_PLATFORMS` and its own choice.
    """
    if platform is None:
        return
    if platform not in JAX_BACKENDS:
        raise ValueError(f"{who}: unknown JAX platform {platform!r} (known: {sorted(JAX_BACKENDS)})")
    import jax
    from jax.extend import backend as jax_backend

    previous = getattr(jax.config, "jax_platforms")  # noqa: B009  (a config state mypy does not see)
    jax.config.update("jax_platforms", platform)
    cleared = False
    try:
        found = jax.default_backend()
        if found != JAX_BACKENDS[platform]:  # this process started JAX elsewhere before
            jax_backend.clear_backends()
            cleared = True
            found = jax.default_backend()
        problem = None if found == JAX_BACKENDS[platform] else f"JAX started on {found!r}"
    except Exception as e:  # JAX raises a bare AssertionError or a RuntimeError for a backend it cannot start
        problem = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no backend'}"
        if JAX_BACKENDS[platform] == "gpu" and importlib.util.find_spec("jax_cuda12_plugin") is None:
            problem = "JAX's CUDA 12 plugin (jax-cuda12-plugin) is not installed"
    if problem is None:
        return
    jax.config.update("jax_platforms", previous)
    if cleared:
        jax_backend.clear_backends()
    hint = ("install JAX with CUDA: pip install 'jax[cuda12]==0.7.2' (docs/gpu.md)" if JAX_BACKENDS[platform] == "gpu"
            else "install JAX with TPU support: pip install 'jax[tpu]==0.7.2'" if platform == "tpu" else "")
    raise AcceleratorError(f"{who}: asked to run on {platform!r}, but JAX {jax.__version__} cannot start that"
                           f" backend here ({problem}){'; ' + hint if hint else ''}")


def optimizer_config(optimizer: OptimizerSpec):
    """Levanter's AdamW config for an `OptimizerSpec`."""
    from levanter.optim import AdamConfig

    return AdamConfig(learning_rate=optimizer.learning_rate, weight_decay=optimizer.weight_decay,
                      warmup=optimizer.warmup, lr_schedule=optimizer.lr_schedule,
                      min_lr_ratio=optimizer.min_lr_ratio)


@contextlib.contextmanager
def restored_root_logging() -> Iterator[None]:
    """Undo Levanter's `init_logging` afterwards: it replaces the root logger's handlers with a
    file handler under its log dir (often a temporary folder) and a console handler, which
    would outlive the call in a reused worker or test process and write to a deleted folder."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


class JsonlMetrics:
    """Route a JSON-logger tracker's records into a JSONL file for the duration of a run."""

    def __init__(self, logger_name: str, path: str):
        self.logger = logging.getLogger(logger_name)
        self.path = path

    def __enter__(self) -> JsonlMetrics:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.handler = logging.FileHandler(self.path, mode="a")
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.handler.close()


def read_metrics(path: str) -> dict[int, dict[str, Any]]:
    """step → merged metrics (last value wins: a resumed run replays some steps)."""
    steps: dict[int, dict[str, Any]] = {}
    if not os.path.exists(path):
        return steps
    with open(path) as f:
        for line in f:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "log" and event.get("step") is not None:
                steps.setdefault(int(event["step"]), {}).update(event.get("metrics", {}))
            elif event.get("event") == "summary":
                steps.setdefault(SUMMARY_STEP, {}).update(event.get("metrics", {}))
    return steps


SUMMARY_STEP = -1
"""`read_metrics` files run summaries (e.g. parameter_count) under this step."""
