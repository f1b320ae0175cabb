"""Experiments declared in YAML (`marin_assets/dagster/components`): a `LanguageModelExperiment` in a `defs.yaml` is
the same steps, with the same identities, as its twin written in Python with the pipeline factories.

`dg scaffold defs` writes a working file into a small dg project made here (its definitions are
`load_from_defs_folder`, as `dg scaffold project` writes them); `dg check defs` validates it, and names the line
and field of a misspelt key; a tiny experiment on real text (the standard library's docstrings, as local files
beside the YAML) is materialized through Dagster, and its Python twin then finds every output already there.
"""

import dataclasses
import sys

import dagster as dg
import pytest
import yaml

from marin_assets import load_result, materialize_step
from marin_assets.core.step import Step, walk
from marin_assets.dagster.components import LanguageModelExperiment, yaml_experiments
from marin_assets.dagster.components.scaffold import ExperimentScaffolder, ScaffoldParams
from marin_assets.dagster.components.settings import Model, Optimizer, Trainer
from marin_assets.dagster.instance import write_instance_yaml
from marin_assets.pipeline.data.download import hf_download_step, url_download_step
from marin_assets.pipeline.evals.loss import EvalResult, loss_eval_step
from marin_assets.pipeline.sweeps import lr_model_sweep
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import existing_tokenizer_step
from marin_assets.pipeline.tokens.validation_suite import url_validation_suite
from marin_assets.pipeline.training.export import export_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from marin_assets.steps import language_model_pipeline
from tests.support.chat import write_docs_dataset
from tests.support.helpers import BIN, run_cli, subprocess_env

TYPE = "marin_assets.dagster.components.LanguageModelExperiment"
PROJECT = "yaml_lab"
"""The tmp dg project's root module (distinct from every module of this repository)."""

TINY = {"hidden_dim": 32, "intermediate_dim": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2, "seq_len": 128}
TINY_TRAINER = {"num_train_steps": 8, "train_batch_size": 8, "checkpoint_every": 50, "steps_per_eval": 50,
                "max_eval_batches": 1}
"""The tiny sizes of tests/test_sft.py: a one-layer Llama, a few steps, seconds on a CPU."""


def identities(steps) -> dict[str, str]:
    """Step name → identity hash, for every step `steps` read."""
    return {s.name: s.hash for s in walk(list(steps))}


def from_settings(**attributes) -> LanguageModelExperiment:
    return LanguageModelExperiment.model_validate(attributes)


# --- the settings are the factories' arguments ---------------------------------------------------------------------


@pytest.mark.parametrize("settings, spec", [(Model, ModelSpec), (Optimizer, OptimizerSpec), (Trainer, TrainerSpec)])
def test_every_spec_field_is_a_setting_with_the_specs_default(settings, spec):
    fields = dataclasses.fields(spec)
    assert set(settings.model_fields) == {f.name for f in fields}, f"{settings.__name__} no longer mirrors {spec}"
    assert settings().spec() == spec()  # the defaults, field by field (a frozen dataclass compares every field)


def test_the_demo_declared_in_yaml_is_the_python_demo_step_for_step():
    from marin_assets.experiments import python_docs

    component = from_settings(
        name="python-docs", corpus={"python_docs": {}}, tokenizer={"bpe": {"vocab_size": 1024}},
        training={"model": {"seq_len": 128}, "trainer": {"num_train_steps": 200, "train_batch_size": 16,
                                                         "checkpoint_every": 50, "steps_per_eval": 50,
                                                         "max_eval_batches": 8}},
        checkpoint_evals=True)
    experiment = component.experiment()
    assert identities(experiment.steps) == identities(python_docs.experiment.steps)
    assert len(identities(experiment.steps)) == 6
    [mine], [theirs] = experiment.per_checkpoint, python_docs.experiment.per_checkpoint
    assert (mine.name, mine.hash, mine.step(50).hash) == (theirs.name, theirs.hash, theirs.step(50).hash)


