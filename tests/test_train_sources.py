"""Training from what exists, on real tokenizers: cl100k (id gaps) from adoption to bits per byte;
continuing from a Hugging Face folder and from another run's checkpoint; staged mixture weights;
token budgets; the data and tokenizer checks that fail before any compute; GPU steps ask for CUDA
(and train on it where JAX has CUDA, or fail at once saying so where it has not).

One small pipeline (generated stories and digit strings, a 400-id BPE) is built once for the
module; every model is the tiny Llama below, trained for a few steps."""

import functools
import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from marin_assets import Resources, Step, StepDefinitionError, load_result, materialize_step
from marin_assets.core.paths import using_prefix
from marin_assets.core.record import read_record
from marin_assets.core.step import walk
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.evals.loss import EvalResult, loss_eval_step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, tokenize, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import (
    bpe_tokenizer_step,
    existing_tokenizer_step,
    train_tokenizer,
)
from marin_assets.pipeline.training.export import export_step
from marin_assets.pipeline.training.pretrain.step import train_step, training_data_config
from marin_assets.pipeline.training.runner import platform_for
from marin_assets.pipeline.training.sources import TrainSourceError, from_checkpoint, from_hf
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TokenBudget, TrainerSpec
from marin_assets.pipeline.training.train_data import TrainDataError
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.helpers import ROOT, subprocess_env
from tests.support.real_tokenizers import CL100K_GAP, CL100K_MAX_ID, cl100k_folder

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
LR = OptimizerSpec(learning_rate=1e-2)
BATCH = 4
PER_BATCH = BATCH * TINY.seq_len
SHORT = TrainerSpec(num_train_steps=3, train_batch_size=BATCH, checkpoint_every=5, steps_per_eval=5,
                    max_eval_batches=1)
STAGES = [(0, {"stories": 1.0}), (8, {"stories": 1.0, "digits": 1.0})]
"""Digits join at step 8: 8 steps × 4 sequences = 32, a whole number of mixing blocks of 32 sequences."""
BUDGET = TokenBudget(train_tokens=12 * PER_BATCH - 100, component_tokens={"digits": 4 * PER_BATCH + 10})
"""⌈(12 × 256 − 100) ÷ 256⌉ = 12 steps; the first 4 batches' worth (16 sequences) of the digits."""


def write_digits(output_path: str, train: int, validation: int) -> dict:
    """Documents of random digit strings: tokens the stories (which hold no digit) never make."""
    rng = np.random.default_rng(7)
    for split, count in (("train", train), ("validation", validation)):
        os.makedirs(os.path.join(output_path, split), exist_ok=True)
        with open(os.path.join(output_path, split, "part.jsonl"), "w") as f:
            for _ in range(count):
                f.write(json.dumps({"text": " ".join(str(d) for d in rng.integers(0, 10, 60))}) + "\n")
    return {"train": train, "validation": validation}


def digits_step(name: str, train: int, validation: int = 20) -> Step:
    return Step(name=name, fn=lambda out: write_digits(out, train, validation),
                hash_attrs={"train": train, "validation": validation})


class Pipeline:
    """The module's steps under one prefix, materialized on demand (each at most once)."""

    def __init__(self, prefix: str, cl100k: str):
        self.prefix = prefix
        self.cl100k_folder = cl100k
        self.stories = corpus_step("raw/stories", train_documents=400, validation_documents=40, seed=1, shards=1)
        self.digits = digits_step("raw/digits", 150)
        self.bpe = bpe_tokenizer_step("tokenizers/bpe", self.stories, vocab_size=400)
        self.tok_stories = tokenize_step("tokenized/stories", self.stories, self.bpe)
        self.tok_digits = tokenize_step("tokenized/digits", self.digits, self.bpe)
        self.base = train_step("checkpoints/base", {"stories": self.tok_stories, "digits": self.tok_digits}, TINY, LR,
                               TrainerSpec(num_train_steps=999, train_batch_size=BATCH, checkpoint_every=5,
                                           steps_per_eval=6, max_eval_batches=1),
                               weights=STAGES, budget=BUDGET)
        self.export = export_step("exports/base", self.base)
        self.cl100k = existing_tokenizer_step("tokenizers/cl100k", cl100k)

    def make(self, *steps: Step):
        """Materialize `steps` and what they read; the outcome of the last."""
        outcome = None
        for step in walk(list(steps)):
            outcome = materialize_step(step, prefix=self.prefix)
        return outcome

    def result(self, step: Step, kind: type):
        self.make(step)
        return load_result(step.output_path_under(self.prefix), kind)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    return Pipeline(str(root / "outputs"), cl100k_folder(root / "cl100k"))


