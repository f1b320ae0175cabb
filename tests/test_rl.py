"""RL from verifiable rewards, for real: the environments' rewards on tricky answers, RLOO against a direct
computation, the clipped objective, and a short RL run of a tiny Llama — trained first on worked examples of
sequential digits (tokenized with a BPE of the standard library's docstrings) — whose pass rate rises; two runs of
the RL step (one killed midway and resumed) end with identical records and weights, and a re-run through Dagster
is a cache hit.

One pipeline is built once for the module (a 512-id BPE, a one-layer Llama, a few steps each)."""

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from marin_assets import Step, StepDefinitionError, build_definitions, load_result, materialize_step
from marin_assets.core.record import read_record
from marin_assets.core.step import walk
from marin_assets.dagster.instance import write_instance_yaml
from marin_assets.pipeline.tokens.chat import chat_tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.export import ExportResult, export_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.rl import levanter_rl
from marin_assets.pipeline.training.rl.envs import (
    Addition,
    Problem,
    SequentialDigits,
    solved,
    worked_examples_step,
)
from marin_assets.pipeline.training.rl.rloo import rloo_advantages
from marin_assets.pipeline.training.rl.step import PASS_RATE_MEASURED, RlSpec, rl_step
from marin_assets.pipeline.training.sources import from_checkpoint
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.chat import write_docs_dataset

# --- rewards ------------------------------------------------------------------------------------------------------

ADDITION = Addition(digits=2)
SUM = Problem("12+34", "46")


@pytest.mark.parametrize("completion, reward", [
    ("46", 1.0), (" 46\n", 1.0), ("\t46  ", 1.0),  # surrounding whitespace never matters
    ("046", 1.0), ("+46", 1.0), ("0000046", 1.0),  # a verifier: the value, not the spelling
    ("47", 0.0), ("-46", 0.0), ("", 0.0), ("   ", 0.0),
    ("46 apples", 0.0), ("46\n12+3", 0.0), ("The answer is 46", 0.0),  # extra text is not the answer
    ("4 6", 0.0), ("46.", 0.0), ("46.0", 0.0), ("0x2e", 0.0), ("٤٦", 0.0),  # nor other spellings (Arabic-Indic digits)
])
def test_addition_reward_is_the_value_of_a_bare_integer(completion, reward):
    assert ADDITION.reward(SUM, completion) == reward
    assert solved(ADDITION, SUM, completion) == (reward == 1.0)


SEQUENCE = Problem("4 5 6 7", "8 9 0 1")


@pytest.mark.parametrize("completion, reward", [
    ("8 9 0 1", 1.0), ("  8 9\t0  1\n", 1.0),  # any whitespace between and around the digits
    ("8 9", 0.5), ("8 9 0 1 2", 0.8), ("8 9 0 1 done", 0.8),  # missing or extra items cost
    ("8 9 0 2", 0.75), ("9 0 1 2", 0.0), ("8901", 0.0),  # one item, not four
    ("", 0.0), ("\n", 0.0), ("08 9 0 1", 0.75),  # a digit is one character: 08 is not 8
])
def test_sequential_digits_reward_gives_partial_credit_by_position(completion, reward):
    assert SequentialDigits().reward(SEQUENCE, completion) == pytest.approx(reward)
    assert solved(SequentialDigits(), SEQUENCE, completion) == (reward == 1.0)


@pytest.mark.parametrize("env", [Addition(digits=1), Addition(digits=2), Addition(digits=6, max_problems=300),
                                 SequentialDigits(), SequentialDigits(length=2, min_prompt=1, max_prompt=8, seed=3)])
def test_splits_are_disjoint_seeded_and_answered(env):
    train, held = env.problems("train"), env.problems("held_out")
    assert train and held and not {p.prompt for p in train} & {p.prompt for p in held}
    assert env.problems("train") == train  # the same seed, the same problems in the same order
    assert all(env.reward(p, p.answer) == 1.0 and env.reward(p, "") == 0.0 for p in train[:50] + held[:50])
    with pytest.raises(ValueError, match="unknown split"):
        env.problems("test")


def test_addition_problems_are_sums_and_another_seed_splits_otherwise():
    problems = Addition(digits=3, max_problems=100).problems("train")
    assert len(problems) == 100
    for p in problems:
        a, b = p.prompt.split("+")
        assert int(p.answer) == int(a) + int(b) and 0 <= int(a) < 1000 and 0 <= int(b) < 1000
    assert Addition(digits=3, max_problems=100, seed=1).problems("train") != problems
    assert SequentialDigits().problems("held_out")[0] == Problem("7 8 9 0 1", "2 3 4 5")


