"""The LLM steps for real on tiny inputs: train, resume after kill -9, export, per-checkpoint eval,
bad settings, the whole demo graph through Dagster on Ray, and the demo's real text."""

import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest

from marin_assets import StepDefinitionError, build_definitions, load_result, materialize_step
from marin_assets.core.step import walk
from marin_assets.experiments import python_docs, tiny_stories
from marin_assets.pipeline.data.python_docs import PythonDocs
from marin_assets.pipeline.evals.loss import EvalResult, evaluate_lm, loss_eval_step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, tokenize
from marin_assets.pipeline.training.checkpoints import checkpoint_steps
from marin_assets.pipeline.training.export import export_hf
from marin_assets.pipeline.training.pretrain.step import train_lm, train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, SpecError, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.helpers import ROOT, corpus_and_tokenizer, subprocess_env

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
FAST_LR = OptimizerSpec(learning_rate=1e-2)
SHORT = TrainerSpec(num_train_steps=12, train_batch_size=4, checkpoint_every=5, steps_per_eval=6, max_eval_batches=2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    raw, tok = corpus_and_tokenizer(root, train_documents=800, validation_documents=60, seed=1, shards=2)
    tokenize(str(root / "cache"), raw, tok)
    return root, tok, str(root / "cache")


@pytest.fixture(scope="module")
def trained(cache):
    root, tok, path = cache
    return train_lm(str(root / "train"), tok, {"stories": path}, {"stories": 1.0}, TINY, FAST_LR, SHORT)


def test_training_records_losses_checkpoints_and_curves(trained):
    assert trained.steps == 12 and trained.checkpoint_steps == [5, 10, 11]  # the last step is always saved
    assert trained.final_train_loss < trained.loss_curve[0][1]  # the loss fell
    # Levanter evaluates after every `steps_per_eval` updates (step indices 5, 11), and no longer before the first
    assert [s for s, _ in trained.eval_curve] == [5, 11] and "stories" in trained.eval_losses
    assert trained.eval_curve[-1][1] < trained.eval_curve[0][1]
    assert trained.tokens_per_second > 0 and trained.hf_dir.endswith("step-11")
    assert os.path.exists(os.path.join(trained.hf_dir, "model.safetensors"))


def test_export_and_evaluate_any_checkpoint(trained, cache, tmp_path):
    root, tok, path = cache
    handlers = logging.getLogger().handlers[:]
    exported = export_hf(str(tmp_path / "hf"), trained.checkpoint_path(), TINY, tok)
    assert logging.getLogger().handlers == handlers  # Levanter's logging setup does not outlive the call
    with open(os.path.join(exported.path, "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForCausalLM"]
    early = evaluate_lm(str(tmp_path / "e5"), trained.checkpoint_path(5), TINY, tok, {"stories": path})
    final = evaluate_lm(str(tmp_path / "e11"), trained.checkpoint_path(11), TINY, tok, {"stories": path})
    from_hf = evaluate_lm(str(tmp_path / "ehf"), exported.path, TINY, tok, {"stories": path})
    assert (early.step, final.step) == (5, 11)
    assert final.loss < early.loss and final.per_dataset["stories"]["bpb"] > 0
    assert abs(from_hf.loss - final.loss) < 1e-3  # the export is the same model


def test_killed_training_resumes_from_its_last_checkpoint(cache, tmp_path):
    root, tok, path = cache
    out = tmp_path / "train"
    args = [sys.executable, str(ROOT / "tests" / "support" / "train_worker.py"), str(out), tok, path]
    proc = subprocess.Popen(args, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = out / "checkpoints" / out.name
    deadline = time.time() + 240
    while checkpoint_steps(str(run_dir)) != [5] and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint_steps(str(run_dir))[:1] == [5], "no checkpoint before the kill"
    killed_at = checkpoint_steps(str(run_dir))
    assert 11 not in killed_at

    lines_before = (out / "metrics.jsonl").read_text().count("\n")
    result = train_lm(str(out), tok, {"stories": path}, {"stories": 1.0}, TINY, FAST_LR,
                      TrainerSpec(num_train_steps=12, train_batch_size=4, checkpoint_every=5, steps_per_eval=6,
                                  max_eval_batches=2, seed=0))
    new = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()[lines_before:]]
    resumed_steps = sorted({e["step"] for e in new if e.get("event") == "log" and "train/loss" in e["metrics"]})
    assert resumed_steps[0] == killed_at[-1] + 1  # continued after the last checkpoint, not from 0
    assert result.checkpoint_steps[-1] == 11


def test_bad_settings_fail_clearly():
    with pytest.raises(SpecError, match="num_train_steps must be positive"):
        TrainerSpec(num_train_steps=-5)
    with pytest.raises(SpecError, match="train_batch_size must be positive"):
        TrainerSpec(train_batch_size=0)
    with pytest.raises(SpecError, match="seq_len 4096 is longer than the model allows"):
        ModelSpec(seq_len=4096)
    corpus = tiny_stories.build(prefix="x")
    with pytest.raises(StepDefinitionError, match="mixture weights must be non-negative"):
        train_step("checkpoints/bad", {"a": corpus["tokenized"]}, weights={"a": -1.0})
    with pytest.raises(StepDefinitionError, match="mixture weights are all zero"):
        train_step("checkpoints/bad", {"a": corpus["tokenized"]}, weights={"a": 0.0})
    other = tiny_stories.build(prefix="x", vocab_size=512)
    with pytest.raises(StepDefinitionError, match="the mixture mixes tokenizers"):
        train_step("checkpoints/bad", {"a": corpus["tokenized"], "b": other["tokenized"]})


def small_pipeline(vocab_size=400):
    return tiny_stories.build(prefix="t", train_documents=600, validation_documents=40, vocab_size=vocab_size,
                              model=TINY, trainer=SHORT)


def test_the_whole_demo_graph_materializes_on_ray(prefix, local_ray, dagster_home):
    pipeline = small_pipeline()
    defs = build_definitions([pipeline["export"], pipeline["evaluate"]])
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=dg.DagsterInstance.get())
    assert result.success
    keys = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert keys == {"raw/t", "tokenizers/t-bpe", "tokenized/t-bpe", "checkpoints/t-llama", "exports/t-llama",
                    "evals/t-llama"}
    trained = load_result(pipeline["train"], TrainResult)
    assert trained.final_train_loss < trained.loss_curve[0][1]
    evaluation = load_result(pipeline["evaluate"], EvalResult)
    assert evaluation.step == 11 and evaluation.loss > 0
    # Export and evaluation learn the model and tokenizer from the training step's typed result,
    # not by searching its dependencies by kind: a cache of another kind (kind is not identity,
    # so the training is the same, cached) exports and evaluates all the same.
    assert trained.model == TINY and trained.tokenizer == pipeline["tokenizer"].output_path
    other_kind = dataclasses.replace(pipeline["tokenized"], kind="pretokenized")
    same_training = train_step("checkpoints/t-llama", {"stories": other_kind}, TINY, OptimizerSpec(), SHORT)
    assert same_training.hash == pipeline["train"].hash
    again = loss_eval_step("evals/t-llama-again", same_training, {"stories": other_kind}, checkpoint_step=5,
                          max_eval_batches=1)
    assert materialize_step(again).record.result["step"] == 5


def test_changing_vocab_size_makes_everything_downstream_unsynced_and_plan_names_it(prefix, local_ray,
                                                                                    dagster_home, tmp_path):
    from marin_assets.cli import previous_materializations
    from marin_assets.core.plan import plan
    from marin_assets.dagster.schedules import stale_or_missing

    before = small_pipeline(vocab_size=400)
    defs = build_definitions([before["export"], before["evaluate"]])
    instance = dg.DagsterInstance.get()
    assert defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance).success

    after = small_pipeline(vocab_size=420)
    new_defs = build_definitions([after["export"], after["evaluate"]])
    keys = list(new_defs.resolve_asset_graph().get_all_asset_keys())  # every one materialized: unsynced = stale
    stale = {k.to_user_string() for k in stale_or_missing(instance, new_defs.get_repository_def(), keys)}
    assert stale == {"tokenizers/t-bpe", "tokenized/t-bpe", "checkpoints/t-llama", "exports/t-llama",
                     "evals/t-llama"}

    steps = {s.name: s for s in after.values()}
    rows = {r.asset_key: r for r in plan(list(steps.values()), set(steps), prefix,
                                         previous=previous_materializations(steps))}
    assert rows["tokenizers/t-bpe"].changed == [{"field": "vocab_size", "old": 400, "new": 420}]
    assert rows["raw/t"].action == "reuse" and rows["tokenized/t-bpe"].action == "run"
    assert any(c["field"] == "deps[tokenizers/t-bpe]" for c in rows["tokenized/t-bpe"].changed)