@pytest.fixture(scope="module")
def base(pipeline) -> TrainResult:
    return pipeline.result(pipeline.base, TrainResult)


def levanter_data(pipeline, weights, budget=None, steps=12):
    """The Levanter data config the base run trains on, for reading its sequences back."""
    caches = {k: pipeline.result(s, TokenizedCache).path for k, s in
              (("stories", pipeline.tok_stories), ("digits", pipeline.tok_digits))}
    tokenizer = pipeline.bpe.output_path_under(pipeline.prefix)
    trainer = replace(SHORT, num_train_steps=steps)
    return training_data_config(tokenizer, caches, weights, TINY, trainer, budget, vocab_size=512)


def digit_ids(pipeline) -> set[int]:
    from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer

    vocab = load_hf_tokenizer(pipeline.bpe.output_path_under(pipeline.prefix)).get_vocab()
    return {i for token, i in vocab.items() if any(c.isdigit() for c in token)}


# --- vocabulary: the tokenizer's largest id + 1, and ids with no token ----------------------------

def test_levanter_sees_the_model_vocabulary_and_ids_without_a_token_as_zero_bytes(tmp_path):
    from levanter.tokenizers import MarinTokenizer, load_tokenizer
    from levanter.utils.hf_utils import byte_length_of_token
    from transformers import AutoTokenizer

    from marin_assets.pipeline.tokens.tokenizer import model_vocab_size
    from marin_assets.pipeline.training.levanter_model import model_vocab_view

    folder = cl100k_folder(tmp_path / "cl100k")
    tokenizer = load_tokenizer(folder)  # the tokenizer as Levanter loads a run's
    assert len(tokenizer) == 100_261 and CL100K_GAP not in tokenizer.get_vocab().values()
    vocab = model_vocab_size(folder, TINY.vocab_multiple)
    assert vocab == 100_352 and vocab % 128 == 0 and vocab > CL100K_MAX_ID
    view = model_vocab_view(tokenizer, vocab)
    assert isinstance(view, MarinTokenizer) and len(view) == vocab == len(view.get_vocab())
    assert sorted(view.get_vocab().values()) == list(range(vocab))  # every id the model predicts has a name
    # Levanter's own byte count: zero for the gap, the padding rows and an added special token Levanter's
    # tokenizer does not list as special (cl100k's <|endofprompt|>), the text's bytes otherwise
    assert CL100K_MAX_ID not in tokenizer.all_special_ids
    hello = tokenizer.encode("hello")[0]
    assert [byte_length_of_token(view, i) for i in (CL100K_GAP, vocab - 1, CL100K_MAX_ID, hello)] == [0, 0, 0, 5]
    assert view.encode("hi there") == tokenizer.encode("hi there")
    view.as_hf_tokenizer().save_pretrained(str(tmp_path / "saved"))  # what an export saves: the tokenizer itself
    assert len(AutoTokenizer.from_pretrained(str(tmp_path / "saved"))) == 100_261
    with pytest.raises(ValueError, match="does not cover the tokenizer's largest id 100276"):
        model_vocab_view(tokenizer, 100_261)


