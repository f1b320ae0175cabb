"""Downstream evaluation with lm-evaluation-harness: multiple-choice and loglikelihood tasks on a checkpoint.

A task is an lm-eval YAML file and the local data files it names (`dataset_kwargs.data_files`, resolved
against the YAML's folder — lm-eval alone resolves them against its working directory). Their content, not
their place, is the task's identity: edit a row and every evaluation using the task is a new output.

The model is Levanter's lm-eval adapter (`levanter.eval_harness`: the checkpoint scored on one process,
requests packed several to a sequence), with one change: requests are tokenized as lm-eval's `TemplateLM` does
(context and continuation without special tokens, split where the whole text's tokens part) behind the
document-start token training put before every document. Levanter's own adapter tokenizes each text with the
tokenizer's post-processor, which with our tokenizers (BOS and EOS around every text) counts the context's
trailing EOS as prompt, leaves the continuation's first token unscored and scores a spurious EOS.
lm-eval then runs as `simple_evaluate` does, on tasks loaded without indexing its 14,700 built-in ones, and
the few-shot count it reports for each task is checked against the one asked for.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import open_file
from marin_assets.core.identity import identity_hash
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.evaluate import ExportResult, _step_of, is_hf_model
from marin_assets.pipeline.specs import ModelSpec, TrainerSpec
from marin_assets.pipeline.tokenizer import model_vocab_size
from marin_assets.pipeline.train import TrainResult, TrainStep, platform_for

SHIPPED_TASKS_DIR = Path(__file__).resolve().parents[2] / "resources" / "eval_tasks"
"""The tasks the project ships: `{name}/{name}.yaml` and its data (see `generate.py` there)."""
SHIPPED_TASKS = ("pydocs_next_sentence", "pydocs_last_word")
"""Multiple choice and loglikelihood, on sentences of Python's documentation held out from the demo corpus."""
OUTPUT_TYPES = ("multiple_choice", "loglikelihood")
"""What the Levanter adapter scores: loglikelihoods of continuations (no generation, no rolling windows)."""
BOOTSTRAP_ITERS = 1000
"""Bootstrap resamples for the stderr of metrics without a closed form (perplexity); acc's is closed form."""
RESULTS_FILE = "lm_eval_results.json"
METRICS = ("acc", "acc_norm", "perplexity")


class HarnessTaskError(ValueError):
    """A task cannot be used: its YAML or a data file is missing or malformed, or it changed since its step
    was defined."""


class HarnessEvalError(RuntimeError):
    """lm-eval ran something other than what was asked (another few-shot count, a missing task)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class HarnessTask:
    """An lm-eval task from a YAML file, identified by the content of every file it reads."""

    name: str
    """The YAML's `task`: the name lm-eval reports results under."""
    yaml: str
    """Absolute path of the YAML file (not identity: the same files elsewhere are the same task)."""
    output_type: str
    files: Mapping[str, str]
    """Path relative to the YAML's folder → sha256: the YAML, the YAMLs it includes, its data files and the
    Python files its `!function`s live in."""
    data_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Split → data files relative to the YAML's folder, as the YAML names them."""

    def identity(self) -> dict[str, Any]:
        """What enters a step's identity: the task's name and its files' content."""
        return {"name": self.name, "files": dict(sorted(self.files.items()))}

    @property
    def folder(self) -> Path:
        """The YAML's folder, which the task's relative paths start from."""
        return Path(self.yaml).parent

    def verify(self) -> None:
        """Raise if a file changed since the task was read (the step's identity would no longer describe it)."""
        for relative, digest in self.files.items():
            path = self.folder / relative
            if not path.is_file():
                raise HarnessTaskError(f"harness task {self.yaml}: {relative} is gone since the step was defined")
            if _sha256(path) != digest:
                raise HarnessTaskError(f"harness task {self.yaml}: {relative} changed since the step was defined"
                                       " (its content is the step's identity): define the step again")

    def config(self, cache_dir: str | None = None) -> dict[str, Any]:
        """The task as an lm-eval config dict: `!function`s imported, data files as absolute paths, and the
        datasets cache in `cache_dir` (None: the datasets library's own)."""
        from lm_eval.tasks._yaml_loader import load_yaml

        config = load_yaml(self.yaml, resolve_func=True)
        kwargs = dict(config.get("dataset_kwargs") or {})
        kwargs["data_files"] = {split: [str(self.folder / f) for f in files]
                                for split, files in self.data_files.items()}
        if cache_dir is not None:
            kwargs["cache_dir"] = cache_dir
        config["dataset_kwargs"] = kwargs
        return config


