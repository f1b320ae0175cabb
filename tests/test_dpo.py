"""DPO, for real: preference pairs from the standard library's docstrings (chosen: the function's docstring;
rejected: another module's function's) → a preference cache with the SFT tests' BPE → the reference model's
log-probs as a step of their own → DPO of the SFT tests' tiny pretrained Llama at two β sharing that step.

The reference log-probs equal the reference model's own (a plain forward pass, masked by rendering the template
ourselves); the DPO run never loads the reference model (one model loaded, one model's parameters trained); the
run starts at policy = reference (loss ln 2) and ends preferring the held-out chosen answers; its record holds the
preference curves the UI plots; bad input fails naming the step and the cause; the whole is served by Dagster."""

import math
import os
from dataclasses import replace
from types import SimpleNamespace

import dagster as dg
import numpy as np
import pytest
from scipy.stats import binomtest

from marin_assets import StepDefinitionError, build_definitions, load_result, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import read_record
from marin_assets.core.step import walk
from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE, chat_template_of_cache, is_preference_cache
from marin_assets.pipeline.tokens.tokenize import TokenizedCache
from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer
from marin_assets.pipeline.training.dpo.reference_logprobs import (
    ReferenceLogprobs,
    ReferenceLogprobsStep,
    check_preference_cache,
    identity_of,
    reference_logprobs_step,
)
from marin_assets.pipeline.training.dpo.step import PREFERENCE_LEARNED, dpo_step
from marin_assets.pipeline.training.levanter_data import PreferenceCacheError, cache_format
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.sft.step import check_chat_components, sft_step
from marin_assets.pipeline.training.sources import from_checkpoint, from_hf
from marin_assets.pipeline.training.specs import ModelSpec
from marin_assets.pipeline.training.train_data import TrainDataError
from marin_assets.pipeline.training.training_run import LOSS_FELL, TrainResult
from tests.support.chat import assistant_positions
from tests.support.dpo import DPO_TRAINER, HELD_OUT_PAIRS, DpoSteps
from tests.support.helpers import FAST
from tests.test_preference_cache import read_pairs
from tests.test_sft import Pipeline


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pipeline = Pipeline(str(tmp_path_factory.mktemp("dpo") / "outputs"))
    return SimpleNamespace(p=pipeline, d=DpoSteps(pipeline, pipeline.base_export))


def reference_step_of(step) -> ReferenceLogprobsStep:
    (found,) = [d for d in step.deps if isinstance(d, ReferenceLogprobsStep)]
    return found


# --- the run: policy = reference at the start, the held-out preferences learned, curves recorded --------------