def test_bad_environments_and_settings_fail_when_defined():
    with pytest.raises(StepDefinitionError, match="digits must be 1 to 9"):
        Addition(digits=0)
    with pytest.raises(StepDefinitionError, match="samples_per_prompt must be at least 2"):
        RlSpec(samples_per_prompt=1)
    with pytest.raises(StepDefinitionError, match="temperature must be positive"):
        RlSpec(temperature=0.0)


def test_bad_rl_steps_fail_when_defined_and_bad_data_names_the_step(tmp_path):
    source = from_checkpoint(Pipeline(str(tmp_path)).sft)  # defined, never run
    with pytest.raises(StepDefinitionError, match="RL step 'rl/x': init_from must say where the weights"):
        rl_step("rl/x", "exports/base", ENV)  # type: ignore[arg-type]
    with pytest.raises(StepDefinitionError, match="RL step 'rl/x': env must be an RL environment"):
        rl_step("rl/x", source, object())  # type: ignore[arg-type]
    with pytest.raises(StepDefinitionError, match="RL step 'rl/x': rl must be an RlSpec"):
        rl_step("rl/x", source, ENV, {"seed": 1})  # type: ignore[arg-type]
    too_many = worked_examples_step("raw/too-many", ENV, train=500, validation=5)
    with pytest.raises(ValueError, match=r"(?s)has 59 train problems, fewer than the 500 .*step 'raw/too-many'"):
        materialize_step(too_many, prefix=str(tmp_path))


# --- RLOO and the objective ----------------------------------------------------------------------------------------

def test_rloo_advantages_equal_a_direct_leave_one_out():
    rewards = np.random.default_rng(0).random((5, 4)).astype(np.float32)
    got = rloo_advantages(rewards)
    for p in range(5):
        for i in range(4):
            others = [rewards[p, j] for j in range(4) if j != i]
            assert got[p, i] == pytest.approx(rewards[p, i] - sum(others) / len(others), abs=1e-6)
    assert np.all(rloo_advantages(np.ones((3, 8))) == 0)  # every sample alike: nothing to learn
    assert rloo_advantages(np.array([[1.0, 0.0]])).tolist() == [[1.0, -1.0]]
    with pytest.raises(ValueError, match="k ≥ 2"):
        rloo_advantages(np.ones((4, 1)))


