"""Bare Levanter, the reference of the train row: `levanter.main.train_lm` on a config written here by hand
with Levanter's own config classes, in a process that imports nothing but Levanter (with JAX, Haliax and what
Levanter imports itself) and the standard library — none of the project's modules, checked before it exits.

`python bench/bare_levanter.py SPEC_JSON` trains and prints `{"steps", "output", "project_modules"}`. The spec
holds plain numbers and paths: the tokenizer and cache folders, the model's shape, the optimizer's and the
trainer's settings, the output folder. `config(spec)` is also what the bench compares, field by field, with
the config our train step builds for the same run (`pipeline_throughput.check_same_config`): the same model,
data, optimizer and steps, or the row is not measured.

The run is set up as Levanter lets any user set it up offline on a CPU: its JSON logger as the tracker (its
default is W&B), no accelerator required, no JAX distributed on one host, no parameter watching. An HF export
at the end needs a reference model config (`reference_config`): a plain `config.json` written with `json`.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

PROJECT_PACKAGES = ("marin_assets", "resources", "pipeline_throughput", "measure")


def reference_config(model: dict[str, Any], vocab: int, directory: str) -> str:
    """A Hugging Face Llama `config.json` of the model's shape: what Levanter's HF export reads."""
    os.makedirs(directory, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": model["hidden_dim"],
              "intermediate_size": model["intermediate_dim"], "num_hidden_layers": model["num_layers"],
              "num_attention_heads": model["num_heads"], "num_key_value_heads": model["num_kv_heads"],
              "max_position_embeddings": model["max_seq_len"], "rms_norm_eps": model["norm_epsilon"],
              "tie_word_embeddings": model["tie_embeddings"], "vocab_size": vocab, "hidden_act": "silu",
              "rope_parameters": {"rope_type": "default", "rope_theta": model["rope_theta"]}}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return directory


def config(spec: dict[str, Any]) -> Any:
    """Levanter's `TrainLmConfig` for the spec's run, from Levanter's classes alone."""
    from levanter.callbacks.watch import WatchConfig
    from levanter.checkpoint import CheckpointerConfig
    from levanter.data.text.datasets import DatasetComponent, LmDataConfig, UrlDatasetSourceConfig
    from levanter.data.text.formats import TextLmDatasetFormat
    from levanter.distributed import DistributedConfig
    from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig
    from levanter.main.train_lm import TrainLmConfig
    from levanter.models.llama import LlamaConfig
    from levanter.optim.config import AdamConfig
    from levanter.tracker.json_logger import JsonLoggerConfig
    from levanter.trainer import TrainerConfig

    model, optimizer, trainer, out = spec["model"], spec["optimizer"], spec["trainer"], spec["out"]
    last = trainer["num_train_steps"] - 1  # checkpoints every K steps until the one before last (Levanter: the last)
    return TrainLmConfig(
        data=LmDataConfig(tokenizer=spec["tokenizer"], cache_dir=None, auto_build_caches=False, shuffle=False,
                          components={"stories": DatasetComponent(source=UrlDatasetSourceConfig(),
                                                                  cache_dir=spec["cache"],
                                                                  format=TextLmDatasetFormat())},
                          train_weights={"stories": 1.0}),
        model=LlamaConfig(max_seq_len=model["seq_len"], hidden_dim=model["hidden_dim"],
                          intermediate_dim=model["intermediate_dim"], num_layers=model["num_layers"],
                          num_heads=model["num_heads"], num_kv_heads=model["num_kv_heads"],
                          layer_norm_epsilon=model["norm_epsilon"], tie_word_embeddings=model["tie_embeddings"],
                          rope=DefaultRotaryEmbeddingsConfig(theta=model["rope_theta"]),
                          reference_checkpoint=spec["reference"], tokenizer=spec["tokenizer"]),
        trainer=TrainerConfig(
            id=spec["run_id"], seed=trainer["seed"], tracker=JsonLoggerConfig(),
            log_dir=Path(out) / "logs", train_batch_size=trainer["train_batch_size"],
            num_train_steps=trainer["num_train_steps"], steps_per_eval=trainer["steps_per_eval"],
            max_eval_batches=trainer["max_eval_batches"],
            checkpointer=CheckpointerConfig(base_path=os.path.join(out, "checkpoints"),
                                            save_interval=timedelta(minutes=30),
                                            keep=[dict(every=trainer["checkpoint_every"], until=last - 1)]),
            require_accelerator=False, distributed=DistributedConfig(initialize_jax_distributed=False),
            watch=WatchConfig(watch_targets=[]), log_jaxprs=False, log_xla_hlo=False),
        optimizer=AdamConfig(learning_rate=optimizer["learning_rate"], weight_decay=optimizer["weight_decay"],
                             warmup=optimizer["warmup"], lr_schedule=optimizer["lr_schedule"],
                             min_lr_ratio=optimizer["min_lr_ratio"]),
        hf_save_path=os.path.join(out, "hf"), hf_save_steps=10**9)


def project_modules() -> list[str]:
    """The project's modules this process has imported (a bare run has none)."""
    return sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES)


def main(spec: dict[str, Any]) -> dict[str, Any]:
    from levanter.main import train_lm

    train_lm.main(config(spec))
    return {"steps": spec["trainer"]["num_train_steps"], "output": spec["out"], "project_modules": project_modules()}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