def test_dpo_learns_the_held_out_preferences_and_records_them_as_curves(built):
    result = built.p.result(built.d.dpo, TrainResult)
    dpo = result.method_metrics
    steps = DPO_TRAINER.num_train_steps
    assert result.method == "dpo" and dpo.beta == 0.1 and result.initialized_from == built.p.path(built.p.base_export)
    # The cached reference log-probs are the starting policy's own: every first-batch pair is a tie.
    assert result.loss_curve[0][1] == pytest.approx(math.log(2), abs=1e-4)
    assert dpo.train_chosen_reward_curve[0][1] == pytest.approx(0, abs=1e-4)
    assert dpo.train_rejected_reward_curve[0][1] == pytest.approx(0, abs=1e-4)
    assert [s for s, _ in dpo.train_accuracy_curve] == list(range(steps))
    evaluated = [s for s, _ in dpo.validation_accuracy_curve]
    assert evaluated == list(range(DPO_TRAINER.steps_per_eval - 1, steps, DPO_TRAINER.steps_per_eval))
    for chosen, rejected, margin in zip(dpo.validation_chosen_reward_curve, dpo.validation_rejected_reward_curve,
                                        dpo.validation_margin_curve, strict=True):
        assert margin[1] == pytest.approx(chosen[1] - rejected[1])
    # Held out, against the model it started from: the implicit reward's accuracy is the fraction of new pairs whose
    # chosen-minus-rejected log-prob the tuned model raised above the starting model's (at the start every pair is a
    # tie). Were DPO no better than a random nudge of the weights, raised and lowered would be even odds: a sign
    # test says how unlikely the count is then.
    assert dpo.validation_pairs == HELD_OUT_PAIRS
    started = built.p.result(reference_step_of(built.d.dpo), ReferenceLogprobs).splits["validation"].logprob_accuracy
    assert dpo.reference_logprob_accuracy["validation"] == started
    raised = round(dpo.final_validation_accuracy * HELD_OUT_PAIRS)
    assert binomtest(raised, HELD_OUT_PAIRS, 0.5, alternative="greater").pvalue < 0.01, dpo
    assert dpo.final_validation_margin > 0, dpo
    assert dpo.final_validation_loss < math.log(2) and result.final_eval_loss == dpo.final_validation_loss
    assert [p[0] for p in result.eval_curve] == evaluated
    assert set(dpo.reference_logprob_accuracy) == {"train", "validation"}
    record = read_record(built.p.path(built.d.dpo))
    for check in (LOSS_FELL, PREFERENCE_LEARNED):
        assert run_check(check, built.p.path(built.d.dpo), record.result).passed, check.name


# --- the reference log-probs: one step per (reference, data), equal to the model's own ---------------------------

def direct_logprobs(export: str, model: ModelSpec, tokenizer_dir: str, vocab: int, conversations, tmp_path):
    """Each conversation's summed log-prob of its assistant tokens under the exported model: one plain forward pass
    (Levanter's model, its logits only), the assistant tokens found by rendering every prefix with the template."""
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from levanter.layers.attention import AttentionMask

    from marin_assets.pipeline.training.levanter_model import model_config, write_reference_config
    from marin_assets.pipeline.training.levanter_trainer import trainer_config
    from marin_assets.pipeline.training.specs import TrainerSpec

    lm = model_config(model, write_reference_config(model, vocab, str(tmp_path / "ref")), tokenizer_dir)
    mesh = trainer_config(TrainerSpec(num_train_steps=1, train_batch_size=1), "direct", str(tmp_path), "direct")
    with mesh.use_device_mesh():
        network = lm.hf_checkpoint_converter().load_pretrained(lm.model_type, ref=export, config=lm,
                                                               dtype=jnp.float32)
    tokenizer = load_hf_tokenizer(tokenizer_dir)
    Pos = hax.Axis("position", model.seq_len)
    forward = jax.jit(lambda m, ids: jax.nn.log_softmax(m(hax.named(ids, Pos), AttentionMask.causal()).array, -1))
    sums = []
    for conversation in conversations:
        ids = tokenizer.apply_chat_template(conversation, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=True,
                                            return_dict=False)
        logp = np.asarray(forward(network, jnp.asarray(ids + [0] * (model.seq_len - len(ids)), dtype=jnp.int32)))
        targets = sorted(assistant_positions(tokenizer, DEFAULT_CHAT_TEMPLATE, conversation))
        sums.append(sum(float(logp[t - 1, ids[t]]) for t in targets))
    return np.asarray(sums)


