"""Any evaluation kind as steps: one checkpoint of a training run (`eval_step`), or every checkpoint as it
lands (`CheckpointEvals`, served as one partitioned asset by `marin_assets.dagster.checkpoint_evals`).

`eval_kind` is what is computed (an `EvalKind`); before 0.2.0 both took it as `kind`, which also names a step's
sort (`Step.kind`, the asset's kind tag): `eval_step(kind=…)`, `CheckpointEvals(kind=…)` and
`CheckpointEvals.kind` still work for one release, warning.

Identity is the kind's own attributes plus the checkpoint: a final step depends on the training step
(and reads its record); a per-checkpoint step runs while training goes on, before that record exists,
so the run's identity enters its hash_attrs instead (`checkpoint_of`) and the model and tokenizer come
from the typed `TrainStep`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from marin_assets.core.identity import identity_hash
from marin_assets.core.record import load_result
from marin_assets.core.renames import REMOVED_IN
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.evals.kind import Checkpoint, EvalKind
from marin_assets.pipeline.training.export import ExportResult
from marin_assets.pipeline.training.runner import platform_for
from marin_assets.pipeline.training.training_run import TrainStep

F = TypeVar("F", bound=Callable[..., Any])


def _takes_old_kind(where: str) -> Callable[[F], F]:
    """`fn` also taking its `eval_kind` argument by its name before 0.2.0, `kind=`, warning."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def taking(*args: Any, **kwargs: Any) -> Any:
            if "kind" in kwargs:
                if "eval_kind" in kwargs:
                    raise TypeError(f"{where}: give `eval_kind`, not both it and its old name `kind`")
                warnings.warn(f"{where}(kind=…) is now {where}(eval_kind=…); the old keyword goes in marin-assets"
                              f" {REMOVED_IN}", DeprecationWarning, stacklevel=2)
                kwargs["eval_kind"] = kwargs.pop("kind")
            return fn(*args, **kwargs)
        return taking  # type: ignore[return-value]
    return wrap


@dataclass(frozen=True, eq=False)
class EvalStep(Step):
    """An evaluation of a training run's checkpoint: reports and sensors find evaluations by this type."""

    evaluates: Step = field(kw_only=True)
    """The training step whose checkpoint (or export) is evaluated."""
    eval_kind: EvalKind = field(kw_only=True)
    """What is computed."""
    checkpoint_step: int | None = field(default=None, kw_only=True)
    """Which checkpoint; None: the last."""


@_takes_old_kind("eval_step")
def eval_step(name: str, eval_kind: EvalKind, train: Step, checkpoint_step: int | None = None, *,
              export: Step | None = None, gpu: float = 0, gpu_type: str | None = None,
              hosts: int = 1) -> EvalStep:
    """An evaluation of checkpoint `checkpoint_step` (default: the last) of a training step — or `export`, a Hugging
    Face export of it (`export_step`), or a model from the Hub (`hf_model_step`, `hf_to_levanter_step`) — with
    `eval_kind`, on `gpu` CUDA GPUs when asked, on `hosts` hosts (Ray nodes) as one JAX program when the kind
    can (`EvalKind.spans_hosts`).

    Identity: `eval_kind` and `checkpoint_step` (and `train`, `export` and the kind's steps); not `gpu`, `gpu_type`
    nor `hosts`.
    """
    kind = eval_kind
    if not isinstance(train, Step):
        raise StepDefinitionError(f"step {name!r}: evaluates {train!r}, which is not a step")
    check_hosts(f"step {name!r}", kind, hosts)
    resources = Resources(cpu=1, gpu=gpu, gpu_type=gpu_type, hosts=hosts)

    def run(out: str) -> Any:
        result: Any = load_result(train)  # a run's TrainResult, or a model from the Hub (HfModel, LevanterCheckpoint)
        model, tokenizer = result.model_and_tokenizer()
        path = load_result(export, ExportResult).path if export else result.checkpoint_path(checkpoint_step)
        return kind.evaluate(out, Checkpoint(path, model, tokenizer, result.vocab_size, platform_for(resources)))

    return EvalStep(name=name, fn=run, deps=[train, *kind.deps, *([export] if export else [])],
                    hash_attrs={**kind.identity(), "checkpoint_step": checkpoint_step}, resources=resources,
                    kind="eval", description=made_by(kind.function), kinds=list(kind.tags), checks=kind.checks(),
                    evaluates=train, eval_kind=kind, checkpoint_step=checkpoint_step)