def test_each_source_tokenizer_and_suite_is_the_factorys_step(tmp_path):
    component = LanguageModelExperiment.model_validate({
        "name": "web", "dataset": "web-text",
        "corpus": {"huggingface": {"repo_id": "org/web", "revision": "a" * 40, "include": ["train/*", "val/*"]},
                   "text_field": "content", "text_format": "jsonl"},
        "tokenizer": {"existing": {"name_or_path": "org/Some-Tokenizer", "revision": "b" * 40}},
        "tokenize": {"splits": {"train": ["train/*"], "validation": ["val/*"]}, "framing": "eos"},
        "validation": [{"name": "heldout", "urls": ["heldout"], "sets": {"docs": ["docs/*.jsonl"]}}],
        "training": {"model": TINY, "trainer": TINY_TRAINER},
    })
    component._folder = tmp_path  # as loading it from tmp_path/defs.yaml does: `heldout` is relative to it
    corpus = hf_download_step("raw/web", "org/web", "a" * 40, ["train/*", "val/*"])
    tokenizer = existing_tokenizer_step("tokenizers/web-Some-Tokenizer", "org/Some-Tokenizer", "b" * 40)
    cache = tokenize_step("tokenized/web-Some-Tokenizer", corpus, tokenizer,
                          splits={"train": ["train/*"], "validation": ["val/*"]}, text_field="content",
                          text_format="jsonl", framing="eos")
    suite = url_validation_suite("heldout", [str(tmp_path / "heldout")], {"docs": ["docs/*.jsonl"]}).tokenized(
        tokenizer)
    train = train_step("checkpoints/web-llama", {"web-text": cache}, ModelSpec(**TINY), OptimizerSpec(),
                       TrainerSpec(**TINY_TRAINER), validation=suite)
    twin = [export_step("exports/web-llama", train),
            loss_eval_step("evals/web-llama", train, {"web-text": cache, **suite})]
    steps = component.experiment().steps
    assert identities(steps) == identities(twin)
    assert {s.name for s in steps} == {"exports/web-llama", "evals/web-llama"}


def test_the_shipped_sweep_is_its_python_twin_and_shares_the_demos_cache():
    """`marin_assets/defs/python_docs_lr_sweep/defs.yaml`, loaded as `dg` loads the project's defs folder."""
    from marin_assets.experiments import python_docs

    [experiment] = yaml_experiments()
    twin = lr_model_sweep("python-docs", {"python-docs": python_docs.pipeline["tokenized"]},
                          {"d64": ModelSpec(hidden_dim=64, intermediate_dim=256, seq_len=128)}, [0.003, 0.01],
                          TrainerSpec(num_train_steps=100, train_batch_size=16), OptimizerSpec(learning_rate=0.003))
    assert identities(experiment.steps) == identities(twin)
    assert [s.name for s in experiment.steps] == [f"{kind}/python-docs-d64-lr{lr}" for lr in ("0.003", "0.01")
                                                  for kind in ("checkpoints", "evals")]
    demo = identities(python_docs.experiment.steps)
    shared = {k: v for k, v in identities(experiment.steps).items() if k in demo}
    assert shared == {k: demo[k] for k in ("raw/python-docs", "tokenizers/python-docs-bpe",
                                           "tokenized/python-docs-bpe")}


def test_serving_yaml_experiments_beside_the_python_ones_adds_only_their_new_steps():
    """What `marin_assets/definitions.py` serves by adding `yaml_experiments`: the sweep's four assets, every
    asset of the Python experiments unchanged (its identity hash is its code version)."""
    from marin_assets.dagster import experiment_definitions
    from marin_assets.definitions import EXPERIMENTS

    def versions(defs: dg.Definitions) -> dict[str, str | None]:
        graph = defs.resolve_asset_graph()
        return {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()}

    from_yaml = yaml_experiments()
    python_only, served = EXPERIMENTS[:-len(from_yaml)], EXPERIMENTS[-len(from_yaml):]
    assert [[s.name_with_hash for s in e.steps] for e in served] == [[s.name_with_hash for s in e.steps]
                                                                     for e in from_yaml]
    before = versions(experiment_definitions(python_only))
    after = versions(experiment_definitions(EXPERIMENTS))
    assert {k: v for k, v in after.items() if k in before} == before
    assert sorted(set(after) - set(before)) == [f"{kind}/python-docs-d64-lr{lr}" for kind in ("checkpoints", "evals")
                                                for lr in ("0.003", "0.01")]