def test_cl100k_adopted_tokenized_trained_and_evaluated(pipeline):
    """A real 100k tokenizer with id gaps, end to end: adopt → tokenize → train → bits per byte."""
    train_cache = tokenize_step("tokenized/stories-cl100k", pipeline.stories, pipeline.cl100k,
                                splits={"train": ["train/*"]})
    validation = tokenize_step("tokenized/stories-cl100k-val", pipeline.stories, pipeline.cl100k,
                               splits={"validation": ["validation/*"]})
    run = train_step("checkpoints/cl100k", {"stories": train_cache}, TINY, LR, SHORT)
    evaluation = loss_eval_step("evals/cl100k", run, {"stories": validation}, max_eval_batches=1)
    trained = pipeline.result(run, TrainResult)
    assert trained.vocab_size == 100_352  # largest id 100276 + 1, rounded up to a multiple of 128
    first = trained.loss_curve[0][1]
    assert abs(first - math.log(100_352)) < 1.0  # a fresh model predicts ids uniformly at first
    assert all(math.isfinite(loss) for _, loss in trained.loss_curve)
    with open(os.path.join(trained.hf_dir, "config.json")) as f:
        assert json.load(f)["vocab_size"] == 100_352
    with open(os.path.join(trained.hf_dir, "tokenizer_config.json")) as f:
        assert json.load(f)["tokenizer_class"] == "PreTrainedTokenizerFast"  # the tokenizer, not Levanter's view
    result = pipeline.result(evaluation, EvalResult)
    assert math.isfinite(result.loss) and result.loss < first
    assert result.bpb is not None and 0 < result.bpb < 20 and math.isfinite(result.per_dataset["stories"]["bpb"])


# --- staged weights and token budgets (the base run) -----------------------------------------------

def test_staged_weights_are_recorded_and_a_component_weighted_zero_is_not_read(pipeline, base):
    record = read_record(pipeline.base.output_path_under(pipeline.prefix))
    assert record.hash_attrs["weights"] == [[0, {"stories": 1.0}], [8, {"digits": 1.0, "stories": 1.0}]]
    assert base.final_train_loss < base.loss_curve[0][1]
    assert set(base.eval_losses) == {"stories", "digits"}

    import haliax as hax
    import jax
    from levanter.schedule import BatchSchedule

    config = levanter_data(pipeline, STAGES, BUDGET)
    mixture = config.train_set(hax.Axis("position", TINY.seq_len), BatchSchedule(BATCH),
                               key=jax.random.PRNGKey(0)).as_sync_dataset()
    digits = digit_ids(pipeline)

    def from_digits(indices) -> list[bool]:  # Levanter's named examples (`LmExample`)
        return [sum(t in digits for t in np.asarray(ex.tokens.array).tolist()) > TINY.seq_len // 4
                for ex in mixture.get_batch(indices)]

    assert not any(from_digits(range(0, 8 * BATCH)))  # steps 0-7: stories only
    later = from_digits(range(8 * BATCH, 12 * BATCH))  # steps 8-11: half and half
    assert sum(later) == len(later) // 2


def test_a_token_budget_sets_the_steps_and_limits_a_component_to_its_first_tokens(pipeline, base):
    assert base.steps == 12 == math.ceil(BUDGET.train_tokens / PER_BATCH)
    assert base.train_tokens == 12 * PER_BATCH and base.checkpoint_steps[-1] == 11
    record = read_record(pipeline.base.output_path_under(pipeline.prefix))
    assert record.hash_attrs["trainer"]["num_train_steps"] == 12  # identity holds the steps the run takes
    assert record.hash_attrs["budget"]["component_tokens"] == {"digits": 4 * PER_BATCH + 10}

    import haliax as hax
    import jax

    pos = hax.Axis("position", TINY.seq_len)
    budgeted = levanter_data(pipeline, STAGES, BUDGET).train_sets(pos, key=jax.random.PRNGKey(0),
                                                                 initial_batch_size=BATCH)["digits"]
    whole = levanter_data(pipeline, STAGES).train_sets(pos, key=jax.random.PRNGKey(0),
                                                       initial_batch_size=BATCH)["digits"]
    budgeted, whole = budgeted.as_sync_dataset(), whole.as_sync_dataset()
    assert len(budgeted) == 4 * BATCH < len(whole)  # whole batches of the first tokens: 16 sequences
    first = [np.asarray(ex.tokens) for ex in budgeted.get_batch(range(16))]  # per component: plain arrays
    assert all((a == np.asarray(b.tokens)).all() for a, b in zip(first, whole.get_batch(range(16)), strict=True))