def test_two_betas_share_one_reference_step_equal_to_the_models_own_log_probs(built, tmp_path):
    from marin_assets.pipeline.training.dpo.levanter_dpo import read_reference_cache

    d, p = built.d, built.p
    shared = reference_step_of(d.dpo)
    assert reference_step_of(d.dpo_sharper) == shared and d.dpo.hash != d.dpo_sharper.hash
    assert shared.output_path_under(p.prefix) == reference_step_of(d.dpo_sharper).output_path_under(p.prefix)
    assert [s for s in walk([d.dpo, d.dpo_sharper]) if isinstance(s, ReferenceLogprobsStep)] == [shared]
    assert shared.name == "reference-logprobs/exports-base--tokenized-prefs"
    assert "beta" not in shared.hash_attrs and "optimizer" not in shared.hash_attrs  # keyed by weights and data

    scored = p.result(shared, ReferenceLogprobs)
    cache = p.result(d.cache, TokenizedCache)
    assert {s: r.pairs for s, r in scored.splits.items()} == {s: st.documents for s, st in cache.splits.items()}
    base = p.result(p.base, TrainResult)
    for split, count in (("validation", HELD_OUT_PAIRS), ("train", 8)):
        pairs = read_pairs(p.path(d.prefs), split)[:count]
        chosen, rejected = read_reference_cache(scored.splits[split].path, identity_of(scored, split))  # Levanter's
        for side, cached in (("chosen", chosen[:count]), ("rejected", rejected[:count])):
            direct = direct_logprobs(p.path(p.base_export), d.model, base.tokenizer, base.vocab_size,
                                     [pair[side] for pair in pairs], tmp_path)
            np.testing.assert_allclose(cached, direct, rtol=1e-4, atol=2e-3)
        assert scored.splits[split].logprob_accuracy == pytest.approx(float(np.mean(chosen > rejected)))


def test_the_dpo_run_never_loads_the_reference_model(built, monkeypatch):
    import levanter.main.model_init as model_init

    d, p = built.d, built.p
    p.result(reference_step_of(d.dpo_sharper), ReferenceLogprobs)  # computed (or cached) before: not this run's work
    for step in walk([d.dpo_sharper])[:-1]:
        materialize_step(step, prefix=p.prefix)
    loaded = []
    original = model_init.load_model_from_source

    def spy(**kwargs):
        loaded.append(kwargs.get("hf_ref") or kwargs.get("checkpoint_path"))
        return original(**kwargs)

    monkeypatch.setattr(model_init, "load_model_from_source", spy)
    outcome = materialize_step(d.dpo_sharper, prefix=p.prefix)
    assert not outcome.cached
    assert loaded == [p.path(p.base_export)]  # the policy's starting weights, once; no reference model
    sharper = load_result(outcome.output_path, TrainResult)
    assert sharper.method_metrics.beta == 0.5 and sharper.loss_curve[0][1] == pytest.approx(math.log(2), abs=1e-4)
    # One model's parameters in the trainer state (Levanter's own DPO holds policy and reference: twice as many).
    assert sharper.parameter_count == p.result(p.base, TrainResult).parameter_count


# --- bad input ---------------------------------------------------------------------------------------------------

