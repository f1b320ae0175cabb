"""Recipes: the common chains of steps, wired once — as Marin's `default_tokenize` and `default_train` are.

`language_model_pipeline` is the chain the demo (`experiments/python_docs.py`), the generated-stories pipeline the
tests build (`experiments/tiny_stories.py`) and the YAML experiment component all make: a corpus → a tokenizer
(a BPE trained on the corpus, or an existing one) → a Levanter cache → one training run → its Hugging Face
export and its loss evaluation. `tokenized_corpus` is the first half alone (a sweep's shared cache). Each
returns its steps by role, as typed fields and as a mapping (`pipeline.train`, `pipeline["train"]`,
`dict(pipeline)`); every step is the one its factory makes, so a recipe's steps have the identities of the same
chain wired by hand.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec  # as the front door's
from marin_assets.steps.data import TokenizeStep, ValidationSuite, bpe_tokenizer_step, tokenize_step
from marin_assets.steps.evaluation import CheckpointEvals, EvalStep, loss_checkpoint_evals, loss_eval_step
from marin_assets.steps.train import TrainStep, export_step, train_step

BPE_LABEL = "bpe"
"""What names the caches made with a BPE a recipe trains: `tokenized/{prefix}-bpe`."""


@dataclass(frozen=True, eq=False)
class TokenizedCorpus(Mapping[str, Step]):
    """A corpus, its tokenizer and its Levanter cache, by role (`corpus`, `tokenizer`, `tokenized`, and
    `validation/{set}` for each validation cache given)."""

    prefix: str
    """What every step's name is made from (`tokenizers/{prefix}-bpe`)."""
    dataset: str
    """The corpus's name in a training mixture and in the evaluation metrics (`eval/{dataset}/loss`)."""
    corpus: Step
    tokenizer: Step
    tokenized: TokenizeStep
    validation: Mapping[str, Step] = field(default_factory=dict)
    """Caches every run is also scored on (weight 0 in training; each a set of the evaluation): the `suites`' sets
    tokenized with `tokenizer`, by component name (`{suite}-{set}`)."""

    def _roles(self) -> dict[str, Step]:
        return {"corpus": self.corpus, "tokenizer": self.tokenizer, "tokenized": self.tokenized,
                **{f"validation/{k}": s for k, s in self.validation.items()}}

    def __getitem__(self, role: str) -> Step:
        return self._roles()[role]

    def __iter__(self) -> Iterator[str]:
        return iter(self._roles())

    def __len__(self) -> int:
        return len(self._roles())

    @property
    def train_data(self) -> dict[str, Step]:
        """The training mixture: `{dataset: tokenized}`."""
        return {self.dataset: self.tokenized}

    @property
    def eval_data(self) -> dict[str, Step]:
        """What an evaluation scores: the corpus's validation split and every validation cache."""
        return {self.dataset: self.tokenized, **self.validation}


@dataclass(frozen=True, eq=False)
class LanguageModelPipeline(TokenizedCorpus):
    """The steps of one language-model experiment by role: `TokenizedCorpus`'s, then `train`, and `export` and
    `evaluate` when made. A mapping of role → step, in that order (`pipeline.values()`: every step)."""

    train: TrainStep = field(kw_only=True)
    export: Step | None = field(default=None, kw_only=True)
    """The run's Hugging Face export (`export_step`), None when not asked for."""
    evaluate: EvalStep | None = field(default=None, kw_only=True)
    """The last checkpoint's loss and bits per byte on `eval_data` (`loss_eval_step`), None when not asked for."""
    trainer: TrainerSpec = field(default=TrainerSpec(), kw_only=True)
    """The run's trainer settings (not a step: not in the mapping)."""

    def _roles(self) -> dict[str, Step]:
        more = {"export": self.export, "evaluate": self.evaluate}
        return {**super()._roles(), "train": self.train, **{k: s for k, s in more.items() if s is not None}}

    @property
    def model_label(self) -> str:
        """What names the run's steps after the prefix: the model family (`checkpoints/{prefix}-llama`)."""
        return self.train.name.removeprefix(f"checkpoints/{self.prefix}-")

    def checkpoint_evals(self, max_eval_batches: int | None | Literal["trainer"] = "trainer") -> CheckpointEvals:
        """Every checkpoint of the run, scored on `eval_data` as it lands (`loss_checkpoint_evals`), named
        `evals/{prefix}-{family}-checkpoints`; `max_eval_batches` per set (default: the run's trainer's own,
        `TrainerSpec.max_eval_batches`; None: all of each set)."""
        batches = self.trainer.max_eval_batches if max_eval_batches == "trainer" else max_eval_batches
        return loss_checkpoint_evals(f"evals/{self.prefix}-{self.model_label}-checkpoints", self.train,
                                     self.eval_data, max_eval_batches=batches)