def test_bad_stages_and_budgets_fail_where_they_are_written(pipeline):
    data = {"stories": pipeline.tok_stories, "digits": pipeline.tok_digits}

    def fails(match: str, **options) -> None:
        with pytest.raises(StepDefinitionError, match=match) as caught:
            train_step("checkpoints/bad", data, TINY, LR, replace(SHORT, num_train_steps=12), **options)
        assert "step 'checkpoints/bad'" in str(caught.value)

    fails(r"first mixture stage must start at step 0, got 2", weights=[(2, {"stories": 1.0})])
    fails(r"stage starts must increase, got \[0, 8, 8\]",
          weights=[(0, {"stories": 1.0}), (8, {"digits": 1.0}), (8, {"stories": 1.0})])
    fails(r"the stage at step 8 weighs unknown components \['code'\]",
          weights=[(0, {"stories": 1.0}), (8, {"code": 1.0})])
    fails(r"stage at step 20 starts after the last step \(the run has 12 steps\)",
          weights=[(0, {"stories": 1.0}), (20, {"digits": 1.0})])
    fails(r"the stage at step 8: mixture weights must be non-negative",
          weights=[(0, {"stories": 1.0}), (8, {"digits": -1.0})])
    fails(r"gives \['digits'\] no sequence of each mixing block of 4",
          weights=[(0, {"stories": 1.0}), (1, {"stories": 1.0, "digits": 0.1})])
    fails(r"token budgets name unknown components \['code'\]", budget=TokenBudget(component_tokens={"code": 10**6}))
    fails(r"token budgets \{'digits': 100\} are smaller than one batch \(4 sequences × 64 tokens = 256 tokens\)",
          budget=TokenBudget(component_tokens={"digits": 100}))
    with pytest.raises(ValueError, match="train_tokens must be positive"):
        TokenBudget(train_tokens=0)
    constant = train_step("checkpoints/same", data, TINY, LR, SHORT, weights={"stories": 1.0, "digits": 2.0})
    staged = train_step("checkpoints/same", data, TINY, LR, SHORT, weights=[(0, {"stories": 1.0, "digits": 2.0})])
    assert constant.hash == staged.hash  # one stage from step 0 is constant weights


# --- continuing from other weights ------------------------------------------------------------------

@pytest.fixture(scope="module")
def continued_run(pipeline) -> Step:
    return train_step("checkpoints/continued", {"stories": pipeline.tok_stories}, TINY, LR, SHORT,
                      init_from=from_checkpoint(pipeline.base))


@pytest.fixture(scope="module")
def continued(pipeline, base, continued_run) -> TrainResult:
    return pipeline.result(continued_run, TrainResult)


def test_continue_from_a_checkpoint_of_another_run(pipeline, base, continued_run, continued):
    assert pipeline.base in continued_run.deps and continued_run.hash_attrs["init_from"] == {
        "checkpoint_of": pipeline.base.name_with_hash, "checkpoint_step": None}
    assert continued.initialized_from == os.path.join(base.checkpoint_dir, "step-11")
    assert continued.vocab_size == base.vocab_size == 512
    start = continued.loss_curve[0][1]  # the source's final weights, before any update
    assert start < math.log(512) - 1.0  # a fresh model starts near ln(512) = 6.24 (the base run began at ~6.9)
    assert abs(start - base.eval_losses["stories"]) < 0.5  # where the source ended on this data
    assert continued.final_train_loss < start
    with using_prefix(pipeline.prefix):  # what per-checkpoint evaluation reads before the record exists
        assert continued_run.vocab_size() == pipeline.base.vocab_size() == 512
    earlier = train_step("checkpoints/continued", {"stories": pipeline.tok_stories}, TINY, LR, SHORT,
                         init_from=from_checkpoint(pipeline.base, step=5))
    assert earlier.hash_attrs["init_from"]["checkpoint_step"] == 5 and earlier.hash != continued_run.hash


def test_continue_from_a_hugging_face_folder(pipeline, continued):
    run = train_step("checkpoints/from-hf", {"stories": pipeline.tok_stories}, TINY, LR, SHORT,
                     init_from=from_hf(pipeline.export))
    assert run.hash_attrs["init_from"] == {"hf_step": pipeline.export.name_with_hash} and pipeline.export in run.deps
    from_export = pipeline.result(run, TrainResult)
    assert from_export.initialized_from == pipeline.export.output_path_under(pipeline.prefix)
    assert from_export.vocab_size == 512
    # The export holds the same weights as the checkpoint: the same run, loss for loss.
    assert [s for s, _ in from_export.loss_curve] == [s for s, _ in continued.loss_curve]
    assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(from_export.loss_curve, continued.loss_curve, strict=True))