def test_gpt2_trains_and_exports_offline(cache, tmp_path):
    root, tok, path = cache
    gpt2 = ModelSpec(family="gpt2", hidden_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
    result = train_lm(str(tmp_path / "gpt2"), tok, {"stories": path}, {"stories": 1.0}, gpt2, FAST_LR,
                      TrainerSpec(num_train_steps=6, train_batch_size=4, checkpoint_every=5, steps_per_eval=5,
                                  max_eval_batches=1))
    assert result.checkpoint_steps == [5]
    exported = export_hf(str(tmp_path / "hf"), result.checkpoint_path(), gpt2, tok)
    with open(os.path.join(exported.path, "config.json")) as f:
        assert json.load(f)["architectures"] == ["GPT2LMHeadModel"]


def test_a_sweep_expands_a_grid_sharing_the_tokenized_cache():
    from marin_assets.pipeline.sweeps import lr_model_sweep

    base = small_pipeline()
    models = {"xs": TINY, "s": ModelSpec(hidden_dim=64, intermediate_dim=128, num_layers=2, num_heads=2,
                                         num_kv_heads=2, seq_len=64)}
    steps = lr_model_sweep("sweep", {"stories": base["tokenized"]}, models, [1e-3, 3e-3], trainer=SHORT)
    names = [s.name for s in steps]
    assert names == ["checkpoints/sweep-xs-lr0.001", "evals/sweep-xs-lr0.001", "checkpoints/sweep-xs-lr0.003",
                     "evals/sweep-xs-lr0.003", "checkpoints/sweep-s-lr0.001", "evals/sweep-s-lr0.001",
                     "checkpoints/sweep-s-lr0.003", "evals/sweep-s-lr0.003"]
    trains = [s for s in steps if s.kind == "train"]
    assert len({s.hash for s in trains}) == 4
    assert all(s.deps == (base["tokenized"],) for s in trains)  # one shared cache
    keys = build_definitions(steps).resolve_asset_graph().get_all_asset_keys()
    assert len(keys) == 8 + 3  # + raw, tokenizer, tokenized


def test_the_demo_learns_pythons_documentation_from_about_ln_vocab(prefix):
    """The demo's pipeline at test size on its real corpus: every document of both splits reaches the
    cache, and the loss starts where an untrained model's does — about ln(vocab) — and falls."""
    pipeline = python_docs.build(prefix="docs", vocab_size=400, model=TINY, trainer=SHORT, optimizer=FAST_LR)
    for step in walk([pipeline["train"]]):
        materialize_step(step)
    corpus = load_result(pipeline["corpus"], PythonDocs)
    cache = load_result(pipeline["tokenized"], TokenizedCache)
    assert cache.splits["train"].documents == corpus.train.documents > 3000
    assert cache.splits["validation"].documents == corpus.validation.documents > 100
    trained = load_result(pipeline["train"], TrainResult)
    first_train = trained.loss_curve[0][1]  # step 0's loss: the untrained model's (Levanter evaluates only later)
    assert trained.vocab_size is not None  # the model's vocabulary: the tokenizer's, rounded up
    uniform = math.log(trained.vocab_size)  # the loss of a uniform guess
    assert abs(first_train - uniform) < 1
    assert trained.final_train_loss < first_train - 0.5 and trained.final_eval_loss < first_train - 0.5
    assert trained.eval_losses.keys() == {"python-docs"}