@pytest.mark.parametrize("attributes, message", [
    ({"corpus": {"python_docs": {}, "urls": ["x"]}},
     "corpus takes exactly one of ['huggingface', 'python_docs', 'urls'], got ['python_docs', 'urls']"),
    ({"training": {"model": {"hidden_dim": 64, "num_heads": 3, "num_kv_heads": 3}}},
     "hidden_dim 64 is not divisible by num_heads 3"),
    ({"training": {"trainer": {"num_train_steps": 0}}}, "num_train_steps must be greater than 0"),
    ({"name": "a/b"}, "name must be text matching"),
    ({"sweep": {"learning_rates": [0.01]}, "export": True}, "export applies to one run, not to a sweep"),
    ({"tokenizer": {"bpe": {"vocab_size": 512, "vocab": 3}}}, "vocab\n  Extra inputs are not permitted"),
])
def test_bad_settings_name_the_field_and_the_cause(attributes, message):
    good = {"name": "x", "corpus": {"python_docs": {}}, "tokenizer": {"bpe": {"vocab_size": 512}}}
    with pytest.raises(ValueError) as raised:
        from_settings(**{**good, **attributes})
    assert message in str(raised.value)


# --- dg: scaffold, check, load, materialize -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A dg project whose definitions are its defs folder, using this repository's environment."""
    root = tmp_path_factory.mktemp("lab")
    (root / ".venv").symlink_to(BIN.parent)  # dg runs a project's code with its ./.venv
    (root / "pyproject.toml").write_text(f"""\
[project]
name = "{PROJECT}"
version = "0.1"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "{PROJECT}"
registry_modules = ["marin_assets.dagster.components"]

[tool.dg.cli]
suppress_warnings = ["project_and_activated_venv_mismatch"]
telemetry.enabled = false
""")
    (root / PROJECT / "defs").mkdir(parents=True)
    (root / PROJECT / "__init__.py").write_text("")
    (root / PROJECT / "defs" / "__init__.py").write_text("")
    (root / PROJECT / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n"
        "defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n")
    home = root / "home"
    home.mkdir()
    write_instance_yaml(home / "dagster.yaml")
    env = subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=str(root / "outputs"))
    env["PYTHONPATH"] = f"{root}:{env['PYTHONPATH']}"
    return root, env


def dg_cli(lab, *args, check=True):
    root, env = lab
    return run_cli(BIN / "dg", *args, env=env, cwd=root, check=check)


def test_dg_scaffolds_an_experiment_that_dg_check_validates_and_a_misspelt_key_is_named(lab):
    root, _ = lab
    dg_cli(lab, "scaffold", "defs", TYPE, "docs_run")
    defs_yaml = root / PROJECT / "defs" / "docs_run" / "defs.yaml"
    scaffolded = yaml.safe_load(defs_yaml.read_text())
    assert scaffolded["type"] == TYPE and scaffolded["attributes"]["name"] == "docs_run"
    assert scaffolded["attributes"]["corpus"] == {"python_docs": {}}

    check = dg_cli(lab, "check", "defs")
    assert "All component YAML validated successfully." in check.stdout
    assert "All definitions loaded successfully." in check.stdout

    good = defs_yaml.read_text()
    defs_yaml.write_text(good.replace("hidden_dim:", "hiden_dim:"))
    try:
        bad = dg_cli(lab, "check", "defs", check=False)
    finally:
        defs_yaml.write_text(good)
    line = next(i for i, text in enumerate(good.splitlines(), 1) if "hidden_dim:" in text)
    assert bad.returncode != 0
    assert f"{defs_yaml}:{line} - {TYPE} attributes.training.model" in bad.stdout
    assert "Additional properties are not allowed ('hiden_dim' was unexpected)" in bad.stdout


