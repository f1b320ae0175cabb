"""The whole LLM pipeline on an `s3://` prefix against a local S3 (moto's server): download → tokenizer →
tokenize → train with checkpoints → export → evaluate, with every byte in the bucket and none on the local
disk. The store is found as a boto3 user finds it (`AWS_ENDPOINT_URL_S3` at 127.0.0.1, `tests/support/
s3_server.py`), which Levanter's tensorstore specs do not read by themselves (`pipeline/tokens/array_store.py`).

Under the Levanter of releases before 0.2 the arrays of this very run landed in a local folder named `s3:`
while every step reported SUCCESS; the assertions on the working directory and the bucket catch that."""

from __future__ import annotations

import os
import tempfile

import fsspec
import pytest

from marin_assets import materialize_step
from marin_assets.core.step import walk
from marin_assets.pipeline.data.corpus import generate_corpus
from marin_assets.pipeline.data.download import url_download_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.steps import language_model_pipeline
from tests.support.helpers import FAST

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
SHORT = TrainerSpec(num_train_steps=8, train_batch_size=4, checkpoint_every=4, steps_per_eval=8, max_eval_batches=2)


def local_entries() -> set[str]:
    """What the system temp folder holds at the top (a stray `s3:` folder would be there or in the cwd)."""
    return set(os.listdir(tempfile.gettempdir()))


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    where = tmp_path / "cwd"
    where.mkdir()
    monkeypatch.chdir(where)
    return where


def test_the_pipeline_on_s3_keeps_every_byte_in_the_bucket(s3_prefix, empty_cwd, tmp_path, monkeypatch):
    assert os.environ["AWS_ENDPOINT_URL_S3"].startswith("http://127.0.0.1:") and "AWS_ENDPOINT_URL" not in os.environ
    source = tmp_path / "source"
    generate_corpus(str(source), train_documents=300, validation_documents=40, seed=3, shards=2)
    corpus = url_download_step("raw/s3-stories", [str(source)])
    steps = language_model_pipeline("s3-stories", corpus, dataset="stories", vocab_size=400, model=TINY, trainer=SHORT,
                                    optimizer=OptimizerSpec(learning_rate=1e-2))
    temp_before = local_entries()

    outcomes = {step.name: materialize_step(step, prefix=s3_prefix, settings=FAST)
                for step in walk([steps["export"], steps["evaluate"]])}

    assert sorted(p.name for p in empty_cwd.iterdir()) == []  # no `s3:` folder, no logs
    assert not {e for e in local_entries() - temp_before if e.startswith("s3")}
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    tokenized = outcomes[steps["tokenized"].name].output_path
    assert tokenized.startswith(s3_prefix)
    for split in ("train", "validation"):  # the cache's arrays, not only its ledger
        assert fs.exists(f"{tokenized}/{split}/shard_ledger.json")
        assert fs.find(f"{tokenized}/{split}/input_ids/data"), f"no {split} token arrays in the bucket"
    train = outcomes[steps["train"].name]
    result = train.record.result
    assert result["checkpoint_steps"] == [4, 7] and result["checkpoint_dir"].startswith(s3_prefix)
    assert result["final_train_loss"] < result["loss_curve"][0][1]
    for step in result["checkpoint_steps"]:
        arrays = [p for p in fs.find(f"{result['checkpoint_dir']}/step-{step}") if not p.endswith(".json")]
        assert arrays, f"checkpoint step-{step} has no array data in the bucket"
    exported = outcomes[steps["export"].name].record.result
    assert exported["path"].startswith(s3_prefix)
    assert fs.exists(f"{exported['path']}/config.json") and fs.exists(f"{exported['path']}/model.safetensors")
    evaluated = outcomes[steps["evaluate"].name]
    assert evaluated.output_path.startswith(s3_prefix) and fs.exists(f"{evaluated.output_path}/results.json")
    assert 0 < evaluated.record.result["per_dataset"]["stories"]["loss"] < result["loss_curve"][0][1]
    rerun = materialize_step(steps["evaluate"], prefix=s3_prefix, settings=FAST)
    assert rerun.cached