_FUNCTION_TAG = re.compile(r"!function\s+([A-Za-z_][\w.]*)\.[A-Za-z_]\w*")


@functools.cache
def _yaml_loader() -> type:
    """A safe YAML loader reading lm-eval's `!function module.name` tags as text (lm-eval's own loader imports
    them, and importing lm-eval takes seconds: too slow where steps are defined)."""
    import yaml

    class TaskLoader(yaml.SafeLoader):
        """Safe YAML plus lm-eval's `!function` tag."""

    TaskLoader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")
    return TaskLoader


def _read_yaml(path: Path, root: str) -> dict[str, Any]:
    """One YAML file as a mapping, or a `HarnessTaskError` naming it and where it is malformed."""
    import yaml

    if not path.is_file():
        raise HarnessTaskError(f"harness task {root}: no such file {path}")
    try:
        with open(path, "rb") as f:
            config = yaml.load(f, Loader=_yaml_loader())  # noqa: S506 - a safe loader with one more tag
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise HarnessTaskError(f"harness task {root}: {path.name} is not valid YAML ({problem}{where})") from None
    if not isinstance(config, dict):
        raise HarnessTaskError(f"harness task {root}: {path.name} holds a YAML {type(config).__name__}, not a"
                               " mapping of task settings")
    return config


def _check_rows(path: Path, relative: str, root: str) -> None:
    """Every line of a JSON lines data file is a JSON object (else the file and line, not a datasets trace)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise HarnessTaskError(f"harness task {root}: data file {relative}, line {number}: malformed JSON"
                                       f" ({e})") from None
            if not isinstance(row, dict):
                raise HarnessTaskError(f"harness task {root}: data file {relative}, line {number}: a JSON"
                                       f" {type(row).__name__}, not an object (JSON lines hold one object per line)")


def _merged_yaml(path: Path, root: str, files: dict[str, str], seen: frozenset[Path] = frozenset()) -> dict[str, Any]:
    """A YAML with the files it includes merged in as lm-eval merges them (includes in order, then its own keys);
    each file read, and each Python file of its `!function`s, goes into `files` with its sha256."""
    if path in seen:
        raise HarnessTaskError(f"harness task {root}: {path.name} includes itself")
    config = _read_yaml(path, root)
    folder = Path(root).parent
    files[os.path.relpath(path, folder)] = _sha256(path)
    for module in _FUNCTION_TAG.findall(path.read_text(encoding="utf-8", errors="replace")):
        source = path.parent / (module.replace(".", "/") + ".py")
        if source.is_file():
            files[os.path.relpath(source, folder)] = _sha256(source)
    includes = config.pop("include", None) or []
    merged: dict[str, Any] = {}
    for include in includes if isinstance(includes, list) else [includes]:
        merged.update(_merged_yaml((path.parent / str(include)).resolve(), root, files, seen | {path}))
    return {**merged, **config}


def harness_task(yaml_path: str | os.PathLike[str]) -> HarnessTask:
    """Read an lm-eval task YAML and the files it names; malformed or missing ones are a `HarnessTaskError`
    naming the YAML file."""
    path = Path(yaml_path).expanduser().resolve()
    root, folder = str(path), path.parent
    files: dict[str, str] = {}
    merged = _merged_yaml(path, root, files)
    name = merged.get("task")
    if not isinstance(name, str) or not name:
        raise HarnessTaskError(f"harness task {root}: no 'task' name (a task YAML names its task: `task: my_task`)")
    output_type = merged.get("output_type", "generate_until")
    if output_type not in OUTPUT_TYPES:
        raise HarnessTaskError(f"harness task {root}: output_type {output_type!r} is not scored here (only"
                               f" {', '.join(OUTPUT_TYPES)}: Levanter's adapter scores loglikelihoods, it does not"
                               " generate)")
    listed = (merged.get("dataset_kwargs") or {}).get("data_files")
    if not listed:
        raise HarnessTaskError(f"harness task {root}: no local data files (dataset_kwargs.data_files): a task's"
                               " identity is its files' content, so its data must be files next to it")
    by_split = listed if isinstance(listed, Mapping) else {"train": listed}
    data_files: dict[str, tuple[str, ...]] = {}
    for split, names in by_split.items():
        data_files[str(split)] = tuple(str(n) for n in (names if isinstance(names, list) else [names]))
        for relative in data_files[str(split)]:
            data = (folder / relative).resolve()
            if not data.is_file():
                raise HarnessTaskError(f"harness task {root}: data file {relative!r} (split {split!r}) not found at"
                                       f" {data} (data files are relative to the YAML's folder)")
            if data.suffix == ".jsonl":
                _check_rows(data, relative, root)
            files[os.path.relpath(data, folder)] = _sha256(data)
    return HarnessTask(name, root, output_type, files, data_files)


def shipped_task(name: str) -> HarnessTask:
    """One of the project's own tasks (`SHIPPED_TASKS`), from `resources/eval_tasks/{name}/{name}.yaml`."""
    if name not in SHIPPED_TASKS:
        raise HarnessTaskError(f"no shipped task {name!r} (shipped: {', '.join(SHIPPED_TASKS)})")
    return harness_task(SHIPPED_TASKS_DIR / name / f"{name}.yaml")