def write_hf_llama(folder, hidden=32, intermediate=64, layers=1, heads=2, vocab=512, seed=0, **config) -> str:
    """A random Hugging Face `LlamaForCausalLM` folder written without torch: transformers' config,
    numpy weights under transformers' names, saved as safetensors."""
    import transformers
    from safetensors.numpy import save_file

    transformers.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
                             architectures=["LlamaForCausalLM"], **config).save_pretrained(str(folder))
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"model.layers.{i}.self_attn.{name}.weight"] = (hidden, hidden)
        shapes[f"model.layers.{i}.mlp.gate_proj.weight"] = (intermediate, hidden)
        shapes[f"model.layers.{i}.mlp.up_proj.weight"] = (intermediate, hidden)
        shapes[f"model.layers.{i}.mlp.down_proj.weight"] = (hidden, intermediate)
        shapes[f"model.layers.{i}.input_layernorm.weight"] = (hidden,)
        shapes[f"model.layers.{i}.post_attention_layernorm.weight"] = (hidden,)
    save_file({k: rng.normal(0, 0.02, s).astype(np.float32) for k, s in shapes.items()},
              str(folder / "model.safetensors"))
    return str(folder)


def test_a_plain_hugging_face_folder_is_checked_and_fingerprinted_where_the_step_is_written(pipeline, tmp_path):
    folder = write_hf_llama(tmp_path / "llama")  # transformers' default rms_norm_eps is 1e-6, ours 1e-5
    data = {"stories": pipeline.tok_stories}
    with pytest.raises(StepDefinitionError) as caught:
        train_step("checkpoints/hf-plain", data, TINY, LR, SHORT, init_from=from_hf(folder))
    text = str(caught.value)
    assert "step 'checkpoints/hf-plain'" in text and folder in text
    assert "norm_epsilon: this model 1e-05, the source 1e-06 (rms_norm_eps)" in text
    wider = replace(TINY, hidden_dim=64, norm_epsilon=1e-6)
    with pytest.raises(StepDefinitionError, match=r"hidden_dim: this model 64, the source 32 \(hidden_size\)"):
        train_step("checkpoints/hf-plain", data, wider, LR, SHORT, init_from=from_hf(folder))

    fits = replace(TINY, norm_epsilon=1e-6)
    step = train_step("checkpoints/hf-plain", data, fits, LR, SHORT, init_from=from_hf(folder))
    assert step.hash_attrs["init_from"]["hf_folder"] == folder
    write_hf_llama(tmp_path / "llama", seed=1)  # other weights in the same place: another identity
    assert train_step("checkpoints/hf-plain", data, fits, LR, SHORT, init_from=from_hf(folder)).hash != step.hash
    with pytest.raises(ValueError, match="is not a Hugging Face model folder: it has no config.json"):
        from_hf(str(tmp_path))
    # transformers 5 writes the rotary base inside `rope_parameters`
    other = write_hf_llama(tmp_path / "llama-rope", rms_norm_eps=1e-6,
                           rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    with pytest.raises(StepDefinitionError, match=r"rope_theta: this model 10000.0, the source 500000.0"):
        train_step("checkpoints/hf-plain", data, fits, LR, SHORT, init_from=from_hf(other))


def test_a_model_that_does_not_fit_the_source_checkpoint_is_a_definition_error(pipeline):
    other = replace(TINY, hidden_dim=64, intermediate_dim=128)
    with pytest.raises(StepDefinitionError) as caught:
        train_step("checkpoints/wrong-shape", {"stories": pipeline.tok_stories}, other, LR, SHORT,
                   init_from=from_checkpoint(pipeline.base))
    text = str(caught.value)
    assert "step 'checkpoints/wrong-shape'" in text and "the last checkpoint of checkpoints/base" in text
    assert "hidden_dim: this model 64, the source 32" in text
    assert "intermediate_dim: this model 128, the source 64" in text
    with pytest.raises(StepDefinitionError, match="from_checkpoint needs a training step"):
        from_checkpoint(pipeline.export)  # type: ignore[arg-type]


# --- checks before any compute ----------------------------------------------------------------------

def test_data_that_cannot_fill_a_batch_fails_before_training(pipeline):
    few = tokenize_step("tokenized/few-digits", digits_step("raw/few-digits", train=1), pipeline.bpe)
    run = train_step("checkpoints/too-little", {"stories": pipeline.tok_stories, "few": few}, TINY, LR, SHORT)
    counted = pipeline.result(few, TokenizedCache).splits["train"]
    with pytest.raises(TrainDataError) as caught:
        pipeline.make(run)
    assert str(caught.value).startswith(
        f"step 'checkpoints/too-little': component 'few' has {counted.tokens:,} train tokens in 1 document, less"
        " than one batch (4 sequences × 64 tokens = 256 tokens)")
    assert not os.path.exists(os.path.join(run.output_path_under(pipeline.prefix), "checkpoints"))
    with pytest.raises(TrainDataError, match=r"asks for the first 1,000,000 tokens of component 'digits', which has"
                                             r" only [\d,]+ train tokens"):
        pipeline.make(train_step("checkpoints/over-budget", {"digits": pipeline.tok_digits}, TINY, LR, SHORT,
                                 budget=TokenBudget(component_tokens={"digits": 10**6})))


def test_components_tokenized_with_different_tokenizers_fail_before_training(pipeline, base, tmp_path):
    """Caches that are not tokenize steps are compared when the run starts, by the records' fingerprints."""
    raw = pipeline.stories.output_path_under(pipeline.prefix)
    pipeline.make(pipeline.tok_stories)
    other = train_tokenizer(str(tmp_path / "other-tok"), raw, vocab_size=300).path
    ours = pipeline.bpe.output_path_under(pipeline.prefix)
    one = Step(name="tokenized/plain-one", fn=lambda out: tokenize(out, raw, ours), hash_attrs={"t": ours})
    two = Step(name="tokenized/plain-two", fn=lambda out: tokenize(out, raw, other), hash_attrs={"t": other})
    run = train_step("checkpoints/mixed", {"one": one, "two": two}, TINY, LR, SHORT)
    with pytest.raises(TrainDataError) as caught:
        pipeline.make(run)
    text = str(caught.value)
    first, second = (pipeline.result(s, TokenizedCache) for s in (one, two))
    assert text.startswith("step 'checkpoints/mixed': the mixture's components were tokenized with different"
                           " tokenizers")
    assert f"one: {ours} (fingerprint {first.tokenizer_fingerprint})" in text
    assert f"two: {other} (fingerprint {second.tokenizer_fingerprint})" in text
    assert not os.path.exists(os.path.join(run.output_path_under(pipeline.prefix), "checkpoints"))
    # Weights trained on one tokenizer do not continue on data of another.
    with pytest.raises(TrainSourceError) as caught:
        pipeline.make(train_step("checkpoints/other-tokenizer", {"two": two}, TINY, LR, SHORT,
                                 init_from=from_checkpoint(pipeline.base)))
    assert (f"step 'checkpoints/other-tokenizer': the last checkpoint of checkpoints/base was trained on tokenizer"
            f" {ours} (fingerprint {first.tokenizer_fingerprint}), but this run's data was tokenized with {other}"
            in str(caught.value))


# --- GPU ---------------------------------------------------------------------------------------------

GPU_PROBE = """
import importlib.util, json
import jax
from marin_assets.pipeline.training.levanter_trainer import CUDA_PLUGIN
try:
    found = jax.devices("gpu")
    print(json.dumps([found[0].device_kind, len(found)]))
except Exception as e:  # JAX raises a bare AssertionError when no backend starts
    why = f"{type(e).__name__}: {e}"
    if importlib.util.find_spec(CUDA_PLUGIN) is None:
        why = f"JAX's CUDA 13 plugin ({CUDA_PLUGIN}) is not installed"
    print(json.dumps(why))
"""


@functools.cache
def jax_gpus() -> tuple[str, int] | str:
    """JAX's CUDA devices here as (device kind, count), or why there are none: `jax.devices("gpu")` in a
    fresh process (JAX_PLATFORMS=cpu, the tests' setting, would hide a GPU from this one)."""
    proc = subprocess.run([sys.executable, "-c", GPU_PROBE], env=subprocess_env(JAX_PLATFORMS="cuda"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if isinstance(found, str):
        return f"no GPU for JAX here: jax.devices('gpu') fails ({found})"
    return found[0], found[1]


def test_a_gpu_step_asks_for_cuda_and_keeps_the_identity_of_its_cpu_twin(pipeline):
    gpu = train_step("checkpoints/gpu", {"stories": pipeline.tok_stories}, TINY, LR, SHORT, gpu=1, gpu_type="H100")
    cpu = train_step("checkpoints/gpu", {"stories": pipeline.tok_stories}, TINY, LR, SHORT)
    assert gpu.resources == Resources(cpu=1, gpu=1, gpu_type="H100")
    assert gpu.hash == cpu.hash  # hardware is not identity
    assert platform_for(gpu.resources) == "cuda" and platform_for(cpu.resources) is None
    assert platform_for(Resources(tpu_type="v5e-8")) == "tpu"
    from marin_assets.pipeline.sweeps import lr_model_sweep

    sweep = lr_model_sweep("gpu-sweep", {"stories": pipeline.tok_stories}, {"tiny": TINY}, [1e-2], trainer=SHORT,
                           gpu=1, budget=TokenBudget(train_tokens=5 * PER_BATCH))
    assert [(s.kind, s.resources.gpu) for s in sweep] == [("train", 1), ("eval", 1)]
    assert sweep[0].hash_attrs["trainer"].num_train_steps == 5


def test_a_gpu_step_without_cuda_in_jax_fails_at_once_saying_so(pipeline, tmp_path):
    if not isinstance(jax_gpus(), str):
        pytest.skip(f"JAX has CUDA here ({jax_gpus()[0]}): a GPU step trains (the next test), it does not fail")
    # JAX_PLATFORMS=cpu in the environment (the Makefile exports it; the Ray resource forwards it) does not
    # keep a GPU run on the CPU: it asks JAX for CUDA, and here, without JAX's CUDA plugin, fails at once.
    with using_prefix(pipeline.prefix):
        tokenizer, cache = pipeline.bpe.output_path, pipeline.result(pipeline.tok_stories, TokenizedCache).path
    out = tmp_path / "gpu-run"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "train_worker.py"), str(out), tokenizer,
                           cache, "cuda"], env=subprocess_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert (f"AcceleratorError: training at {out}: asked to run on 'cuda', but JAX 0.11.2 cannot start that"
            in proc.stderr)
    assert "(JAX's CUDA 13 plugin (jax-cuda13-plugin) is not installed)" in proc.stderr
    assert "pip install 'jax[cuda13]==0.11.2' (docs/gpu.md)" in proc.stderr
    assert not (out / "checkpoints").exists()


GPU_WORKER = """
import sys
from marin_assets import materialize_step
from marin_assets.pipeline.training.pretrain.step import train_step
from tests.test_train_sources import LR, SHORT, TINY, Pipeline

pipeline = Pipeline(sys.argv[1], sys.argv[2])
step = train_step("checkpoints/on-gpu", {"stories": pipeline.tok_stories}, TINY, LR, SHORT, gpu=1)
print("OUTPUT", materialize_step(step, prefix=pipeline.prefix).output_path, flush=True)
"""
"""Materializes the tiny GPU step in its own process: JAX starts on CUDA there, never in the test process."""


def test_a_gpu_step_trains_on_cuda_and_its_record_says_so(pipeline):
    found = jax_gpus()
    if isinstance(found, str):
        pytest.skip(found)
    kind, _ = found
    pipeline.make(pipeline.tok_stories)  # the data, made here on the CPU: the worker only trains
    # JAX_PLATFORMS=cpu, as the Makefile and the Ray resource set it: the GPU step overrides it. One GPU
    # visible, as Ray's CUDA_VISIBLE_DEVICES gives a gpu=1 task (the batch of 4 splits over 1, 2 or 4 only).
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    proc = subprocess.run([sys.executable, "-c", GPU_WORKER, pipeline.prefix, pipeline.cl100k_folder],
                          env=subprocess_env(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES=first), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [out] = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("OUTPUT ")]
    result = load_result(out, TrainResult)
    assert result.steps == SHORT.num_train_steps and result.checkpoint_steps[-1] == SHORT.num_train_steps - 1
    assert result.final_train_loss is not None and math.isfinite(result.final_train_loss)
    assert result.cost is not None
    assert (result.cost.device_kind, result.cost.device_count) == (kind, 1)  # JAX's CUDA device, not "cpu"
    assert result.cost.device_kind != "cpu" and result.cost.peak_flops_per_device > 0 and result.cost.mfu > 0
