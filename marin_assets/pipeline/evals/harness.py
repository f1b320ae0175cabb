"""Downstream evaluation with lm-evaluation-harness: multiple-choice, loglikelihood and generative (`generate_until`)
tasks on a checkpoint.

A task is an lm-eval YAML file and the local data files it names (`dataset_kwargs.data_files`, resolved
against the YAML's folder — lm-eval alone resolves them against its working directory). Their content, not
their place, is the task's identity: edit a row and every evaluation using the task is a new output.

The model is Levanter's lm-eval adapter (`levanter.eval_harness`: the checkpoint scored on one process, requests
packed several to a sequence of the model's training length), with one change: requests are tokenized as lm-eval's
`TemplateLM` does (context and continuation without special tokens, split where the whole text's tokens part) behind
the document-start token training put before every document. Levanter's own adapter tokenizes the text alone: no
document-start token before the context, unlike every training document, and after an empty context the
continuation's first token goes unscored. Generative tasks are answered by the project's one generation engine
(`training.generation`), greedy unless the task samples, cut at the task's `until` texts, and scored by lm-eval's
own filters and metrics (exact match after a regex, as GSM8K defines it). lm-eval then runs as `simple_evaluate`
does, on tasks loaded without indexing its 14,700 built-in ones, and the few-shot count it reports for each task is
checked against the one asked for. Each score carries its task's overlap with the evaluated run's training data,
found through the run's lineage (`evals/contamination.py`), so that a contaminated score is never read as clean."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import open_file
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.evals.contamination import (
    Contamination,
    TaskContamination,
    contamination_status,
    task_contamination,
)
from marin_assets.pipeline.evals.harness_tasks import HarnessTask, HarnessTaskError, harness_task
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.evals.levanter_harness import harness_model, single_process_bootstrap
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep, eval_step
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.training.export import checkpoint_step_of
from marin_assets.pipeline.training.lineage import Lineage, training_datasets_of
from marin_assets.pipeline.training.specs import ModelSpec
from marin_assets.pipeline.training.training_run import TrainStep

BOOTSTRAP_ITERS = 1000
"""Bootstrap resamples for the stderr of metrics without a closed form (perplexity); acc's is closed form."""


RESULTS_FILE = "lm_eval_results.json"


METRICS = ("acc", "acc_norm", "perplexity")


class HarnessEvalError(RuntimeError):
    """lm-eval ran something other than what was asked (another few-shot count, a missing task)."""


@dataclass(frozen=True)
class TaskScore:
    """One task's scores as lm-eval reports them (`acc,none` …); None where the task has no such metric."""

    output_type: str
    samples: int
    """Documents scored (lm-eval's effective n-samples, after `limit`)."""
    num_fewshot: int
    """Few-shot examples per prompt, as lm-eval's results say it ran."""
    acc: float | None = None
    acc_stderr: float | None = None
    acc_norm: float | None = None
    """Multiple choice: accuracy with each choice's loglikelihood divided by its length in characters (lm-eval
    divides by `len(choice)` of the string: characters, not bytes or tokens)."""
    acc_norm_stderr: float | None = None
    perplexity: float | None = None
    """Loglikelihood tasks: exp of minus the mean loglikelihood of the continuation."""
    perplexity_stderr: float | None = None
    exact_match: float | None = None
    """Generative tasks: the share of answers equal to the target after the task's first filter (`strict-match`
    for GSM8K-style tasks: the number after `####`); every filter's share is in `exact_match_by_filter`."""
    exact_match_stderr: float | None = None
    exact_match_by_filter: dict[str, float] = field(default_factory=dict)
    """Filter name (`strict-match`, `flexible-extract`; `none` without filters) → exact match after it."""
    truncated: int = 0
    """Requests (one per choice) whose context was cut from the left to the model's length: few-shot examples
    lost. Many: ask for fewer examples, or evaluate a model with a longer `seq_len`."""
    contamination: float | None = None
    """The share of the scored documents sharing an n-gram with the model's training data (`HarnessResult.
    contamination`); None: not measured."""
    contaminated: bool | None = None
    """True when some scored document is in the training data: this score is not clean. None: unknown (not
    measured, or part of the training data could not be read and none of the rest holds a document)."""