def tokenized_corpus(prefix: str, corpus: Step, *, dataset: str | None = None, vocab_size: int | None = None,
                     tokenizer: Step | None = None, tokenizer_label: str | None = None,
                     bpe_max_documents: int | None = None, text_field: str = "text", text_format: str = "auto",
                     splits: dict[str, list[str]] | None = None, framing: str = "bos_eos",
                     config: str | None = None, tokenize_workers: int = 1,
                     suites: Sequence[ValidationSuite] = ()) -> TokenizedCorpus:
    """A corpus's tokenizer and Levanter cache: `tokenizers/{prefix}-bpe` (a byte-level BPE of `vocab_size` ids
    trained on `corpus`) or the `tokenizer` step given, and `tokenized/{prefix}-{label}`.

    Give exactly one of `vocab_size` and `tokenizer`. The label is `bpe` for a BPE trained here, else
    `tokenizer_label`, by default the tokenizer step's name after `tokenizers/{prefix}-` (or its last segment):
    `existing_tokenizer_step("tokenizers/docs-gpt2", "gpt2")` caches `tokenized/docs-gpt2`. `dataset` (default:
    `prefix`) names the corpus in mixtures and metrics. `suites` (`hf_validation_suite`, `url_validation_suite`)
    are tokenized with the same tokenizer (`validation`), for the runs and evaluations made from it.

    Identity: each step's, as `bpe_tokenizer_step` and `tokenize_step` make it — the BPE from `vocab_size`,
    `bpe_max_documents`, `text_field`, `text_format` (and `corpus`); the cache from `splits`, `config`,
    `text_field`, `text_format`, `framing` (and `corpus`, the tokenizer); the suites' caches as
    `ValidationSuite.tokenized` makes them from `suites`; not `tokenize_workers`. `prefix` and the label name the
    steps.
    """
    if (vocab_size is None) == (tokenizer is None):
        raise StepDefinitionError(f"recipe {prefix!r}: give a `vocab_size` (a BPE trained on the corpus) or a"
                                  f" `tokenizer` step, not {'both' if tokenizer is not None else 'neither'}")
    if tokenizer is None:
        assert vocab_size is not None
        tokenizer = bpe_tokenizer_step(f"tokenizers/{prefix}-{BPE_LABEL}", corpus, vocab_size=vocab_size,
                                       max_documents=bpe_max_documents, text_field=text_field,
                                       text_format=text_format)
        label = tokenizer_label or BPE_LABEL
    else:
        tail = tokenizer.name.rsplit("/", 1)[-1]
        label = tokenizer_label or tail.removeprefix(f"{prefix}-")
    tokenized = tokenize_step(f"tokenized/{prefix}-{label}", corpus, tokenizer, splits=splits, text_field=text_field,
                              workers=tokenize_workers, text_format=text_format, framing=framing, config=config)
    validation: dict[str, Step] = {}
    for suite in suites:
        validation.update(suite.tokenized(tokenizer, workers=tokenize_workers))
    return TokenizedCorpus(prefix, dataset or prefix, corpus, tokenizer, tokenized, validation)


def language_model_pipeline(prefix: str, corpus: Step, *, dataset: str | None = None,
                            model: ModelSpec = ModelSpec(), trainer: TrainerSpec = TrainerSpec(),
                            optimizer: OptimizerSpec = OptimizerSpec(), vocab_size: int | None = None,
                            tokenizer: Step | None = None, tokenizer_label: str | None = None,
                            bpe_max_documents: int | None = None, text_field: str = "text",
                            text_format: str = "auto", splits: dict[str, list[str]] | None = None,
                            framing: str = "bos_eos", config: str | None = None, tokenize_workers: int = 1,
                            suites: Sequence[ValidationSuite] = (), export: bool = True,
                            evaluate: bool = True, **train_options: Any) -> LanguageModelPipeline:
    """A language model's pipeline from a corpus: its tokenizer and cache (as `tokenized_corpus` makes them), one
    training run `checkpoints/{prefix}-{family}` on `{dataset: cache}` (`family`: `model.family`), its Hugging
    Face export `exports/{prefix}-{family}` and the loss of its last checkpoint `evals/{prefix}-{family}` on the
    validation split and every validation suite's sets.

        pipeline = language_model_pipeline("docs", python_docs_step("raw/docs"), vocab_size=1024, model=MODEL)
        Experiment("docs", [pipeline.export, pipeline.evaluate], [pipeline.checkpoint_evals()])

    The `suites`' sets are scored in training too (weight 0). `train_options` go to `train_step` (`weights`,
    `budget`, `init_from`, `gpu`, `gpu_type`, `tracking`, …); the evaluation runs on the same GPUs. `export` and
    `evaluate` False leave those steps out.

    Identity: each step's, as `tokenized_corpus`, `train_step`, `export_step` and `loss_eval_step` make it —
    from `corpus`, `vocab_size` or `tokenizer`, `bpe_max_documents`, `text_field`, `text_format`, `splits`,
    `config`, `framing`, `suites`, `model`, `optimizer`, `trainer` and `train_options`; `prefix`, `dataset`
    and the tokenizer's label name the steps and mixture components; not `tokenize_workers`.
    """
    data = tokenized_corpus(prefix, corpus, dataset=dataset, vocab_size=vocab_size, tokenizer=tokenizer,
                            tokenizer_label=tokenizer_label, bpe_max_documents=bpe_max_documents,
                            text_field=text_field, text_format=text_format, splits=splits, framing=framing,
                            config=config, tokenize_workers=tokenize_workers, suites=suites)
    run = f"{prefix}-{model.family}"
    train = train_step(f"checkpoints/{run}", data.train_data, model, optimizer, trainer,
                       validation=dict(data.validation) or None, **train_options)
    gpu = {"gpu": train_options.get("gpu", 0), "gpu_type": train_options.get("gpu_type")}
    return LanguageModelPipeline(
        data.prefix, data.dataset, data.corpus, data.tokenizer, data.tokenized, data.validation, train=train,
        trainer=trainer, export=export_step(f"exports/{run}", train) if export else None,
        evaluate=loss_eval_step(f"evals/{run}", train, data.eval_data, **gpu) if evaluate else None)


__all__ = ["language_model_pipeline", "LanguageModelPipeline", "tokenized_corpus", "TokenizedCorpus"]