def shipped_tasks() -> list[HarnessTask]:
    """All the project's own tasks."""
    return [shipped_task(n) for n in SHIPPED_TASKS]


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
    """Multiple choice: accuracy with each choice's loglikelihood divided by its length in bytes."""
    acc_norm_stderr: float | None = None
    perplexity: float | None = None
    """Loglikelihood tasks: exp of minus the mean loglikelihood of the continuation."""
    perplexity_stderr: float | None = None
    truncated: int = 0
    """Requests (one per choice) whose context was cut from the left to the model's length: few-shot examples
    lost. Many: ask for fewer examples, or evaluate a model with a longer `seq_len`."""


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
        values = {m: _number(row.get(f"{m},none")) for m in METRICS}
        stderrs = {f"{m}_stderr": _number(row.get(f"{m}_stderr,none")) for m in METRICS}
        samples = results.get("n-samples", {}).get(name, {}).get("effective", 0)
        output_type = results.get("configs", {}).get(name, {}).get("output_type", "")
        scores[name] = TaskScore(output_type, int(samples), int(reported), **values, **stderrs,
                                 truncated=(truncated or {}).get(name, 0))
    return scores


@functools.cache
def _lm_class() -> type:
    """The lm-eval model class (built on first use: Levanter and lm-eval are imported only where it runs)."""
    import jax
    import numpy as np
    from levanter.data.loader import stack_batches
    from levanter.data.packing import PromptCompletion, greedy_pack_prompt_completions
    from levanter.eval_harness import LevanterHarnessLM, get_segment_ids_from_batch
    from lm_eval.api.model import TemplateLM

    class FramedHarnessLM(LevanterHarnessLM):
        """Levanter's lm-eval model, tokenizing as lm-eval's `TemplateLM` does behind the document-start token."""

        def __init__(self, leader: Any):
            super().__init__(leader)
            self.truncated: dict[str, int] = {}
            """Task → requests whose context was cut from the left to fit the model's length."""

        @property
        def prefix_token_id(self) -> int:
            """The token training put before every document: BOS, else EOS (which ends the one before)."""
            bos = self.tokenizer.bos_token_id
            return bos if bos is not None else self.tokenizer.eos_token_id

        def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
            """Token ids of text alone: never the post-processor's BOS/EOS."""
            ids = self.tokenizer(string, add_special_tokens=False, return_attention_mask=False).input_ids
            return ids[-left_truncate_len:] if left_truncate_len else ids

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            """lm-eval's encoding of each (context, continuation), then `_loglikelihood_tokens`; counts per task
            the requests cut to the model's length in `truncated`."""
            self._cut: list[int] = []
            scored = TemplateLM.loglikelihood(self, requests, disable_tqdm=disable_tqdm)
            for i in self._cut:
                self.truncated[requests[i].task_name] = self.truncated.get(requests[i].task_name, 0) + 1
            return scored

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False):
            """Score tokenized requests, packed several to a sequence (attention stays within each), in batches.

            Each is the document-start token, the context and the continuation, cut from the left to the
            model's length; the continuation's tokens are scored."""
            Pos, prefix = self.EvalPos, self.prefix_token_id
            sequences = []
            for i, (_, context, continuation) in enumerate(requests):
                context = context if context[:1] == [prefix] else [prefix, *context]
                ids = (context + continuation)[-Pos.size:]
                if len(context) + len(continuation) > Pos.size:
                    self._cut.append(i)
                sequences.append(PromptCompletion(ids=ids, prompt_length=max(len(ids) - len(continuation), 1),
                                                  segment_id=i))
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else prefix
            packed = greedy_pack_prompt_completions(Pos, sequences, pad_token=pad,
                                                    max_segments_per_example=self.leader.max_packed_segments)
            logprobs, greedy = np.zeros(len(requests)), np.zeros(len(requests), dtype=bool)
            covered = np.zeros(len(requests), dtype=bool)
            for batch in stack_batches(iter(packed), Pos, self.EvalBatch):
                expected = set(get_segment_ids_from_batch(batch, self.leader.max_packed_segments * self.EvalBatch.size))
                ids, lls, correct = (jax.device_get(a.array) for a in self.leader.dispatch_loglikelihood(batch))
                valid = ids != -1
                if set(ids[valid].tolist()) != expected:
                    raise RuntimeError(f"scored segments {sorted(set(ids[valid].tolist()))} are not the batch's"
                                       f" {sorted(expected)}")
                logprobs[ids[valid]], greedy[ids[valid]] = lls[valid], correct[valid]
                covered[ids[valid]] = True
            if not covered.all():
                raise RuntimeError(f"requests {np.where(~covered)[0][:10].tolist()} were not scored")
            return [(float(lp), bool(g)) for lp, g in zip(logprobs, greedy, strict=True)]

    return FramedHarnessLM


