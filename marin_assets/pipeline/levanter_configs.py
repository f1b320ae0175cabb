"""Our specs → Levanter configs, and the sharp edges of Levanter 1.2 on an offline CPU.

Imported only inside step functions (on Ray workers): defining experiments never imports
Levanter or JAX.
- No hub: the model's `reference_checkpoint` is a local folder holding a transformers
  config we write, and GPT-2's converter (hardwired to the hub's "gpt2") is overridden.
- No W&B: the JSON logger tracker, written to a JSONL file we parse for curves.
- No accelerator required; no Ray started by Levanter; no JAX distributed on one host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from marin_assets.pipeline.specs import ModelSpec, OptimizerSpec, TrainerSpec


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
            vocab_size=vocab_size, architectures=["LlamaForCausalLM"])
    else:
        config = transformers.GPT2Config(n_embd=model.hidden_dim, n_layer=model.num_layers, n_head=model.num_heads,
                                         n_positions=model.max_seq_len, vocab_size=vocab_size,
                                         architectures=["GPT2LMHeadModel"])
    config.save_pretrained(directory)
    return directory


def model_config(model: ModelSpec, reference: str, tokenizer: str):
    """Levanter's model config for a `ModelSpec`, with its local reference checkpoint."""
    if model.family == "llama":
        from levanter.models.llama import LlamaConfig

        return LlamaConfig(seq_len=model.seq_len, hidden_dim=model.hidden_dim, intermediate_dim=model.intermediate_dim,
                           num_layers=model.num_layers, num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                           reference_checkpoint=reference, tokenizer=tokenizer)
    return _gpt2_local_class()(seq_len=model.seq_len, hidden_dim=model.hidden_dim, num_layers=model.num_layers,
                               num_heads=model.num_heads, reference_checkpoint=reference, tokenizer=tokenizer)


def data_config(tokenizer: str, caches: dict[str, str], weights: dict[str, float]):
    """A mixture over finished caches (`{cache}/{train,validation}`); weight 0 → validation only."""
    from levanter.data.text import LMMixtureDatasetConfig, UrlDatasetSourceConfig

    return LMMixtureDatasetConfig(tokenizer=tokenizer, cache_dir=None,
                                  configs={k: UrlDatasetSourceConfig(cache_dir=path) for k, path in caches.items()},
                                  train_weights=dict(weights))


def trainer_config(trainer: TrainerSpec, run_id: str, output_dir: str, metrics_logger: str,
                   checkpoint_dir: str | None = None):
    """Levanter's trainer config for a `TrainerSpec`: offline, JSON metrics, checkpoints under `checkpoint_root`."""
    import jmp
    from levanter.callbacks.watch import WatchConfig
    from levanter.checkpoint import CheckpointerConfig
    from levanter.distributed import DistributedConfig, RayConfig
    from levanter.tracker.json_logger import JsonLoggerConfig
    from levanter.trainer import TrainerConfig

    # Policies apply in turn: every K steps until the one before last, then every step — which
    # leaves only the last. Levanter alone never forces a checkpoint of the final step.
    last = trainer.num_train_steps - 1
    keep = [dict(every=trainer.checkpoint_every, until=last - 1), dict(every=1, until=None)]
    keep = keep if last >= 1 else [dict(every=1, until=None)]
    return TrainerConfig(
        id=run_id, seed=trainer.seed, mp=jmp.get_policy(trainer.mixed_precision),
        tracker=JsonLoggerConfig(logger_name=metrics_logger),
        log_dir=Path(output_dir) / "logs",
        train_batch_size=trainer.train_batch_size, num_train_steps=trainer.num_train_steps,
        steps_per_eval=trainer.steps_per_eval, max_eval_batches=trainer.max_eval_batches,
        checkpointer=CheckpointerConfig(base_path=checkpoint_dir or os.path.join(output_dir, "checkpoints"),
                                        save_interval=timedelta(minutes=30), keep=keep),
        require_accelerator=False, ray=RayConfig(auto_start_cluster=False),
        distributed=DistributedConfig(initialize_jax_distributed=False),
        watch=WatchConfig(watch_targets=[]), log_jaxprs=False, log_xla_hlo=False,
    )


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