@record_type("harness_result")
@dataclass(frozen=True)
class HarnessResult:
    """lm-eval's scores of one checkpoint, per task; its full results and samples are under the output."""

    checkpoint: str
    step: int | None
    num_fewshot: int
    limit: int | None
    tasks: dict[str, TaskScore]
    """Task name → scores (a table in the UI: one row per task)."""
    seconds: float
    """Scoring every task (the model loaded and compiled)."""
    load_seconds: float
    """Loading the checkpoint."""
    results_file: str = RESULTS_FILE
    """lm-eval's results JSON (all but the samples), relative to the output."""
    samples_dir: str = "samples"
    """Every scored document's prompt, choices and loglikelihoods, `{task}.jsonl`."""
    contamination: Contamination | None = None
    """Per task, the scored documents found in the evaluated model's training data (through its lineage)."""
    contamination_status: str = ""
    """One line: `clean`, `CONTAMINATED: …` or `unknown: …`, and why."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def task_scores(results: Mapping[str, Any], names: Sequence[str], num_fewshot: int, where: str,
                truncated: Mapping[str, int] | None = None) -> dict[str, TaskScore]:
    """Each task's scores from lm-eval's results, after checking that it ran `num_fewshot`-shot by both its
    results (`n-shot`) and its config (`num_fewshot`): lm-eval keeps a task's YAML `num_fewshot: 0` over the
    one asked for, and a count silently different from the asked one would mislabel every score."""
    scores = {}
    for name in names:
        if name not in results.get("results", {}):
            raise HarnessEvalError(f"{where}: lm-eval returned no results for task {name!r}"
                                   f" (it has {sorted(results.get('results', {}))})")
        reported = results.get("n-shot", {}).get(name)
        configured = results.get("configs", {}).get(name, {}).get("num_fewshot")
        if reported != num_fewshot or configured != num_fewshot:
            raise HarnessEvalError(f"{where}: task {name!r} ran {reported}-shot (lm-eval's n-shot; its config says"
                                   f" num_fewshot={configured}) but {num_fewshot}-shot was asked; lm-eval keeps a"
                                   " task's own `num_fewshot: 0`: remove it from the task's YAML")
        row = results["results"][name]
        values: dict[str, Any] = {m: _number(row.get(f"{m},none")) for m in METRICS}
        stderrs: dict[str, Any] = {f"{m}_stderr": _number(row.get(f"{m}_stderr,none")) for m in METRICS}
        samples = results.get("n-samples", {}).get(name, {}).get("effective", 0)
        config = results.get("configs", {}).get(name, {})
        by_filter = {key.split(",", 1)[1]: float(v) for key, v in row.items()
                     if key.startswith("exact_match,") and _number(v) is not None}
        first = next((f["name"] for f in config.get("filter_list") or [] if f.get("name") in by_filter),
                     "none" if "none" in by_filter else next(iter(by_filter), None))
        scores[name] = TaskScore(config.get("output_type", ""), int(samples), int(reported), **values, **stderrs,
                                 exact_match=by_filter.get(first) if first else None,
                                 exact_match_stderr=_number(row.get(f"exact_match_stderr,{first}")) if first else None,
                                 exact_match_by_filter=by_filter, truncated=(truncated or {}).get(name, 0))
    return scores


def evaluate_harness(output_path: str, checkpoint: str, model: ModelSpec, tokenizer_path: str,
                     tasks: Sequence[HarnessTask], num_fewshot: int = 0, limit: int | None = None,
                     vocab_size: int | None = None, batch_size: int = 8, platform: str | None = None,
                     lineage: Lineage | None = None) -> HarnessResult:
    """lm-evaluation-harness tasks (multiple choice, loglikelihood) on a Levanter checkpoint or Hugging Face folder.

    Runs as `lm_eval.simple_evaluate` with `num_fewshot` examples per prompt (seeded sampling) on the first
    `limit` documents of each task (None: all); checks each task ran `num_fewshot`-shot; writes lm-eval's results
    JSON, each task's samples and the task files used under `output_path`. With the model's `lineage`, each
    task's score carries the share of its scored documents found in the model's training data
    (`evals/contamination.py`), and the result says whether the scores are clean."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable
    with s3_arrays([checkpoint, output_path]):

        where = f"harness evaluation of {checkpoint}"
        for task in tasks:
            task.verify()
        names = [t.name for t in tasks]
        with tempfile.TemporaryDirectory(prefix="marin-harness-data-") as cache:
            configs = [t.config(cache_dir=cache) for t in tasks]
            started = time.monotonic()
            with harness_model(checkpoint, model, tokenizer_path, vocab_size, batch_size, platform) as lm:
                loaded = time.monotonic()
                with single_process_bootstrap():
                    results = lm_eval.simple_evaluate(model=lm, tasks=configs, num_fewshot=num_fewshot, limit=limit,
                                                      task_manager=TaskManager(include_defaults=False),
                                                      bootstrap_iters=BOOTSTRAP_ITERS, log_samples=True)
                truncated = dict(lm.truncated)
            finished = time.monotonic()
        if results is None:
            raise HarnessEvalError(f"{where}: lm-eval returned no results (not rank 0)")
        scores = task_scores(results, names, num_fewshot, where, truncated)
        samples = results.pop("samples", {})
        with open_file(join_path(output_path, RESULTS_FILE), "w") as f:
            json.dump(results, f, indent=2, default=handle_non_serializable)
        for name, rows in samples.items():
            with open_file(join_path(output_path, "samples", f"{name}.jsonl"), "w") as f:
                for row in rows:
                    f.write(json.dumps(row, default=handle_non_serializable) + "\n")
        for task in tasks:  # the exact files scored, beside the scores
            for relative in task.files:
                kept = join_path(output_path, "tasks", task.name, relative.replace("../", "_up/"))
                with open(task.folder / relative, "rb") as src, open_file(kept, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        contamination = None
        if lineage is not None:
            contamination = task_contamination(tasks, lineage, {n: [r["doc_id"] for r in rows]
                                                                for n, rows in samples.items()})
            scores = {n: _with_contamination(s, contamination.tasks.get(n), bool(contamination.unknown))
                      for n, s in scores.items()}
        return HarnessResult(checkpoint, checkpoint_step_of(checkpoint), num_fewshot, limit, scores,
                             round(finished - loaded, 2), round(loaded - started, 2), contamination=contamination,
                             contamination_status=contamination_status(contamination))


def _with_contamination(score: TaskScore, task: TaskContamination | None, partial: bool) -> TaskScore:
    """A task's score with its overlap: contaminated when some scored document is in the training data read;
    unknown when none is but part of the training data was not read (`partial`), or nothing was measured."""
    if task is None:
        return score
    return replace(score, contamination=task.fraction,
                   contaminated=True if task.contaminated else None if partial else False)


def every_task_scored(names: Sequence[str]) -> Check:
    """The check that every task scored at least one document, with a finite accuracy (or perplexity)."""
    def check(output_path: str, result: dict) -> CheckOutcome:
        scored = {n: (result.get("tasks") or {}).get(n) or {} for n in names}
        metric = {n: next((m for m in ("acc", "exact_match") if s.get(m) is not None), "perplexity")
                  for n, s in scored.items()}
        values = {n: scored[n].get(metric[n]) for n in names}
        missing = [n for n, v in values.items()
                   if not isinstance(v, (int, float)) or not math.isfinite(v) or not scored[n].get("samples")]
        if missing:
            return CheckOutcome(False, f"no documents scored, or no finite accuracy, exact match or perplexity, for"
                                       f" {', '.join(missing)}")
        return CheckOutcome(True, ", ".join(f"{n}: {metric[n]} {v:.3g}" for n, v in values.items()),
                            {f"{n}_{metric[n]}": v for n, v in values.items()})

    return Check("every_task_scored", check,
                 f"Every task ({', '.join(names)}) scored documents, with a finite accuracy (or perplexity).")


def _as_tasks(where: str, tasks: Sequence[HarnessTask | str], num_fewshot: int, limit: int | None) -> list[HarnessTask]:
    """Tasks (YAML paths read), checked for one name each and sane counts, or a `StepDefinitionError`."""
    try:
        read = [t if isinstance(t, HarnessTask) else harness_task(t) for t in tasks]
    except HarnessTaskError as e:
        raise StepDefinitionError(f"{where}: {e}") from None
    names = [t.name for t in read]
    problem = ("no tasks" if not read else f"two tasks are named {sorted({n for n in names if names.count(n) > 1})}"
               if len(set(names)) != len(names) else f"num_fewshot must be 0 or more, got {num_fewshot}"
               if num_fewshot < 0 else f"limit must be positive, got {limit}" if limit is not None and limit <= 0
               else None)
    if problem:
        raise StepDefinitionError(f"{where}: {problem}")
    return read


@dataclass(frozen=True)
class HarnessEval:
    """The lm-eval kind: tasks (local YAML and data, their content in identity) scored on a checkpoint."""

    tasks: Sequence[HarnessTask]
    num_fewshot: int = 0
    limit: int | None = None
    """Documents per task; None for all."""
    batch_size: int = 8
    lineage: Lineage | None = field(default=None, compare=False)
    """What the evaluated run was trained on (`training_datasets_of`): each score then carries its task's overlap
    with that text. Not identity: the overlap is decided by what is — the tasks' content, and the training data,
    whose steps' hashes are in the training run's identity, on which every evaluation of it depends."""
    tags: ClassVar[tuple[str, ...]] = ("levanter", "jax", "lm-eval")
    function: ClassVar[Callable[..., Any]] = staticmethod(evaluate_harness)
    spans_hosts: ClassVar[bool] = False
    """lm-eval's loop runs on one host."""

    def identity(self) -> dict[str, Any]:
        return {"tasks": [t.identity() for t in self.tasks], "num_fewshot": self.num_fewshot, "limit": self.limit}

    @property
    def deps(self) -> list[Step]:
        return []  # the tasks are files, read into identity

    def summary(self) -> str:
        return f"lm-eval tasks {', '.join(t.name for t in self.tasks)} ({self.num_fewshot}-shot)"

    def evaluate(self, output_path: str, checkpoint: Checkpoint) -> HarnessResult:
        return evaluate_harness(output_path, checkpoint.path, checkpoint.model, checkpoint.tokenizer_path,
                                self.tasks, self.num_fewshot, self.limit, vocab_size=checkpoint.vocab_size,
                                batch_size=self.batch_size, platform=checkpoint.platform, lineage=self.lineage)

    def checks(self) -> list[Check]:
        return [every_task_scored([t.name for t in self.tasks])]

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """Each task's acc and acc_norm (or perplexity)."""
        return {k: v for k, v in self.row(result).items() if v is not None and not k.endswith("_stderr")}

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """Each task's acc, acc_norm and their stderr."""
        scored = result.get("tasks") or {}
        return {f"{t.name}/{m}": (scored.get(t.name) or {}).get(m) for t in self.tasks for m in _metrics(t)}

    def columns(self) -> list[str]:
        return [f"{t.name}/{m}" for t in self.tasks for m in _metrics(t)]

    def summary_columns(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """Each task's acc, acc_norm, exact match and perplexity, where measured, and its contamination beside them."""
        scored = result.get("tasks") or {}
        return {f"{task}/{m}": score[m] for task, score in scored.items()
                for m in ("acc", "acc_norm", "exact_match", "perplexity", "contamination") if score.get(m) is not None}


def _metrics(task: HarnessTask) -> tuple[str, ...]:
    if task.output_type == "multiple_choice":
        return ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")
    if task.output_type == "generate_until":
        return ("exact_match", "exact_match_stderr")
    return ("acc", "acc_stderr", "perplexity")


def harness_eval_step(name: str, train: Step, tasks: Sequence[HarnessTask | str], num_fewshot: int = 0,
                      checkpoint_step: int | None = None, limit: int | None = None, export: Step | None = None,
                      batch_size: int = 8, gpu: float = 0, gpu_type: str | None = None) -> EvalStep:
    """lm-eval tasks (`HarnessTask`s or YAML paths) on a checkpoint (default: the last) of a training step (its
    result is a `TrainResult`, which says the model and tokenizer) — or on `export`, a Hugging Face export of it
    (`export_step`). Each task's files are read here: their content is the step's identity. Each score carries
    its task's overlap with the run's training data, found through its lineage (`training_datasets_of`).

    Identity: `tasks` (every file's content), `num_fewshot`, `limit`, `checkpoint_step` (and `train`, `export`); not
    `batch_size`, `gpu` nor `gpu_type`.
    """
    kind = HarnessEval(tuple(_as_tasks(f"step {name!r}", tasks, num_fewshot, limit)), num_fewshot, limit, batch_size,
                       lineage=training_datasets_of(train))
    return eval_step(name, kind, train, checkpoint_step, export=export, gpu=gpu, gpu_type=gpu_type)


def harness_checkpoint_evals(name: str, train: TrainStep, tasks: Sequence[HarnessTask | str], num_fewshot: int = 0,
                             limit: int | None = None) -> CheckpointEvals:
    """lm-eval tasks on each checkpoint of `train` as it lands (one partition per checkpoint).

    Identity: each checkpoint's step's: `tasks`, `num_fewshot`, `limit`, the checkpoint (and `train`).
    """
    read = _as_tasks(f"checkpoint evaluations {name!r}", tasks, num_fewshot, limit)
    return CheckpointEvals(name, train, HarnessEval(tuple(read), num_fewshot, limit,
                                                    lineage=training_datasets_of(train)))
