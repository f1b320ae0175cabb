"""The training-method seam: pretraining (`train_step`, `LmTraining`), SFT (`sft_step`, `SftTraining`) and DPO
(`dpo_step`, `DpoTraining`) run on the one runner and meet the same assertions — the record says its method, steps,
checkpoints (the last step always saved) and losses; metrics, reference config and attempts lie beside the
checkpoints; a second call on a finished run trains nothing and returns the same record."""

import json
import math
import os

import pytest

from marin_assets.core.paths import using_prefix
from marin_assets.core.record import load_result
from marin_assets.pipeline.training.checkpoints import checkpoint_steps, run_dir_of
from marin_assets.pipeline.training.rl.envs import SequentialDigits
from marin_assets.pipeline.training.rl.step import RlSpec, rl_step
from marin_assets.pipeline.training.runner import ATTEMPTS_FILE, METRICS_FILE, run_training
from marin_assets.pipeline.training.sft.step import SftTraining
from marin_assets.pipeline.training.sources import TrainSourceError, from_checkpoint
from marin_assets.pipeline.training.specs import TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult, TrainStep
from tests.support.dpo import DpoSteps
from tests.test_sft import Pipeline

METHODS = {
    "train_lm": lambda p: p.base, "sft": lambda p: p.sft, "dpo": lambda p: DpoSteps(p, p.base_export).dpo,
    "rl": lambda p: rl_step("checkpoints/rl", from_checkpoint(p.sft),
                            SequentialDigits(length=1, min_prompt=1, max_prompt=8),
                            RlSpec(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=4, held_out_problems=4,
                                   eval_every=2),
                            trainer=TrainerSpec(num_train_steps=4, checkpoint_every=50)),
}
"""Method name (as the record says it) → the pipeline's step trained with it."""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return Pipeline(str(tmp_path_factory.mktemp("methods") / "outputs"))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_on_the_runner_alike(pipeline, method):
    step = METHODS[method](pipeline)
    assert isinstance(step, TrainStep)
    result = pipeline.result(step, TrainResult)
    out = pipeline.path(step)
    steps = step.hash_attrs["trainer"].num_train_steps

    assert result.method == method
    assert result.steps == steps and result.checkpoint_steps[-1] == steps - 1
    assert result.checkpoint_steps == checkpoint_steps(run_dir_of(out)) and result.checkpoint_dir == run_dir_of(out)
    with using_prefix(pipeline.prefix):
        assert result.model == step.model and result.vocab_size == step.vocab_size()
    padded = steps * step.hash_attrs["trainer"].batch_tokens(step.model)
    if method == "rl":  # the rollouts' real sequences, not padded batches (tests/test_rl.py checks the count)
        assert 0 < result.train_tokens < padded
    else:
        assert result.train_tokens == padded
    assert result.loss_curve and all(math.isfinite(loss) for _, loss in result.loss_curve)
    assert os.path.exists(os.path.join(out, METRICS_FILE))
    assert json.load(open(os.path.join(out, "reference", "config.json")))["vocab_size"] == result.vocab_size
    attempts = json.load(open(os.path.join(out, ATTEMPTS_FILE)))["seconds"]
    assert len(attempts) == 1 and result.train_seconds == pytest.approx(attempts[0], abs=0.01)
    assert (result.initialized_from is None) == (method == "train_lm")

    # a finished run: the runner trains nothing, counts no new attempt, and records the same run
    with using_prefix(pipeline.prefix):
        again = step.fn(out)
    assert json.load(open(os.path.join(out, ATTEMPTS_FILE)))["seconds"] == attempts
    assert (again.steps, again.checkpoint_steps, again.loss_curve, again.method) == (
        result.steps, result.checkpoint_steps, result.loss_curve, result.method)
    assert load_result(out, TrainResult).checkpoint_steps == result.checkpoint_steps


def test_sft_refuses_a_run_without_pretrained_weights_before_training(pipeline, tmp_path):
    base = pipeline.result(pipeline.base, TrainResult)
    chat = load_result(pipeline.path(pipeline.chat))
    method = SftTraining(base.tokenizer, {"chat": chat.path}, {"chat": 1.0}, base.model,
                         pipeline.sft.hash_attrs["optimizer"], pipeline.sft.hash_attrs["trainer"], base.vocab_size)
    with pytest.raises(TrainSourceError, match="has no pretrained weights to start from"):
        run_training(str(tmp_path / "sft-from-nothing"), method)
    assert not os.path.exists(tmp_path / "sft-from-nothing" / "checkpoints")
