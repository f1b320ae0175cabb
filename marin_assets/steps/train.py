"""Training: pretraining, SFT, DPO and RL steps, where their weights start from, exports, and the
model, optimizer and trainer specs they take.

As Marin's `marin.experiment.train` and `checkpoints` hold `train_lm` and its specs: every method here
returns a `TrainStep`, whose checkpoints the evaluation steps read.
"""

from marin_assets.pipeline.training.dpo.metrics import DpoMetrics
from marin_assets.pipeline.training.dpo.reference_logprobs import reference_logprobs_step
from marin_assets.pipeline.training.dpo.step import dpo_step
from marin_assets.pipeline.training.export import export_step
from marin_assets.pipeline.training.hf_model import hf_model_step
from marin_assets.pipeline.training.hf_to_levanter import hf_to_levanter_step
from marin_assets.pipeline.training.lineage import training_datasets_of
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.rl.envs import Addition, SequentialDigits, worked_examples_step
from marin_assets.pipeline.training.rl.metrics import RlMetrics
from marin_assets.pipeline.training.rl.step import RlSpec, rl_step
from marin_assets.pipeline.training.sft.step import SFT_OPTIMIZER, sft_step
from marin_assets.pipeline.training.sources import from_checkpoint, from_hf
from marin_assets.pipeline.training.specs import (
    DeviceLayout,
    MixtureSpec,
    ModelSpec,
    OptimizerSpec,
    SpecError,
    TokenBudget,
    TrainerSpec,
)
from marin_assets.pipeline.training.tracking import Tracking
from marin_assets.pipeline.training.training_run import TrainResult, TrainStep

__all__ = [
    # the methods
    "train_step", "TrainStep", "TrainResult", "sft_step", "SFT_OPTIMIZER", "dpo_step", "reference_logprobs_step",
    "rl_step", "RlSpec", "worked_examples_step", "SequentialDigits", "Addition",
    # what a method measures beyond the losses (`TrainResult.method_metrics`)
    "DpoMetrics", "RlMetrics",
    # where weights start from and where they go
    "from_hf", "from_checkpoint", "hf_model_step", "hf_to_levanter_step", "export_step",
    # specs
    "ModelSpec", "OptimizerSpec", "TrainerSpec", "TokenBudget", "MixtureSpec", "Tracking", "SpecError", "DeviceLayout",
    # what a model's training read
    "training_datasets_of",
]
