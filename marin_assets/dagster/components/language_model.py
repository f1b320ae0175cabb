"""`LanguageModelExperiment`: a standard experiment — corpus → tokenizer → tokenize → train → export and evaluate,
or a learning-rate × model sweep — declared in a `defs.yaml` instead of Python (`experiment.py` before 0.2.0).

The settings (`settings.py`) go through the same recipe and step factories a Python experiment calls, imported as
the shipped experiments import them, from the front door (`marin_assets.steps`): `language_model_pipeline` (or
`tokenized_corpus` and `lr_model_sweep` for a sweep), so a YAML experiment and its Python twin are the same steps
with the same identities
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
    Existing,
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
    LanguageModelPipeline,
    TokenizedCorpus,
    ValidationSuite,
    existing_tokenizer_step,
    hf_download_step,
    hf_validation_suite,
    language_model_pipeline,
    lr_model_sweep,
    python_docs_step,
    tokenized_corpus,
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
        `train`, `export`, `evaluate` for one run (`language_model_pipeline`), or `sweep/{step name}` for each step
        of a sweep (`lr_model_sweep` on `tokenized_corpus`'s cache)."""
        recipe = self.recipe()
        steps = dict(recipe)
        if self.sweep is not None:
            models = {k: m.spec() for k, m in (self.sweep.models or {self.training.model.family:
                                                                     self.training.model}).items()}
            for step in lr_model_sweep(self.name, recipe.train_data, models, self.sweep.learning_rates,
                                       self.training.trainer.spec(), self.training.optimizer.spec(),
                                       validation=dict(recipe.validation) or None, evaluate=self.evaluate):
                steps[f"sweep/{step.name}"] = step
        return steps

    def recipe(self) -> TokenizedCorpus:
        """The front door's recipe with these settings: `language_model_pipeline` for one run (a
        `LanguageModelPipeline`), `tokenized_corpus` (its first half) for a sweep."""
        tokenize, bpe, existing = self.tokenize, self.tokenizer.bpe, self.tokenizer.existing
        options: dict[str, Any] = dict(
            dataset=self.dataset or self.name, text_field=self.corpus.text_field, text_format=self.corpus.text_format,
            splits=tokenize.splits, framing=tokenize.framing, config=tokenize.config, tokenize_workers=tokenize.workers,
            suites=[self.suite(suite) for suite in self.validation])
        if bpe is not None:
            options.update(vocab_size=bpe.vocab_size, bpe_max_documents=bpe.max_documents)
        else:
            assert existing is not None, "the tokenizer validator requires one tokenizer"
            options.update(zip(("tokenizer", "tokenizer_label"), self.existing_tokenizer(existing), strict=True))
        corpus = self.corpus_step()
        if self.sweep is not None:
            return tokenized_corpus(self.name, corpus, **options)
        return language_model_pipeline(self.name, corpus, model=self.training.model.spec(),
                                       optimizer=self.training.optimizer.spec(), trainer=self.training.trainer.spec(),
                                       export=self.export, evaluate=self.evaluate, **options)

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

    def existing_tokenizer(self, existing: Existing) -> tuple[Step, str]:
        """The existing tokenizer's step and the tag naming the caches made with it (its label)."""
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
            recipe = self.recipe()
            assert isinstance(recipe, LanguageModelPipeline), "checkpoint_evals applies to one run, not a sweep"
            per_checkpoint.append(recipe.checkpoint_evals())
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
