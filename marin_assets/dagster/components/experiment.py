"""`LanguageModelExperiment`: a standard experiment — corpus → tokenizer → tokenize → train → export and evaluate,
or a learning-rate × model sweep — declared in a `defs.yaml` instead of Python.

The settings (`settings.py`) go through the same step factories a Python experiment calls, imported as the shipped
experiments import them, from the front door (`marin_assets.steps`), and named as `experiments/small_lm.py` and
`lr_model_sweep` name them, so a YAML experiment and its Python twin are the same steps with the same identities
(`tests/test_experiment_component.py` compares every step's name and hash): it reuses everything its twin
computed, and the other way round. `dg scaffold defs` writes a small working file
(`scaffold.py`); `dg check defs` checks it against the schema (naming the line) and then loads it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import BaseModel, PrivateAttr, model_validator

from marin_assets import Experiment, Step
from marin_assets.dagster.components.scaffold import ExperimentScaffolder
from marin_assets.dagster.components.settings import (
    NAME_PATTERN,
    Corpus,
    Settings,
    Suite,
    Sweep,
    Tokenize,
    Tokenizer,
    Training,
    bounded,
)
from marin_assets.dagster.experiments import experiment_definitions
from marin_assets.steps import (
    TrainStep,
    ValidationSuite,
    bpe_tokenizer_step,
    evaluate_step,
    existing_tokenizer_step,
    export_step,
    hf_download_step,
    hf_validation_suite,
    loss_checkpoint_evals,
    lr_model_sweep,
    python_docs_step,
    tokenize_step,
    train_step,
    url_download_step,
    url_validation_suite,
)
from resources import RayResource, StorageResource

RESOURCES: dict[str, Any] = {"storage": StorageResource(), "ray": RayResource()}
"""One storage and one Ray resource object for every YAML experiment: Dagster merges the definitions of several
components only when a resource key holds the very same object in each."""


def resolve_url(url: str, folder: Path | None) -> str:
    """A URL or absolute path as given; a relative path relative to the YAML file's folder (absolute: its identity
    then names the file, not wherever a process happened to start)."""
    if "://" in url or Path(url).is_absolute() or folder is None:
        return url
    return str((folder / url).resolve())


def label_of(name_or_path: str) -> str:
    """A step-name segment for an existing tokenizer: the last part of its hub name or path."""
    tail = name_or_path.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", tail).lstrip(".-") or "tokenizer"


@dg.scaffold_with(ExperimentScaffolder)
class LanguageModelExperiment(dg.Component, Settings):
    """A standard language-model experiment from plain settings: a corpus (the running Python's documentation, a
    Hugging Face dataset, or files at any fsspec URL or local path), a tokenizer (a BPE trained on it, or an
    existing one), a Levanter cache, one training run (exported, evaluated, optionally every checkpoint evaluated)
    or a sweep over models × learning rates. Steps are named after `name` as the Python factories name them,
    so they have the identities of the same experiment written in Python."""

    name: str = bounded(pattern=NAME_PATTERN)
    """Prefixes every step: `raw/{name}`, `tokenizers/{name}-bpe`, `tokenized/{name}-bpe`,
    `checkpoints/{name}-llama`, `exports/…`, `evals/…` (a sweep: `checkpoints/{name}-{model}-lr{lr}`)."""
    corpus: Corpus
    tokenizer: Tokenizer
    tokenize: Tokenize = Tokenize()
    training: Training = Training()
    dataset: str | None = bounded(None, pattern=NAME_PATTERN)
    """The corpus's name in the mixture and in the eval metrics (`eval/{dataset}/loss`); default: `name`."""
    validation: list[Suite] = []
    """Validation suites every run is also scored on (weight 0 in training; each set in the evaluation)."""
    sweep: Sweep | None = None
    """Train one run per model × learning rate instead of one run."""
    export: bool = True
    """Export the run as a Hugging Face folder (one run only)."""
    evaluate: bool = True
    """Evaluate the last checkpoint on the validation split and suites."""
    checkpoint_evals: bool = False
    """Evaluate every checkpoint as it lands (a partitioned asset and the checkpoint sensor; one run only)."""
    scheduled: bool = False
    """Whether the nightly refresh schedule brings this experiment's unsynced assets up to date."""

    _folder: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def single_run_options(self) -> LanguageModelExperiment:
        if self.sweep is not None:
            asked = [k for k in ("export", "checkpoint_evals") if k in self.model_fields_set and getattr(self, k)]
            if asked:
                verb = "apply" if len(asked) > 1 else "applies"
                raise ValueError(f"{' and '.join(asked)} {verb} to one run, not to a sweep: remove it or the sweep")
        return self

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        """The component is its own schema: plain settings, typed strictly (no templates), so `dg check defs`
        names a misspelt key or a bad value on its line instead of allowing any string in its place."""
        return cls

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> LanguageModelExperiment:
        """The settings Dagster parsed from `attributes`, remembering the YAML file's folder (relative paths are
        relative to it)."""
        component = attributes if isinstance(attributes, cls) else cls.model_validate(attributes or {})
        component._folder = context.path
        return component

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return experiment_definitions([self.experiment()], resources=RESOURCES)

    # --- the steps, through the pipeline factories ------------------------------------------------------------

    def pipeline(self) -> dict[str, Step]:
        """The steps by role: `corpus`, `tokenizer`, `tokenized`, suites' caches (`validation/{suite}-{set}`), and
        `train`, `export`, `evaluate` for one run, or `sweep/{step name}` for each step of a sweep."""
        name, family = self.name, self.training.model.family
        dataset = self.dataset or name
        corpus = self.corpus_step()
        tokenizer, tag = self.tokenizer_step(corpus)
        tokenize = self.tokenize
        tokenized = tokenize_step(f"tokenized/{name}-{tag}", corpus, tokenizer, splits=tokenize.splits,
                                  text_field=self.corpus.text_field, workers=tokenize.workers,
                                  text_format=self.corpus.text_format, framing=tokenize.framing,
                                  config=tokenize.config)
        validation: dict[str, Step] = {}
        for suite in self.validation:
            validation.update(self.suite(suite).tokenized(tokenizer, workers=tokenize.workers))
        steps: dict[str, Step] = {"corpus": corpus, "tokenizer": tokenizer, "tokenized": tokenized,
                                  **{f"validation/{k}": s for k, s in validation.items()}}
        model, optimizer, trainer = (self.training.model.spec(), self.training.optimizer.spec(),
                                     self.training.trainer.spec())
        if self.sweep is not None:
            models = {k: m.spec() for k, m in (self.sweep.models or {family: self.training.model}).items()}
            for step in lr_model_sweep(name, {dataset: tokenized}, models, self.sweep.learning_rates, trainer,
                                       optimizer, validation=validation or None, evaluate=self.evaluate):
                steps[f"sweep/{step.name}"] = step
            return steps
        train = train_step(f"checkpoints/{name}-{family}", {dataset: tokenized}, model, optimizer, trainer,
                           validation=validation or None)
        steps["train"] = train
        if self.export:
            steps["export"] = export_step(f"exports/{name}-{family}", train)
        if self.evaluate:
            steps["evaluate"] = evaluate_step(f"evals/{name}-{family}", train, {dataset: tokenized, **validation})
        return steps

    def corpus_step(self) -> Step:
        source, name = self.corpus, f"raw/{self.name}"
        if source.python_docs is not None:
            docs = source.python_docs
            return python_docs_step(name, validation_percent=docs.validation_percent, min_chars=docs.min_chars,
                                    shards=docs.shards)
        if source.huggingface is not None:
            hf = source.huggingface
            return hf_download_step(name, hf.repo_id, hf.revision, hf.include, hf.repo_type)
        assert source.urls is not None, "the corpus validator requires one source"
        return url_download_step(name, [resolve_url(u, self._folder) for u in source.urls])

    def tokenizer_step(self, corpus: Step) -> tuple[Step, str]:
        """The tokenizer step and the tag naming the caches made with it (`bpe`, or the existing tokenizer's)."""
        if self.tokenizer.bpe is not None:
            bpe = self.tokenizer.bpe
            return bpe_tokenizer_step(f"tokenizers/{self.name}-bpe", corpus, vocab_size=bpe.vocab_size,
                                      max_documents=bpe.max_documents, text_field=self.corpus.text_field,
                                      text_format=self.corpus.text_format), "bpe"
        existing = self.tokenizer.existing
        assert existing is not None, "the tokenizer validator requires one tokenizer"
        name_or_path = existing.name_or_path
        if name_or_path.startswith(("./", "../")):  # a folder beside the YAML file; else a hub name or absolute
            name_or_path = resolve_url(name_or_path, self._folder)
        tag = existing.label or label_of(existing.name_or_path)
        return existing_tokenizer_step(f"tokenizers/{self.name}-{tag}", name_or_path, existing.revision), tag

    def suite(self, suite: Suite) -> ValidationSuite:
        if suite.huggingface is not None:
            hf = suite.huggingface
            return hf_validation_suite(suite.name, hf.repo_id, hf.revision, suite.sets, suite.text_field,
                                       hf.repo_type)
        assert suite.urls is not None, "the suite validator requires one source"
        return url_validation_suite(suite.name, [resolve_url(u, self._folder) for u in suite.urls], suite.sets,
                                    suite.text_field)

    def experiment(self) -> Experiment:
        """What the project's definitions serve: the last steps (export and evaluation, or the sweep's runs), the
        per-checkpoint evaluation when asked, and whether the refresh schedule keeps it fresh."""
        steps = self.pipeline()
        if self.sweep is not None:
            leaves = [s for k, s in steps.items() if k.startswith("sweep/")]
            return Experiment(self.name, leaves, scheduled=self.scheduled)
        leaves = [steps[k] for k in ("export", "evaluate") if k in steps] or [steps["train"]]
        per_checkpoint = []
        if self.checkpoint_evals:
            train = steps["train"]
            assert isinstance(train, TrainStep), "train_step makes a TrainStep"
            family = self.training.model.family
            validation = {self.dataset or self.name: steps["tokenized"],
                          **{k.removeprefix("validation/"): s for k, s in steps.items() if k.startswith("validation/")}}
            per_checkpoint.append(loss_checkpoint_evals(f"evals/{self.name}-{family}-checkpoints", train, validation,
                                                        max_eval_batches=self.training.trainer.max_eval_batches))
        return Experiment(self.name, leaves, per_checkpoint, scheduled=self.scheduled)


def yaml_experiments(defs_module: str = "marin_assets.defs") -> list[Experiment]:
    """The experiments of every `LanguageModelExperiment` under a defs folder (default: this project's, as
    `[tool.dg.project] defs_module` names it), for definitions that serve them beside Python experiments: one
    `experiment_definitions` over all of them shares the steps they have in common (a YAML sweep on the demo's
    cache), where each component's own definitions would repeat them. Found by module, so an installed package
    without its pyproject.toml loads them too."""
    module = importlib.import_module(defs_module)
    package_dir = Path(next(iter(module.__path__)))
    project_root = package_dir.parents[defs_module.count(".")]
    tree = dg.ComponentTree.from_module(defs_module=module, project_root=project_root)
    return [c.experiment() for c in tree.get_all_components(of_type=LanguageModelExperiment)]
