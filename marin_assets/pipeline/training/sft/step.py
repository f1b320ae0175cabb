"""SFT: supervised fine-tuning of a pretrained model on chat data, loss on the assistant's tokens only.

As Marin's `default_sft`: a training run (`train_step`) that starts from existing weights — an export
step's or any Hugging Face folder (`from_hf`), or a Levanter checkpoint of another training step
(`from_checkpoint`) — and trains on chat caches (`chat.chat_tokenize_step`). Levanter reads those in its
chat format (packed conversations whose loss weights are the assistant masks), so nothing here touches
the loss. What an SFT step adds is the checks and defaults of fine-tuning: it must start from weights,
train on at least one chat cache, and it takes the source's model unless told otherwise. Export,
evaluation (assistant-only on a chat validation split) and per-checkpoint evals work on it as on any
training step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marin_assets.core.record import load_result
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizeStep
from marin_assets.pipeline.training.pretrain.step import LmTraining, train_step
from marin_assets.pipeline.training.runner import RunPlaces
from marin_assets.pipeline.training.sources import InitFrom, TrainSourceError, model_of
from marin_assets.pipeline.training.specs import DeviceLayout, ModelSpec, OptimizerSpec, TokenBudget, TrainerSpec
from marin_assets.pipeline.training.train_data import TrainDataError, Weights, refuse_preference_caches
from marin_assets.pipeline.training.training_run import TrainResult, TrainStep

SFT_OPTIMIZER = OptimizerSpec(learning_rate=1e-3, weight_decay=0.0, warmup=0.03, lr_schedule="linear",
                              min_lr_ratio=0.0)
"""Fine-tuning's usual AdamW: no weight decay, a short warmup, linear decay to zero (as Marin's SFT
configs); the rate suits this project's small models — a large pretrained model wants far less."""


@dataclass(frozen=True)
class SftTraining(LmTraining):
    """SFT as a method on the runner: Levanter's `train_lm` on chat caches (read in Levanter's chat format:
    packed conversations whose loss weights are the assistant masks), always from pretrained weights."""

    name: str = "sft"

    def config(self, places: RunPlaces) -> Any:
        if self.init is None and not places.resuming:
            raise TrainSourceError(f"SFT at {places.output_path} has no pretrained weights to start from")
        return super().config(places)


def is_chat_step(step: Step) -> bool | None:
    """Whether a step's output is a chat cache: known at definition time for the steps that make one (a
    `TokenizeStep` says), None where only its record tells, at run time."""
    return step.chat if isinstance(step, TokenizeStep) else None


def check_chat_components(step_name: str, caches: Mapping[str, TokenizedCache]) -> None:
    """At least one trained component is a chat cache, and none a preference cache (`TrainDataError` naming them
    otherwise): SFT on text caches alone would put the loss on every token, and preference pairs are DPO's."""
    refuse_preference_caches(f"SFT step {step_name!r}", caches)
    if not any(c.chat_template for c in caches.values()):
        raise TrainDataError(f"step {step_name!r}: none of the SFT components {sorted(caches)} is a chat cache"
                             " (made by chat_tokenize_step); SFT on text caches would train on every token")


def sft_step(name: str, chat: dict[str, Step], init_from: InitFrom, model: ModelSpec | None = None,
             optimizer: OptimizerSpec = SFT_OPTIMIZER, trainer: TrainerSpec = TrainerSpec(),
             weights: Weights | None = None, validation: dict[str, Step] | None = None, *,
             budget: TokenBudget | None = None, cpu: float = 1, gpu: float = 0,
             gpu_type: str | None = None, hosts: int = 1, layout: DeviceLayout | None = None) -> TrainStep:
    """A training step that fine-tunes the weights `init_from` names (`from_hf(export_step or folder)`,
    `from_checkpoint(train)`) on chat caches — `chat` components train (text caches may join the mixture),
    `validation` ones are evaluated — with loss on assistant tokens only. `model`: None takes the source's (a
    training step's, or the one an export step exports); a plain Hugging Face folder needs it given.

    Identity: `train_step`'s: `chat` and `validation` with their `weights`, `model`, `optimizer`, `trainer`,
    `budget`, `init_from`; not `cpu`, `gpu`, `gpu_type`, `hosts` (several hosts as one JAX program) nor
    `layout` (how the devices are split: `DeviceLayout`).
    """
    if not isinstance(init_from, InitFrom):
        raise StepDefinitionError(f"SFT step {name!r}: init_from must say where the pretrained weights are:"
                                  " from_hf(export step or folder) or from_checkpoint(training step)")
    model = model_of(f"SFT step {name!r}", model, init_from)
    refuse_preference_caches(f"SFT step {name!r}", chat, StepDefinitionError)
    kinds = {k: is_chat_step(s) for k, s in chat.items()}
    if kinds and all(kind is False for kind in kinds.values()):
        raise StepDefinitionError(f"SFT step {name!r}: none of its components {sorted(chat)} is a chat cache"
                                  " (chat_tokenize_step); SFT on text caches would train on every token")
    train = train_step(name, chat, model, optimizer, trainer, weights, validation, cpu, init_from=init_from,
                       budget=budget, gpu=gpu, gpu_type=gpu_type, method_type=SftTraining, hosts=hosts,
                       layout=layout)
    trained = sorted(chat)

    def run(out: str) -> TrainResult:
        check_chat_components(name, {k: load_result(chat[k], TokenizedCache) for k in trained})
        result: TrainResult = train.fn(out)
        return result

    return dataclasses.replace(train, fn=run, kinds=[*train.kinds, "sft"])