def test_the_clipped_objective_matches_a_direct_computation():
    rng = np.random.default_rng(1)
    logp, old, ref = (rng.normal(-2, 0.3, (3, 5)).astype(np.float32) for _ in range(3))
    mask = np.array([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=np.float32)
    adv = np.array([1.0, -0.5, 0.25], dtype=np.float32)
    eps, beta = 0.2, 0.1
    loss, metrics = levanter_rl.rl_objective(logp, old, ref, mask, adv, eps, beta)
    terms, kls, clipped = [], [], 0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                ratio = np.exp(float(logp[b, t]) - float(old[b, t]))
                terms.append(min(ratio * adv[b], np.clip(ratio, 1 - eps, 1 + eps) * adv[b]))
                d = float(ref[b, t]) - float(logp[b, t])
                kls.append(np.exp(d) - d - 1)
                clipped += abs(ratio - 1) > eps
    assert float(metrics["pg_loss"]) == pytest.approx(-np.mean(terms), rel=1e-5)
    assert float(metrics["kl"]) == pytest.approx(np.mean(kls), rel=1e-5)
    assert float(loss) == pytest.approx(-np.mean(terms) + beta * np.mean(kls), rel=1e-5)
    assert float(metrics["clip_fraction"]) == pytest.approx(clipped / len(terms))
    assert 0 < clipped < len(terms)  # the draw exercises both sides of the clip


def test_sampling_layout_spans_and_masks():
    tokens, lengths = levanter_rl.layout([[5, 6], [7, 8, 9]], 8, pad=0)
    assert tokens.tolist() == [[5, 6, 0, 0, 0, 0, 0, 0], [7, 8, 9, 0, 0, 0, 0, 0]] and lengths.tolist() == [2, 3]
    tokens[0, 2:5] = [11, 2, 2]  # EOS (2) after one token
    tokens[1, 3:8] = [12, 13, 14, 15, 16]  # no EOS within max_new=5
    spans = levanter_rl.completion_spans(tokens, lengths, 5, eos=2)
    assert spans.tolist() == [2, 5]
    assert levanter_rl.loss_mask(lengths, spans, 8).tolist() == [[0, 0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1]]
    chosen = [levanter_rl.choose_problems(4, 10, seed=0, iteration=i).tolist() for i in (0, 1, 0)]
    assert chosen[0] == chosen[2] != chosen[1] and len(set(chosen[0])) == 4


# --- a short RL run on a task a tiny model can learn --------------------------------------------------------------

ENV = SequentialDigits(length=1, min_prompt=1, max_prompt=8)
"""The next digit after a run (`4 5 6` → `7`): 59 training and 21 held-out runs."""
TINY = ModelSpec(hidden_dim=64, intermediate_dim=128, num_layers=2, num_heads=2, num_kv_heads=2, seq_len=64)
SFT_TRAINER = TrainerSpec(num_train_steps=25, train_batch_size=8, checkpoint_every=1000, steps_per_eval=1000,
                          max_eval_batches=1)
SFT_OPTIMIZER = OptimizerSpec(learning_rate=1e-2, weight_decay=0.0, warmup=0.0, lr_schedule="constant")
RL = RlSpec(prompts_per_step=16, samples_per_prompt=8, max_new_tokens=4, updates_per_rollout=2, held_out_problems=64,
            eval_every=10, samples_logged=4)
"""Two optimizer steps on each rollout: the second sees a probability ratio off 1, so the clip is exercised."""
RL_OPTIMIZER = OptimizerSpec(learning_rate=2e-3, weight_decay=0.0, warmup=0.0, lr_schedule="constant")
RL_TRAINER = TrainerSpec(num_train_steps=40, checkpoint_every=10)
STOP_AT = 7
"""The iteration (steps 14 and 15) at which the interrupted run is killed: after the checkpoint of step 10."""


class Pipeline:
    """The module's steps: docs → BPE; worked examples → chat cache → a tiny Llama trained on them → RL → export."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.docs = Step(name="raw/docs", fn=lambda out: write_docs_dataset(Path(out)), hash_attrs={"v": 1})
        self.bpe = bpe_tokenizer_step("tokenizers/docs-bpe", self.docs, vocab_size=512)
        self.examples = worked_examples_step("raw/next-digit", ENV, train=59, validation=21)
        self.chat = chat_tokenize_step("tokenized/next-digit", self.examples, self.bpe)
        self.sft = train_step("checkpoints/next-digit-sft", {"chat": self.chat}, TINY, SFT_OPTIMIZER, SFT_TRAINER)
        self.rl = rl_step("checkpoints/next-digit-rl", from_checkpoint(self.sft), ENV, RL, optimizer=RL_OPTIMIZER,
                          trainer=RL_TRAINER)
        self.export = export_step("exports/next-digit-rl", self.rl)

    def result(self, step: Step, kind: type, prefix: str | None = None):
        """Materialize `step` and what it reads, in this process; its typed result."""
        for each in walk([step]):
            materialize_step(each, prefix=prefix or self.prefix)
        return load_result(step.output_path_under(prefix or self.prefix), kind)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return Pipeline(str(tmp_path_factory.mktemp("rl") / "outputs"))


@pytest.fixture(scope="module")
def trained(pipeline):
    """The RL run, in this process (and what it reads)."""
    return pipeline.result(pipeline.rl, TrainResult)


@pytest.fixture(scope="module")
def served(pipeline, trained, local_ray, tmp_path_factory):
    """The RL step and its export materialized through Dagster, twice: the RL step is a cache hit both times, the
    export computed the first time."""
    home = tmp_path_factory.mktemp("dagster_home")
    write_instance_yaml(home / "dagster.yaml")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        mp.setenv("MARIN_PREFIX", pipeline.prefix)
        defs = build_definitions([pipeline.export])
        with dg.DagsterInstance.ephemeral() as instance:
            job = defs.resolve_implicit_global_asset_job_def()
            first, again = job.execute_in_process(instance=instance), job.execute_in_process(instance=instance)
    assert first.success and again.success

    def events(run):
        return {e.asset_key.to_user_string(): e.materialization for e in run.get_asset_materialization_events()}

    return events(first), events(again)


def test_rl_raises_the_pass_rate_and_records_it(pipeline, trained):
    result = trained
    rl = result.method_metrics
    assert result.method == "rl" and rl is not None and result.steps == RL_TRAINER.num_train_steps
    assert rl.environment == ENV.identity() and rl.held_out_problems == len(ENV.problems("held_out")) == 21
    held = dict((int(s), v) for s, v in rl.held_out_pass_rate_curve)
    assert sorted(held) == [0, 10, 20, 30, 40]  # every eval_every steps and after the last update
    assert rl.initial_held_out_pass_rate == held[0] and rl.final_held_out_pass_rate == held[40]
    assert rl.final_held_out_pass_rate > rl.initial_held_out_pass_rate  # held-out problems: never trained on
    assert [s for s, _ in rl.reward_curve] == list(range(0, 40, 2))  # one rollout per two steps
    rewards = [r for _, r in rl.reward_curve]
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.05
    assert max(c for _, c in rl.clip_fraction_curve) > 0  # a second update on a rollout: ratios leave 1 ± ε
    kl = [v for _, v in rl.kl_curve]
    assert abs(kl[0]) < 1e-5 and max(kl) > 1e-3  # the first update starts at the initial policy, then moves
    assert all(1 <= n <= RL.max_new_tokens for _, n in rl.completion_tokens_curve)
    # the tokens trained on are the rollouts' real lengths, fewer than the padded sequences, more than the completions
    sequences = RL_TRAINER.num_train_steps * RL.prompts_per_step * RL.samples_per_prompt
    completion = sum(n * RL.prompts_per_step * RL.samples_per_prompt * RL.updates_per_rollout
                     for _, n in rl.completion_tokens_curve)
    assert completion < result.train_tokens < sequences * result.model.seq_len
    assert rl.sampling_tokens_per_second and rl.update_tokens_per_second
    # The samples: held-out greedy completions at the first and last evaluation, scored by the environment.
    assert {(s.split, s.step) for s in rl.samples} == {("held_out", 0), ("held_out", 40), ("train", 38)}
    held_out = {p.prompt: p for p in ENV.problems("held_out")}
    for s in rl.samples:
        if s.split == "held_out":
            assert s.reward == ENV.reward(held_out[s.prompt], s.completion) and s.answer == held_out[s.prompt].answer
    assert PASS_RATE_MEASURED.fn("", read_record(pipeline.rl.output_path_under(pipeline.prefix)).result).passed


def test_each_write_of_samples_is_a_file_of_its_own_and_a_single_old_file_still_reads(pipeline, trained, tmp_path):
    """The samples are added a file per write (an evaluation, a rollout), never read back and rewritten whole."""
    out = pipeline.rl.output_path_under(pipeline.prefix)
    files = sorted(os.listdir(os.path.join(out, levanter_rl.SAMPLES_DIR)))
    assert len(files) == 5 + 20, files  # five evaluations (steps 0, 10, 20, 30, 40) and twenty rollouts
    for name in files:
        split, step = name.removesuffix(".jsonl").rsplit("-", 1)
        rows = [json.loads(line) for line in Path(out, levanter_rl.SAMPLES_DIR, name).read_text().splitlines()]
        assert rows and {(r["split"], r["step"]) for r in rows} == {(split, int(step))}, name
    # a run of 0.1 kept every row in one file: it still reads, a later write of the same row replacing it
    old = tmp_path / "old-run"
    (old / levanter_rl.SAMPLES_DIR).mkdir(parents=True)
    row = {"split": "held_out", "step": 0, "index": 0, "prompt": "p", "answer": "1", "completion": "2", "reward": 0.0}
    (old / levanter_rl.SAMPLES_FILE).write_text(json.dumps(row) + "\n" + json.dumps({**row, "index": 1}) + "\n")
    (old / levanter_rl.SAMPLES_DIR / "held_out-000000000.jsonl").write_text(json.dumps({**row, "reward": 1.0}) + "\n")
    assert [(r["index"], r["reward"]) for r in levanter_rl.read_samples(str(old))] == [(0, 1.0), (1, 0.0)]


def test_dagster_serves_the_run_with_its_curves_and_a_rerun_is_a_cache_hit(pipeline, trained, served):
    first, again = served
    for events in (first, again):
        metadata = events["checkpoints/next-digit-rl"].metadata
        assert metadata["cached"].value is True  # materialized before, in this process: the same identity
        for curve in ("reward_curve", "held_out_pass_rate_curve", "kl_curve", "completion_tokens_curve"):
            assert metadata[f"result.method_metrics.{curve}"].value.startswith("!["), curve  # a plot
        assert metadata["result.method"].value == "rl"
        assert isinstance(metadata["result.method_metrics.samples"], dg.TableMetadataValue)  # completions, rewards
        assert metadata["result.method_metrics.samples.count"].value == len(trained.method_metrics.samples)
    assert first["exports/next-digit-rl"].metadata["cached"].value is False
    assert again["exports/next-digit-rl"].metadata["cached"].value is True
    exported = load_result(pipeline.export.output_path_under(pipeline.prefix), ExportResult)
    assert os.path.exists(os.path.join(exported.path, "config.json"))
    assert exported.step == trained.checkpoint_steps[-1]  # the last checkpoint


def test_a_killed_run_resumes_to_the_uninterrupted_runs_record_and_weights(pipeline, trained, tmp_path, monkeypatch):
    """A second run of the same step under another prefix, killed at iteration STOP_AT and materialized again, ends
    with exactly the first run's curves, samples and weights: the run is deterministic and its resumption exact."""
    other = str(tmp_path / "outputs")
    rl_out = os.path.relpath(pipeline.rl.output_path_under(pipeline.prefix), pipeline.prefix)
    shutil.copytree(pipeline.prefix, other, ignore=lambda folder, names: [  # what the RL step reads, not its output
        n for n in names if os.path.relpath(os.path.join(folder, n), pipeline.prefix) in (rl_out, "exports")])
    real = levanter_rl.choose_problems

    def killed(count, available, seed, iteration):
        if iteration == STOP_AT:
            raise KeyboardInterrupt  # not an Exception: as a kill, nothing below catches it
        return real(count, available, seed, iteration)

    monkeypatch.setattr(levanter_rl, "choose_problems", killed)
    with pytest.raises(KeyboardInterrupt):
        materialize_step(pipeline.rl, prefix=other)
    out = pipeline.rl.output_path_under(other)
    assert "step-10" in os.listdir(os.path.join(out, "checkpoints", os.path.basename(out)))
    saved = sorted(os.listdir(os.path.join(out, levanter_rl.ROLLOUTS_DIR)))
    assert saved == [f"iteration-{i}.npz" for i in range(STOP_AT)]  # each rollout kept as it was sampled
    monkeypatch.setattr(levanter_rl, "choose_problems", real)
    loaded = []
    read = levanter_rl.Rollout.load
    monkeypatch.setattr(levanter_rl.Rollout, "load", classmethod(lambda cls, url: loaded.append(url) or read(url)))
    resumed = pipeline.result(pipeline.rl, TrainResult, prefix=other)
    # Resumed from step 10 with the rollout of iteration 5 as it was sampled before the kill
    assert loaded[0].endswith("iteration-5.npz")
    first = trained
    assert resumed.method_metrics is not None and first.method_metrics is not None
    timing = {"sampling_tokens_per_second", "update_tokens_per_second"}
    assert {k: v for k, v in vars(resumed.method_metrics).items() if k not in timing} == {
        k: v for k, v in vars(first.method_metrics).items() if k not in timing}
    assert resumed.loss_curve == first.loss_curve and resumed.checkpoint_steps == first.checkpoint_steps
    weights = [Path(r.hf_dir, "model.safetensors").read_bytes() for r in (first, resumed)]
    assert weights[0] == weights[1]
    attempts = json.loads(Path(out, "train_attempts.json").read_text())["seconds"]
    assert len(attempts) == 1  # the killed attempt's time is lost with it; the resumed one is counted


# --- the experiment ------------------------------------------------------------------------------------------------

def test_the_experiment_is_the_demo_then_sft_on_worked_examples_then_rl():
    from marin_assets.experiments import python_docs, rl_arithmetic

    pipeline = rl_arithmetic.pipeline
    assert pipeline["sft"].init_from.source is python_docs.pipeline["export"]  # the demo's pretrained model
    assert pipeline["rl"].init_from.source is pipeline["sft"] and pipeline["rl"] in pipeline["rl_export"].deps
    assert pipeline["rl_evaluate"].deps[0] is pipeline["rl"] and pipeline["sft_evaluate"].deps[0] is pipeline["sft"]
    env = rl_arithmetic.ENV
    assert len(env.problems("train")) >= rl_arithmetic.WORKED_EXAMPLES  # SFT trains on training problems only
    assert rl_arithmetic.SFT_TRAINER.num_train_steps * rl_arithmetic.SFT_TRAINER.train_batch_size >= 300
    specs = {s.key.to_user_string(): s for s in build_definitions(rl_arithmetic.steps).resolve_all_asset_specs()}
    assert {"rl", "train"} <= set(specs["checkpoints/rl-digits-rl"].kinds)
    assert "exports/rl-digits-rl" in specs and "evals/rl-digits-sft" in specs