def test_the_scaffolded_experiments_load_as_their_python_twins(lab, tmp_path):
    """The one-run and sweep files `dg scaffold defs` writes (the scaffolder in-process) load into the steps the
    factories make with the same settings."""
    from marin_assets.steps import python_docs_step

    for params in (ScaffoldParams(name="one"), ScaffoldParams(name="grid", sweep=True)):
        ExperimentScaffolder().scaffold(dg.ScaffoldRequest(TYPE, tmp_path / params.name, "yaml", None, params))
    one = yaml.safe_load((tmp_path / "one" / "defs.yaml").read_text())["attributes"]
    grid = yaml.safe_load((tmp_path / "grid" / "defs.yaml").read_text())["attributes"]
    model = ModelSpec(**one["training"]["model"])
    optimizer, trainer = OptimizerSpec(**one["training"]["optimizer"]), TrainerSpec(**one["training"]["trainer"])

    twin = language_model_pipeline("one", python_docs_step("raw/one"), vocab_size=512, model=model, trainer=trainer,
                                   optimizer=optimizer)
    assert identities(from_settings(**one).experiment().steps) == identities([twin.export, twin.evaluate])

    base = language_model_pipeline("grid", python_docs_step("raw/grid"), vocab_size=512, model=model,
                                   trainer=trainer, optimizer=optimizer)
    sweep = lr_model_sweep("grid", {"grid": base["tokenized"]}, {"llama": model}, [0.001, 0.003, 0.01], trainer,
                           optimizer)
    assert identities(from_settings(**grid).experiment().steps) == identities(sweep)


def test_a_tiny_yaml_experiment_materializes_through_dagster_with_its_python_twins_identities(
        lab, prefix, dagster_home, local_ray, monkeypatch):
    root, _ = lab
    folder = root / PROJECT / "defs" / "tiny_docs"
    write_docs_dataset(folder / "docs")  # real text: standard-library docstrings, train/ and validation/
    (folder / "defs.yaml").write_text(yaml.safe_dump({"type": TYPE, "attributes": {
        "name": "tiny-docs", "dataset": "docs", "corpus": {"urls": ["docs"]},  # relative to the YAML file
        "tokenizer": {"bpe": {"vocab_size": 512}},
        "training": {"model": TINY, "optimizer": {"learning_rate": 0.01}, "trainer": TINY_TRAINER},
        "export": False}}))
    monkeypatch.syspath_prepend(str(root))
    try:
        tree = dg.ComponentTree.for_project(root)
        defs = tree.build_defs()
        [component] = [c for c in tree.get_all_components(of_type=LanguageModelExperiment) if c.name == "tiny-docs"]
        steps = component.pipeline()
    finally:
        for module in [m for m in sys.modules if m == PROJECT or m.startswith(f"{PROJECT}.")]:
            del sys.modules[module]

    docs = url_download_step("raw/tiny-docs", [str((folder / "docs").resolve())])
    pipeline = language_model_pipeline("tiny-docs", docs, dataset="docs", vocab_size=512, model=ModelSpec(**TINY),
                                       optimizer=OptimizerSpec(learning_rate=0.01),
                                       trainer=TrainerSpec(**TINY_TRAINER), export=False)
    twin: list[Step] = list(pipeline.values())
    assert [s.name for s in twin] == ["raw/tiny-docs", "tokenizers/tiny-docs-bpe", "tokenized/tiny-docs-bpe",
                                      "checkpoints/tiny-docs-llama", "evals/tiny-docs-llama"]
    assert identities(steps.values()) == identities(twin)

    keys = [dg.AssetKey(s.name.split("/")) for s in twin]
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=dg.DagsterInstance.get(), asset_selection=keys)
    assert result.success
    materialized = {e.asset_key.to_user_string(): e.materialization.metadata
                    for e in result.get_asset_materialization_events()}
    assert set(materialized) == {s.name for s in twin}
    hashes = {k: m["hash"].value if hasattr(m["hash"], "value") else m["hash"] for k, m in materialized.items()}
    assert hashes == identities(twin)
    assert {k: m["output_path"].value for k, m in materialized.items()} == {s.name: s.output_path for s in twin}

    # The Python twin finds every output the YAML experiment made: nothing runs again.
    assert [materialize_step(s).cached for s in twin] == [True] * len(twin)
    trained = load_result(pipeline.train, TrainResult)
    assert trained.steps == TINY_TRAINER["num_train_steps"] and trained.final_train_loss < trained.loss_curve[0][1]
    assert load_result(twin[-1], EvalResult).loss > 0