def test_bad_input_fails_clearly_naming_the_step_and_the_cause(built):
    d, p = built.d, built.p
    init = from_hf(p.base_export)
    with pytest.raises(StepDefinitionError, match=r"tokenized/chat is not a preference cache"):
        dpo_step("checkpoints/x", p.chat, init)
    with pytest.raises(StepDefinitionError, match=r"tokenized/docs is not a preference cache"):
        dpo_step("checkpoints/x", p.tokenized, init)
    with pytest.raises(StepDefinitionError, match="beta must be positive, got 0"):
        dpo_step("checkpoints/x", d.cache, init, beta=0)
    with pytest.raises(StepDefinitionError, match="init_from must say where the weights to tune are"):
        dpo_step("checkpoints/x", d.cache, p.base_export)
    elsewhere = reference_logprobs_step(None, init, d.cache, d.model, "p=f32,c=bfloat16")
    with pytest.raises(StepDefinitionError, match=r"were not computed for this run — mixed precision: the reference"
                                                  r" step's 'p=f32,c=bfloat16', this run's 'f32'"):
        dpo_step("checkpoints/x", d.cache, init, reference=elsewhere, model=d.model)
    with pytest.raises(StepDefinitionError, match=r"component\(s\) \['prefs'\] are preference caches .* use dpo_step"):
        sft_step("checkpoints/x", {"prefs": d.cache}, init, d.model)
    with pytest.raises(StepDefinitionError, match=r"component\(s\) \['prefs'\] are preference caches"):
        train_step("checkpoints/x", {"prefs": d.cache}, d.model)

    cache = p.result(d.cache, TokenizedCache)
    assert cache.preference and is_preference_cache(cache.path) and not is_preference_cache(p.path(p.chat))
    assert chat_template_of_cache(cache.path) == DEFAULT_CHAT_TEMPLATE  # its sides' template
    with pytest.raises(PreferenceCacheError, match="is a preference cache .* only DPO reads it"):
        cache_format(cache.path)  # what LM training and loss evaluation read caches through
    with pytest.raises(TrainDataError, match=r"SFT step 'x': component\(s\) \['prefs'\] are preference caches"):
        check_chat_components("x", {"prefs": cache})  # SFT's run-time check, for caches only a record describes
    text = p.result(p.tokenized, TokenizedCache)
    with pytest.raises(TrainDataError, match=r"step 'x': .*tokenized/docs_\w+ is not a preference cache"):
        check_preference_cache("step 'x'", text)

    # A side longer than the model's sequence: refused before any compute, naming the split and the lengths.
    short = replace(d.model, seq_len=64)
    step = dpo_step("checkpoints/dpo-short", d.cache, init, model=short, trainer=DPO_TRAINER)
    tokenizer = load_hf_tokenizer(p.path(p.bpe))
    rendered = {split: max(len(tokenizer.apply_chat_template(pair[side], chat_template=DEFAULT_CHAT_TEMPLATE,
                                                             tokenize=True, return_dict=False))
                           for pair in read_pairs(p.path(d.prefs), split) for side in ("chosen", "rejected"))
                for split in cache.splits}
    assert {split: st.max_tokens for split, st in cache.splits.items()} == rendered  # recorded from the arrays
    first = next(iter(cache.splits))  # the first split checked
    with pytest.raises(TrainDataError) as caught:
        for each in walk([step]):
            materialize_step(each, prefix=p.prefix, settings=FAST)
    message = str(caught.value)
    assert "step 'reference-logprobs/exports-base--tokenized-prefs'" in message  # the first step to read the pairs
    assert (f"the longest side of a pair in split {first!r} of {cache.path} has {rendered[first]:,} tokens, more than"
            " the model's seq_len 64; give the model a seq_len of at least") in message


# --- through Dagster -------------------------------------------------------------------------------------------