def check_hosts(what: str, kind: EvalKind, hosts: int) -> None:
    """A kind evaluates on more than one host only if it can (`StepDefinitionError` naming it otherwise)."""
    if hosts > 1 and not kind.spans_hosts:
        raise StepDefinitionError(f"{what}: {type(kind).__name__} ({kind.summary()}) runs on one host; it cannot span"
                                  f" {hosts} hosts (loss evaluation can: loss_eval_step(..., hosts={hosts}))")


@dataclass(frozen=True)
class CheckpointEvals:
    """Evaluate each checkpoint of `train` with `eval_kind` as it lands: one step per checkpoint, served as one
    partitioned asset (`marin_assets.dagster.checkpoint_evals`)."""

    name: str
    """Asset name (`evals/tiny-llama-checkpoints`); checkpoint N's output is `{name}/step-N_{hash}`."""
    train: TrainStep
    """The training step whose checkpoints are evaluated."""
    eval_kind: EvalKind
    """What is computed on each (`kind` before 0.2.0: only the kind's identity is hashed, never the field's name)."""
    hosts: int = 1
    """Hosts (Ray nodes) each evaluation spans as one JAX program, when the kind can (not identity)."""

    def __post_init__(self) -> None:
        check_hosts(f"checkpoint evaluations {self.name!r}", self.eval_kind, self.hosts)

    @property
    def kind(self) -> EvalKind:
        """`eval_kind` by its name before 0.2.0, warning; goes in 0.3.0."""
        warnings.warn(f"CheckpointEvals.kind is now CheckpointEvals.eval_kind; the old name goes in marin-assets"
                      f" {REMOVED_IN}", DeprecationWarning, stacklevel=2)
        return self.eval_kind

    def _attrs(self) -> dict[str, Any]:
        return {"checkpoint_of": self.train.name_with_hash, **self.eval_kind.identity()}

    @property
    def hash(self) -> str:
        """Identity of the evaluation setup (each checkpoint adds its step)."""
        return identity_hash(self.name, self._attrs(), sorted(d.name_with_hash for d in self.eval_kind.deps))

    @property
    def deps(self) -> list[Step]:
        """Upstream assets besides the training step."""
        return list(self.eval_kind.deps)

    @property
    def description(self) -> str:
        """What the partitioned asset shows."""
        function, summary = self.eval_kind.function, self.eval_kind.summary()
        return (f"{summary[:1].upper()}{summary[1:]} of every checkpoint of"
                f" `{self.train.name}`, one partition per checkpoint step, added by the checkpoint sensor as each"
                f" lands. Made by `{function.__module__}.{function.__qualname__}`.")

    def step(self, checkpoint: int) -> EvalStep:
        """The evaluation of checkpoint step `checkpoint`: not a dependency of training, which may still run."""
        train, kind = self.train, self.eval_kind

        def run(out: str) -> Any:
            return kind.evaluate(out, Checkpoint(train.checkpoint_path(checkpoint), train.model,
                                                 train.tokenizer_path(), train.vocab_size()))

        return EvalStep(name=f"{self.name}/step-{checkpoint}", fn=run, deps=list(kind.deps),
                        hash_attrs={**self._attrs(), "checkpoint_step": checkpoint},
                        resources=Resources(cpu=1, hosts=self.hosts),
                        kind="eval", description=made_by(kind.function), kinds=list(kind.tags), checks=kind.checks(),
                        evaluates=train, eval_kind=kind, checkpoint_step=checkpoint)

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """A partition's numbers (Dagster plots them across partitions)."""
        return self.eval_kind.numbers(result)

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """A checkpoint's row of the all-checkpoints table."""
        return self.eval_kind.row(result)

    def columns(self) -> list[str]:
        """The all-checkpoints table's columns after `step`."""
        return self.eval_kind.columns()


CheckpointEvals.__init__ = _takes_old_kind("CheckpointEvals")(CheckpointEvals.__init__)  # type: ignore[method-assign]
