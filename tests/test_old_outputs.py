"""Outputs written by the previous Levanter line stay readable, and are taken as they are.

`tests/data/levanter-1.2.dev1644/` holds what marin-assets 0.1 (levanter 1.2.dev1644, JAX 0.7.2, Python 3.11)
made for a tiny pipeline (`make_outputs.py` there): a corpus, a tokenizer, a consolidated Levanter cache, and a
training run with a checkpoint and Levanter's own Hugging Face export of it. The steps' identities did not change
with the Levanter upgrade (nothing in them names Levanter, and the caches' token ids come from our encoders), so
the same definitions find these outputs cached; this test proves they may: the new Levanter exports the old
checkpoint bit for bit as the old one did, and evaluates the old run on the old cache to the loss the old stack
recorded for it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from marin_assets import materialize_step
from marin_assets.core.record import read_record
from marin_assets.experiments import tiny_stories
from marin_assets.pipeline.evals.loss import evaluate_lm
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from tests.support.helpers import FAST

OLD = Path(__file__).parent / "data" / "levanter-1.2.dev1644"
OLD_PREFIX = "/tmp/oldstack"
"""The prefix the old outputs were made under; their records and ledgers name it."""
TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
SHORT = TrainerSpec(num_train_steps=6, train_batch_size=4, checkpoint_every=5, steps_per_eval=6, max_eval_batches=2)


def old_outputs_at(prefix: Path) -> Path:
    shutil.copytree(OLD, prefix, ignore=shutil.ignore_patterns("make_outputs.py"))
    for path in prefix.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl"):
            text = path.read_text()
            if OLD_PREFIX in text:
                path.write_text(text.replace(OLD_PREFIX, str(prefix)))
    return prefix


def test_old_outputs_are_cached_and_readable(tmp_path):
    from safetensors.numpy import load_file

    prefix = old_outputs_at(tmp_path / "outputs")
    pipeline = tiny_stories.build(prefix="old", train_documents=300, validation_documents=40, vocab_size=400,
                                  model=TINY, trainer=SHORT, optimizer=OptimizerSpec(learning_rate=1e-2))
    train = pipeline["train"]
    assert (prefix / train.output_path_under("").lstrip("/")).is_dir(), "the definitions name the old outputs"
    for name in ("corpus", "tokenizer", "tokenized", "train"):
        assert materialize_step(pipeline[name], prefix=str(prefix), settings=FAST).cached, name

    exported = materialize_step(pipeline["export"], prefix=str(prefix), settings=FAST)
    assert not exported.cached
    ours = load_file(f"{exported.output_path}/model.safetensors")
    theirs = load_file(next(prefix.glob("checkpoints/old-llama_*/hf/*/step-5/model.safetensors")))
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), name

    evaluated = materialize_step(pipeline["evaluate"], prefix=str(prefix), settings=FAST).record.result
    assert evaluated["step"] == 5 and np.isfinite(evaluated["per_dataset"]["stories"]["loss"])

    # The old checkpoint evaluated by the new stack on the batches the old run evaluated it on at its last step
    # (its eval: 2 batches of 4): the loss the old stack recorded.
    old_run = read_record(train.output_path_under(str(prefix))).result
    recorded = dict(old_run["eval_curve"])[5]
    assert old_run["eval_losses"]["stories"] == recorded
    now = evaluate_lm(str(tmp_path / "again"), evaluated["checkpoint"], TINY,
                      pipeline["tokenizer"].output_path_under(str(prefix)),
                      {"stories": pipeline["tokenized"].output_path_under(str(prefix))},
                      max_eval_batches=SHORT.max_eval_batches, batch_size=SHORT.train_batch_size)
    assert now.per_dataset["stories"]["loss"] == pytest.approx(recorded, rel=1e-5, abs=0)
    assert now.loss == pytest.approx(old_run["final_eval_loss"], rel=1e-5, abs=0)
