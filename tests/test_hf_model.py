"""Hugging Face models in and out: a tiny Llama trained here and exported (the library's own Hugging Face
folder, tokenizer included) is published on a local Hub (`tests/support/hub_server.py`, the real
`huggingface_hub` client), copied back at a pinned commit by `hf_model_step`, converted into a Levanter
checkpoint by `hf_to_levanter_step`, and read three ways that must agree: the converted checkpoint, the
training checkpoint it was exported from (both through Levanter) and the safetensors themselves through an
independent NumPy forward pass of the Llama architecture. Then the conversion is evaluated, and a run starts
from it with `from_checkpoint`, through Dagster. Repositories that are not models fail before any weight is
copied, naming what is missing.

One pipeline (generated stories, a 400-id BPE, a one-layer Llama) is built once for the module."""

import glob
import json
import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from marin_assets import StepDefinitionError, build_definitions, load_result, materialize_step
from marin_assets.core.step import walk
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.data.download import DownloadError
from marin_assets.pipeline.evals.loss import EvalResult, evaluate_lm, loss_eval_step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.export import ExportResult, export_step
from marin_assets.pipeline.training.hf_model import HfModel, HfModelError, hf_model_step, model_spec_of
from marin_assets.pipeline.training.hf_to_levanter import LevanterCheckpoint, hf_to_levanter_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.sources import from_checkpoint, from_hf
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.helpers import output_files
from tests.support.hub_server import HubRepo, HubServer, release_hub, use_hub

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
LR = OptimizerSpec(learning_rate=1e-2)
BASE = TrainerSpec(num_train_steps=8, train_batch_size=4, checkpoint_every=4, steps_per_eval=4, max_eval_batches=1)
"""As tests/test_run_cost.py trains the same model on the same data: the session's JAX cache compiles it once."""
REPO = "marin/tiny-llama"
"""The exported model, published: `main` is the export plus a README commit, tag `v1` the export alone."""