def test_dagster_serves_the_run_with_its_preference_curves(built, local_ray, dagster_home, monkeypatch):
    d, p = built.d, built.p
    monkeypatch.setenv("MARIN_PREFIX", p.prefix)
    tuned = reference_logprobs_step(None, from_checkpoint(d.dpo), d.cache)  # the tuned model's own log-probs
    defs = build_definitions([d.dpo, tuned])
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=dg.DagsterInstance.get())
    assert result.success
    events = {e.asset_key.to_user_string(): e.materialization for e in result.get_asset_materialization_events()}
    metadata = events["checkpoints/dpo"].metadata
    for curve in ("validation_accuracy_curve", "validation_margin_curve", "train_accuracy_curve",
                  "train_chosen_reward_curve", "validation_rejected_reward_curve"):
        assert isinstance(metadata[f"result.method_metrics.{curve}"], dg.MarkdownMetadataValue), curve  # a plot
        assert metadata[f"result.method_metrics.{curve}"].value.startswith("![")
    trained = load_result(d.dpo, TrainResult).dpo
    assert metadata["result.method_metrics.final_validation_accuracy"].value == trained.final_validation_accuracy
    assert metadata["result.method"].value == "dpo"
    scored = events["reference-logprobs/checkpoints-dpo--tokenized-prefs"]
    assert scored.metadata["cached"].value is False and os.path.isdir(scored.metadata["output_path"].value)
    # The tuned model scored on the held-out pairs by the step, from its last checkpoint, agrees with what the run
    # measured at its last evaluation.
    tuned_result = load_result(tuned, ReferenceLogprobs)
    assert tuned_result.splits["validation"].logprob_accuracy == pytest.approx(
        trained.final_validation_logprob_accuracy)
    # Pair by pair against the starting model (the reference step's log-probs): the pairs whose margin the tuned
    # model raised are the run's held-out accuracy, and on average it raised the margin.
    from marin_assets.pipeline.training.dpo.levanter_dpo import read_reference_cache

    start_result = load_result(reference_step_of(d.dpo), ReferenceLogprobs)
    start = start_result.splits["validation"]
    margins = {}
    for who, logprobs in (("start", start_result), ("tuned", tuned_result)):
        chosen, rejected = read_reference_cache(logprobs.splits["validation"].path, identity_of(logprobs,
                                                                                                "validation"))
        margins[who] = np.asarray(chosen) - np.asarray(rejected)
    raised = margins["tuned"] > margins["start"]
    # (one pair may fall the other way: the run measured in its training precision, the step in its own)
    assert float(raised.mean()) == pytest.approx(trained.final_validation_accuracy, abs=1 / HELD_OUT_PAIRS + 1e-9)
    assert float((margins["tuned"] - margins["start"]).mean()) > 0
    print(f"held out: log-prob accuracy {start.logprob_accuracy:.3f} (start) ->"
          f" {tuned_result.splits['validation'].logprob_accuracy:.3f}; margin raised on {int(raised.sum())} of"
          f" {raised.size} pairs")


# --- the experiment --------------------------------------------------------------------------------------------

def test_the_experiment_is_the_sft_demo_then_dpo_from_its_export():
    from marin_assets.experiments import dpo_chat, sft_chat

    pipeline = dpo_chat.pipeline
    assert pipeline["sft"] is sft_chat.pipeline["sft"]  # the demo's SFT, reused step for step
    dpo = pipeline["dpo"]
    assert dpo.init_from.source is sft_chat.pipeline["sft_export"] and reference_step_of(dpo) is pipeline[
        "sft_preferences"]
    assert pipeline["sft_preferences"].reference.source is sft_chat.pipeline["sft_export"]  # before: the SFT model
    assert pipeline["dpo_preferences"].reference.source is dpo  # after: the tuned model, on the same pairs
    assert pipeline["dpo_evaluate"].deps[0] is dpo and pipeline["prefs_cache"].preference
    specs = {s.key.to_user_string(): s for s in build_definitions(dpo_chat.steps).resolve_all_asset_specs()}
    assert {"dpo", "train"} <= set(specs["checkpoints/python-docs-chat-dpo"].kinds)
    assert "evals/python-docs-chat-sft" in specs and "exports/python-docs-chat-dpo" in specs


def test_the_experiments_pairs_put_another_conversations_answer_against_each_answer():
    from marin_assets.experiments.dpo_chat import _pairs

    conversations = [{"messages": [*([{"role": "system", "content": "S"}] if i % 2 else []),
                                   {"role": "user", "content": f"What does m.f{i} do?"},
                                   {"role": "assistant", "content": f"Answer {i}."},
                                   {"role": "user", "content": "And m.g?"}, {"role": "assistant", "content": "G."}]}
                     for i in range(6)]
    pairs = list(_pairs(iter(conversations), "0-train"))
    assert len(pairs) == 6 and pairs == list(_pairs(iter(conversations), "0-train"))  # deterministic
    for i, pair in enumerate(pairs):
        assert pair["prompt"] == conversations[i]["messages"][:1 + i % 2]  # the turns before the first answer
        assert pair["chosen"] == f"Answer {i}." and pair["rejected"] != pair["chosen"]
        assert pair["rejected"] in {f"Answer {j}." for j in range(6)}