@contextlib.contextmanager
def harness_model(checkpoint: str, model: ModelSpec, tokenizer_path: str, vocab_size: int | None = None,
                  batch_size: int = 8, platform: str | None = None) -> Iterator[Any]:
    """A Levanter checkpoint (or Hugging Face folder) as an lm-eval model (`lm_eval.api.model.LM`), for
    `lm_eval.simple_evaluate(model=…)`: loglikelihoods of `batch_size` packed sequences at a time.

    `vocab_size`: rows of the model's embedding (None: as a fresh training run sizes it)."""
    from marin_assets.pipeline.levanter_configs import use_platform

    use_platform(platform, f"harness evaluation of {checkpoint}")  # before Levanter starts JAX
    import equinox as eqx
    import haliax as hax
    import jax
    from levanter.checkpoint import load_checkpoint
    from levanter.compat.hf_checkpoints import load_tokenizer
    from levanter.eval_harness import _LmEvalHarnessWorker
    from levanter.utils.jax_utils import use_cpu_device
    from levanter.utils.tree_utils import inference_mode

    from marin_assets.pipeline.levanter_configs import (
        model_config,
        model_vocab_view,
        trainer_config,
        write_reference_config,
    )

    is_hf = is_hf_model(checkpoint)
    vocab = vocab_size or model_vocab_size(tokenizer_path, model.vocab_multiple)
    tokenizer = load_tokenizer(tokenizer_path)
    with tempfile.TemporaryDirectory(prefix="marin-harness-") as scratch:
        config = model_config(model, write_reference_config(model, vocab, os.path.join(scratch, "ref")),
                              tokenizer_path)
        trainer = trainer_config(TrainerSpec(num_train_steps=1, train_batch_size=batch_size), "harness", scratch,
                                 "marin.harness", require_accelerator=platform not in (None, "cpu"))
        with trainer.use_device_mesh(), hax.axis_mapping(trainer.parameter_axis_mapping):
            if is_hf:
                # Levanter cuts a Hugging Face model's vocabulary to `len(tokenizer)`: a view says the model's
                converter = config.hf_checkpoint_converter().replaced(reference_checkpoint=checkpoint,
                                                                      tokenizer=model_vocab_view(tokenizer, vocab))
                lm_model = converter.load_pretrained(config.model_type, ref=checkpoint,
                                                     dtype=trainer.mp.compute_dtype)
            else:
                with use_cpu_device():
                    lm_model = eqx.filter_eval_shape(config.build, hax.Axis("vocab", vocab), key=jax.random.PRNGKey(0))
                    lm_model = load_checkpoint(lm_model, checkpoint, subpath="model")
                lm_model = hax.shard(lm_model, trainer.parameter_axis_mapping)
            lm_model = inference_mode(lm_model, True)
            worker = _LmEvalHarnessWorker(trainer.TrainBatch, lm_model.Pos, lm_model, trainer.compute_axis_mapping,
                                          tokenizer, trainer.mp, max_packed_segments=64)
            yield _lm_class()(worker)