class Pipeline:
    """The module's steps under one prefix, materialized on demand (each at most once)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        stories = corpus_step("raw/stories", train_documents=300, validation_documents=30, seed=1, shards=1)
        self.tokenized = tokenize_step("tokenized/stories", stories,
                                       bpe_tokenizer_step("tokenizers/bpe", stories, vocab_size=400))
        self.base = train_step("checkpoints/base", {"stories": self.tokenized}, TINY, LR, BASE)
        self.export = export_step("exports/base", self.base)
        self.model = hf_model_step("models/tiny-llama", REPO, "main")
        self.converted = hf_to_levanter_step("checkpoints/tiny-llama-levanter", self.model)
        self.fine_tune = train_step("checkpoints/from-converted", {"stories": self.tokenized}, TINY, LR, BASE,
                                    init_from=from_checkpoint(self.converted))

    def result(self, step, kind: type):
        for each in walk([step]):
            materialize_step(each, prefix=self.prefix)
        return load_result(step.output_path_under(self.prefix), kind)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    pipeline = Pipeline(str(tmp_path_factory.mktemp("hf-model") / "outputs"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARIN_PREFIX", pipeline.prefix)
        pipeline.base_result = pipeline.result(pipeline.base, TrainResult)
        pipeline.export_result = pipeline.result(pipeline.export, ExportResult)
        yield pipeline


@pytest.fixture(scope="module")
def hub(made):
    """The local Hub with the export published (and repositories that are not models), for the module."""
    exported = output_files(made.export_result.path)
    repo = HubRepo(REPO, exported, repo_type="model")
    repo.tag("v1")
    repo.commit({"README.md": "# A tiny Llama trained on generated stories\n"}, message="Add a model card")
    config = json.loads(exported["config.json"])
    weights = exported["model.safetensors"]
    others = [
        HubRepo("marin/no-config", {"model.safetensors": weights, "tokenizer.json": exported["tokenizer.json"]},
                repo_type="model"),
        HubRepo("marin/torch-only", {"config.json": exported["config.json"], "pytorch_model.bin": b"\x80\x02torch"},
                repo_type="model"),
        HubRepo("marin/tiny-qwen", {**exported, "config.json": json.dumps({**config, "model_type": "qwen2"})},
                repo_type="model"),
    ]
    with HubServer([repo, *others]) as server, pytest.MonkeyPatch.context() as patch:
        use_hub(patch, server.url)
        server.repo = repo
        yield server
        assert not server.errors, server.errors[0]
    release_hub()


def test_a_branch_is_resolved_to_its_commit_and_the_folder_is_the_published_model(made, hub):
    got = made.result(made.model, HfModel)
    assert got.revision == "main" and got.commit == hub.repo.head and got.commit != hub.repo.tags["v1"]
    folder = output_files(got.path)
    assert folder == {k: v for k, v in hub.repo.files("main").items() if k != "README.md"}  # a model's files only
    assert {f.path for f in got.files} == set(folder) and got.bytes == sum(map(len, folder.values()))
    assert got.model_type == "llama" and got.architectures == ["LlamaForCausalLM"] and got.dtypes == ["F32"]
    assert got.vocab_size == made.base_result.vocab_size == 512 and got.tokenizer == got.path
    assert got.parameters == made.base_result.parameter_count  # counted from the safetensors headers alone
    assert got.model is not None and got.model.weight_fields() == TINY.weight_fields() and got.model_note is None
    assert got.model_and_tokenizer() == (got.model, got.path) and got.checkpoint_path() == got.path

    # A branch is followed: the step's source version is the commit main points at now; a sha never moves.
    assert made.model.source_version() == hub.repo.head
    pinned = hf_model_step("models/tiny-llama", REPO, hub.repo.tags["v1"])
    assert pinned.source_version is None and pinned.hash != made.model.hash
    tagged = materialize_step(hf_model_step("models/tiny-llama-v1", REPO, "v1"), prefix=made.prefix)
    assert load_result(tagged.output_path, HfModel).commit == hub.repo.tags["v1"]
    assert "README.md" not in output_files(tagged.output_path)


def hf_llama_logits(folder: str, ids: list[int]) -> np.ndarray:
    """Next-token logits of a Hugging Face Llama folder, computed in float64 NumPy straight from its config and
    safetensors as transformers' `LlamaForCausalLM` defines the model (no Levanter, no transformers model)."""
    from safetensors.numpy import load_file

    config = json.loads(Path(folder, "config.json").read_text())
    w = {}
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        w.update({k: v.astype(np.float64) for k, v in load_file(path).items()})
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads, d, eps = config["num_key_value_heads"], hidden // heads, config["rms_norm_eps"]
    theta = (config.get("rope_parameters") or {}).get("rope_theta") or config["rope_theta"]
    n = len(ids)
    angles = np.outer(np.arange(n), 1.0 / theta ** (np.arange(0, d, 2) / d))
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))

    def rope(t):  # t: heads × n × d; rotate_half pairs the two halves of each head
        return t * cos + np.concatenate([-t[..., d // 2:], t[..., :d // 2]], -1) * sin

    def rms(t, gain):
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + eps) * gain

    x = w["model.embed_tokens.weight"][ids]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = ((h @ w[p + f"self_attn.{m}_proj.weight"].T).reshape(n, c, d).transpose(1, 0, 2)
                   for m, c in (("q", heads), ("k", kv_heads), ("v", kv_heads)))
        q, k = rope(q), np.repeat(rope(k), heads // kv_heads, 0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d) + np.triu(np.full((n, n), -np.inf), 1)
        attention = np.exp(scores - scores.max(-1, keepdims=True))
        attention /= attention.sum(-1, keepdims=True)
        x = x + (attention @ np.repeat(v, heads // kv_heads, 0)).transpose(1, 0, 2).reshape(n, hidden) @ \
            w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def levanter_logits(checkpoint: str, model: ModelSpec, vocab_size: int, ids: list[int]) -> np.ndarray:
    """Next-token logits of the model under `model/` of a Levanter checkpoint, as Levanter builds and reads it."""
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from levanter.checkpoint import load_checkpoint
    from levanter.layers.attention import AttentionMask
    from levanter.utils.jax_utils import local_cpu_mesh

    from marin_assets.pipeline.training.levanter_model import model_config, write_reference_config

    with tempfile.TemporaryDirectory() as scratch, local_cpu_mesh():
        config = model_config(model, write_reference_config(model, vocab_size, scratch), tokenizer="")
        template = eqx.filter_eval_shape(config.build, hax.Axis("vocab", vocab_size), key=jax.random.PRNGKey(0))
        net = load_checkpoint(template, checkpoint, subpath="model")
        tokens = hax.named(jnp.array(ids), config.max_Pos.resize(len(ids)))
        return np.asarray(net(tokens, attn_mask=AttentionMask.causal()).array, dtype=np.float64)


def test_the_conversion_computes_what_the_hugging_face_model_and_the_trained_checkpoint_compute(made, hub):
    from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer

    model = made.result(made.model, HfModel)
    converted = made.result(made.converted, LevanterCheckpoint)
    assert converted.checkpoint == os.path.join(made.converted.output_path_under(made.prefix), "step-0")
    assert converted.source == model.path and converted.source_commit == hub.repo.head
    assert converted.model == model.model and converted.vocab_size == 512 and converted.dtype is None
    assert converted.parameters == model.parameters and converted.source_dtypes == ["F32"]

    tokenizer = load_hf_tokenizer(converted.tokenizer)
    ids = [tokenizer.bos_token_id, *tokenizer.encode("Once upon a time, a little cat found a red ball.",
                                                     add_special_tokens=False)][:TINY.seq_len]
    reference = hf_llama_logits(model.path, ids)
    ours = levanter_logits(converted.checkpoint, converted.model, converted.vocab_size, ids)
    trained = levanter_logits(made.base_result.checkpoint_path(), TINY, made.base_result.vocab_size, ids)
    assert reference.shape == ours.shape == (len(ids), 512) and len(ids) > 10
    assert np.abs(ours - reference).max() < 1e-4  # float32 through Levanter against float64 NumPy
    assert np.abs(ours - trained).max() < 1e-5  # the very weights training saved
    assert np.abs(reference).max() > 1 and (ours.argmax(-1) == reference.argmax(-1)).all()


def test_evaluation_reads_the_conversion_as_the_training_run_measured_it(made, hub, tmp_path):
    """Loss of the converted checkpoint on the first held-out batch: what training logged for it at its last
    step (the same weights, the same four sequences), read through the record as evaluation steps read it."""
    converted = made.result(made.converted, LevanterCheckpoint)
    model, tokenizer = converted.model_and_tokenizer()
    cache = made.result(made.tokenized, TokenizedCache).path
    got = evaluate_lm(str(tmp_path / "eval"), converted.checkpoint_path(), model, tokenizer, {"stories": cache},
                      max_eval_batches=1, batch_size=BASE.train_batch_size, vocab_size=converted.vocab_size)
    assert got.step == 0 and got.checkpoint == converted.checkpoint
    assert math.isclose(got.loss, made.base_result.final_eval_loss, abs_tol=1e-4), (got.loss,
                                                                                    made.base_result.final_eval_loss)
    assert got.bpb is not None and got.bpb > 0


def test_an_evaluation_step_evaluates_the_conversion_and_the_downloaded_model_as_it_does_a_run(made, hub, tmp_path):
    """`loss_eval_step` takes a model from the Hub as it takes a training step: the record says where the weights are
    and what they are; the downloaded folder and its conversion score the same."""
    converted = made.result(made.converted, LevanterCheckpoint)
    model, tokenizer = converted.model_and_tokenizer()
    cache = made.result(made.tokenized, TokenizedCache).path
    direct = evaluate_lm(str(tmp_path / "direct"), converted.checkpoint_path(), model, tokenizer, {"stories": cache},
                         max_eval_batches=1, vocab_size=converted.vocab_size)
    for evaluated in (made.converted, made.model):
        step = loss_eval_step(f"evals/{evaluated.name.rsplit('/', 1)[-1]}", evaluated, {"stories": made.tokenized},
                             max_eval_batches=1)
        got = made.result(step, EvalResult)
        assert math.isclose(got.loss, direct.loss, rel_tol=1e-4), (evaluated.name, got.loss, direct.loss)


def test_a_run_starts_from_the_conversion_through_dagster(made, hub, local_ray, dagster_home):
    from resources import StorageResource

    defs = build_definitions([made.fine_tune], resources={"storage": StorageResource(prefix=made.prefix)})
    run = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=dg.DagsterInstance.get())
    assert run.success
    events = run.get_asset_materialization_events()
    metadata = {e.asset_key.to_user_string(): e.materialization.metadata for e in events}
    shown = metadata["checkpoints/tiny-llama-levanter"]
    assert shown["result.source_commit"].value == hub.repo.head and shown["result.model.hidden_dim"].value == 32
    assert metadata["models/tiny-llama"]["result.commit"].value == hub.repo.head
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in run.get_asset_check_evaluations()}
    assert checks[("models/tiny-llama", "weights_match_headers")] and checks[("models/tiny-llama",
                                                                              "files_match_record")]
    assert checks[("checkpoints/tiny-llama-levanter", "checkpoint_complete")]

    tuned = load_result(made.fine_tune.output_path_under(made.prefix), TrainResult)
    converted = load_result(made.converted.output_path_under(made.prefix), LevanterCheckpoint)
    assert tuned.initialized_from == converted.checkpoint and tuned.steps == BASE.num_train_steps
    # The same first batch (data order starts afresh) costs the converted weights less than the random ones it
    # cost the base run: the run started from the trained model, not from scratch.
    assert tuned.loss_curve[0][1] < made.base_result.loss_curve[0][1] - 0.2, (tuned.loss_curve,
                                                                              made.base_result.loss_curve)


def test_a_model_given_to_the_conversion_must_fit_its_config(made, hub):
    wide = hf_to_levanter_step("checkpoints/wide", made.model, model=replace(TINY, hidden_dim=64, num_heads=4))
    with pytest.raises(HfModelError, match=r"does not fit .*hidden_dim: this model 64, the source 32"):
        made.result(wide, LevanterCheckpoint)
    # Known when steps are defined (an export's run), a mismatch with the run continuing from it fails there.
    of_export = hf_to_levanter_step("checkpoints/of-export", made.export)
    assert of_export.model == TINY
    with pytest.raises(StepDefinitionError, match="does not fit the weights of the Levanter checkpoint"):
        train_step("checkpoints/x", {"stories": made.tokenized}, replace(TINY, num_layers=2), LR, BASE,
                   init_from=from_checkpoint(of_export))


@pytest.mark.parametrize("repo_id, revision, error, message", [
    ("marin/nobody", "main", DownloadError, r"model marin/nobody: repository not found"),
    (REPO, "no-such-branch", DownloadError, r"model marin/tiny-llama: revision 'no-such-branch' not found"),
    ("marin/no-config", "main", HfModelError, r"has no config.json: not a Transformers model repository \(its"
                                              r" files: .*model.safetensors"),
    ("marin/torch-only", "main", HfModelError, r"no safetensors weights .*only pytorch_model.bin"),
])
def test_a_repository_that_is_not_a_model_fails_before_any_weight_is_copied(made, hub, tmp_path, repo_id,
                                                                            revision, error, message):
    step = hf_model_step(f"models/{repo_id.split('/')[1]}", repo_id, revision)
    before = len(hub.requests)
    with pytest.raises(error, match=message) as failure:
        materialize_step(step, prefix=str(tmp_path))
    assert f"while materializing step 'models/{repo_id.split('/')[1]}'" in str(failure.value.__notes__)
    asked = [r.path for r in hub.requests[before:]]
    assert asked and not [p for p in asked if "/resolve/" in p]  # the hub was asked, and nothing was copied


def test_a_family_modelspec_cannot_describe_is_recorded_and_refused_by_the_conversion(made, hub):
    qwen = hf_model_step("models/tiny-qwen", "marin/tiny-qwen", "main")
    got = made.result(qwen, HfModel)
    assert got.model is None and "model_type 'qwen2' is not a family ModelSpec describes" in got.model_note
    with pytest.raises(HfModelError, match="qwen2"):
        got.model_and_tokenizer()
    with pytest.raises(HfModelError, match="model_type 'qwen2' is not a family ModelSpec describes"):
        made.result(hf_to_levanter_step("checkpoints/tiny-qwen", qwen), LevanterCheckpoint)


def test_settings_modelspec_cannot_express_are_named(made):
    config = json.loads(Path(made.export_result.path, "config.json").read_text())
    assert model_spec_of(config).weight_fields() == TINY.weight_fields()
    assert model_spec_of(config, seq_len=32).seq_len == 32
    scaled = {**config, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    with pytest.raises(HfModelError, match="rope scaling"):
        model_spec_of(scaled)
    with pytest.raises(HfModelError, match="no 'hidden_size'"):
        model_spec_of({k: v for k, v in config.items() if k != "hidden_size"})


def test_the_steps_refuse_what_they_cannot_use(made):
    with pytest.raises(StepDefinitionError, match="is a training step, whose checkpoints are Levanter's already"):
        hf_to_levanter_step("checkpoints/x", made.base)
    with pytest.raises(StepDefinitionError, match="dtype must be one of"):
        hf_to_levanter_step("checkpoints/x", made.model, dtype="int8")
    with pytest.raises(StepDefinitionError, match="is a Levanter checkpoint .* with from_checkpoint"):
        from_hf(made.converted)
    with pytest.raises(StepDefinitionError, match="one checkpoint \\(step 0\\), not 3"):
        from_checkpoint(made.converted, 3)
    with pytest.raises(StepDefinitionError, match="not a Hugging Face repository id"):
        hf_model_step("models/x", "a/b/c", "main")
    assert from_checkpoint(made.converted).identity() == {"checkpoint_of": made.converted.name_with_hash,
                                                          "checkpoint_step": None}
    assert from_hf(made.model).identity() == {"hf_step": made.model.name_with_hash}


def test_a_run_from_a_conversion_given_its_model_knows_it_without_being_told(made):
    """A conversion given its `ModelSpec` passes it on to what starts from it (SFT, DPO); one reading it from the
    config at run time cannot, and the step asks for it when defined."""
    from marin_assets.pipeline.training.sources import model_of

    typed = hf_to_levanter_step("checkpoints/tiny-llama-levanter-typed", made.model, model=TINY)
    assert model_of("step 'x'", None, from_checkpoint(typed)) == TINY
    with pytest.raises(StepDefinitionError, match="step 'x': give model="):
        model_of("step 'x'", None, from_checkpoint(made.converted))