@contextlib.contextmanager
def _single_process_bootstrap() -> Iterator[None]:
    """lm-eval bootstraps stderrs in a process pool unless `DISABLE_MULTIPROC` is set: not inside a worker."""
    before = os.environ.get("DISABLE_MULTIPROC")
    os.environ["DISABLE_MULTIPROC"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DISABLE_MULTIPROC", None)
        else:
            os.environ["DISABLE_MULTIPROC"] = before


def evaluate_harness(output_path: str, checkpoint: str, model: ModelSpec, tokenizer_path: str,
                     tasks: Sequence[HarnessTask], num_fewshot: int = 0, limit: int | None = None,
                     vocab_size: int | None = None, batch_size: int = 8, platform: str | None = None) -> HarnessResult:
    """lm-evaluation-harness tasks (multiple choice, loglikelihood) on a Levanter checkpoint or Hugging Face folder.

    Runs as `lm_eval.simple_evaluate` with `num_fewshot` examples per prompt (seeded sampling) on the first
    `limit` documents of each task (None: all); checks each task ran `num_fewshot`-shot; writes lm-eval's results
    JSON, each task's samples and the task files used under `output_path`."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable

    where = f"harness evaluation of {checkpoint}"
    for task in tasks:
        task.verify()
    names = [t.name for t in tasks]
    with tempfile.TemporaryDirectory(prefix="marin-harness-data-") as cache:
        configs = [t.config(cache_dir=cache) for t in tasks]
        started = time.monotonic()
        with harness_model(checkpoint, model, tokenizer_path, vocab_size, batch_size, platform) as lm:
            loaded = time.monotonic()
            with _single_process_bootstrap():
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
            with open(task.folder / relative, "rb") as src, \
                    open_file(join_path(output_path, "tasks", task.name, relative.replace("../", "_up/")), "wb") as dst:
                shutil.copyfileobj(src, dst)
    return HarnessResult(checkpoint, _step_of(checkpoint), num_fewshot, limit, scores,
                         round(finished - loaded, 2), round(loaded - started, 2))


def every_task_scored(names: Sequence[str]) -> Check:
    """The check that every task scored at least one document, with a finite accuracy (or perplexity)."""
    def check(output_path: str, result: dict) -> CheckOutcome:
        scored = {n: (result.get("tasks") or {}).get(n) or {} for n in names}
        metric = {n: "acc" if s.get("acc") is not None else "perplexity" for n, s in scored.items()}
        values = {n: scored[n].get(metric[n]) for n in names}
        missing = [n for n, v in values.items()
                   if not isinstance(v, (int, float)) or not math.isfinite(v) or not scored[n].get("samples")]
        if missing:
            return CheckOutcome(False, f"no documents scored, or no finite accuracy or perplexity, for"
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


def harness_eval_step(name: str, train: Step, tasks: Sequence[HarnessTask | str], num_fewshot: int = 0,
                      checkpoint_step: int | None = None, limit: int | None = None, export: Step | None = None,
                      batch_size: int = 8, gpu: float = 0, gpu_type: str | None = None) -> Step:
    """lm-eval tasks (`HarnessTask`s or YAML paths) on a checkpoint (default: the last) of a training step (its
    result is a `TrainResult`, which says the model and tokenizer) — or on `export`, a Hugging Face export of it
    (`export_step`). Each task's files are read here: their content is the step's identity."""
    read = _as_tasks(f"step {name!r}", tasks, num_fewshot, limit)
    resources = Resources(cpu=1, gpu=gpu, gpu_type=gpu_type)

    def run(out: str) -> HarnessResult:
        result = load_result(train, TrainResult)
        model, tokenizer = result.model_and_tokenizer()
        checkpoint = load_result(export, ExportResult).path if export else result.checkpoint_path(checkpoint_step)
        return evaluate_harness(out, checkpoint, model, tokenizer, read, num_fewshot, limit,
                                vocab_size=result.vocab_size, batch_size=batch_size, platform=platform_for(resources))

    hash_attrs: dict[str, Any] = {"tasks": [t.identity() for t in read], "num_fewshot": num_fewshot, "limit": limit,
                                  "checkpoint_step": checkpoint_step}
    return Step(name=name, fn=run, deps=[train] + ([export] if export else []), hash_attrs=hash_attrs,
                resources=resources, kind="eval", description=made_by(evaluate_harness),
                kinds=["levanter", "jax", "lm-eval"], checks=[every_task_scored([t.name for t in read])])


@dataclass(frozen=True)
class HarnessCheckpointEvals:
    """lm-eval tasks on each checkpoint of `train` as it lands: one step per checkpoint, served as one
    partitioned asset with `CheckpointEvals` (`marin_assets.dagster.checkpoint_evals`)."""

    name: str
    """Asset name (`evals/tiny-llama-harness`); checkpoint N's output is `{name}/step-N_{hash}`."""
    train: TrainStep
    """The training step whose checkpoints are evaluated."""
    tasks: Sequence[HarnessTask]
    num_fewshot: int = 0
    limit: int | None = None
    """Documents per task; None for all."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(_as_tasks(f"checkpoint evaluations {self.name!r}", self.tasks,
                                                          self.num_fewshot, self.limit)))

    def _attrs(self) -> dict[str, Any]:
        return {"checkpoint_of": self.train.name_with_hash, "tasks": [t.identity() for t in self.tasks],
                "num_fewshot": self.num_fewshot, "limit": self.limit}

    @property
    def hash(self) -> str:
        """Identity of the evaluation setup (each checkpoint adds its step)."""
        return identity_hash(self.name, self._attrs(), [])

    @property
    def deps(self) -> list[Step]:
        """Upstream assets besides the training step: none (the tasks are files)."""
        return []

    @property
    def description(self) -> str:
        """What the partitioned asset shows."""
        return (f"lm-eval tasks {', '.join(t.name for t in self.tasks)} ({self.num_fewshot}-shot) on every checkpoint"
                f" of `{self.train.name}`, one partition per checkpoint step, added by the checkpoint sensor as each"
                " lands. Made by `marin_assets.pipeline.harness.evaluate_harness`.")

    def step(self, checkpoint: int) -> Step:
        """The evaluation of checkpoint step `checkpoint` (not a dependency of training, which is still running:
        the training step's identity is in its hash_attrs; model and tokenizer come from the typed `TrainStep`)."""
        train, tasks, num_fewshot, limit = self.train, self.tasks, self.num_fewshot, self.limit

        def run(out: str) -> HarnessResult:
            return evaluate_harness(out, train.checkpoint_path(checkpoint), train.model, train.tokenizer_path(),
                                    tasks, num_fewshot, limit, vocab_size=train.vocab_size())

        return Step(name=f"{self.name}/step-{checkpoint}", fn=run,
                    hash_attrs={**self._attrs(), "checkpoint_step": checkpoint}, resources=Resources(cpu=1),
                    kind="eval", description=made_by(evaluate_harness), kinds=["levanter", "jax", "lm-eval"],
                    checks=[every_task_scored([t.name for t in tasks])])

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """A partition's numbers (Dagster plots them across partitions): each task's acc and acc_norm."""
        return {k: v for k, v in self.row(result).items() if v is not None and not k.endswith("_stderr")}

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """A checkpoint's row of the all-checkpoints table: each task's acc, acc_norm and their stderr."""
        scored = result.get("tasks") or {}
        return {f"{t.name}/{m}": (scored.get(t.name) or {}).get(m) for t in self.tasks for m in self._metrics(t)}

    def columns(self) -> list[str]:
        """The all-checkpoints table's columns after `step`."""
        return [f"{t.name}/{m}" for t in self.tasks for m in self._metrics(t)]

    @staticmethod
    def _metrics(task: HarnessTask) -> tuple[str, ...]:
        if task.output_type == "multiple_choice":
            return ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")
        return ("acc", "acc_stderr", "perplexity")
