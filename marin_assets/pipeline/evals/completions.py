"""A model's completions of prompts, written as parquet: `generate_step` (the last or any checkpoint of a training
run, an export, a Hub model or a conversion) and `generate_checkpoints` (every checkpoint as it lands).

Generation is an evaluation kind (`kind.EvalKind`): it reads any model an evaluation reads, per checkpoint too, and
is content-addressed like one — the prompts (their text, or the dataset step's hash and what is read of it), the
`Sampling` (seed included: seeded generation is deterministic) and whether log-probs are kept are identity; how
many sequences the engine holds at once is not. The engine is the project's one (`training.generation`).

Prompts are texts given here, or a dataset step's documents (`text_field`) or conversations (OpenAI or ShareGPT
messages, as chat data is everywhere here). A text prompt follows the token training put before every document
(BOS, else EOS), as the evaluations frame a context; a conversation is rendered with the model's chat template (the
tokenizer's own, else `DEFAULT_CHAT_TEMPLATE`) and the assistant's header. A conversation's last assistant turn is
its reference answer: written beside the completion, never shown to the model.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import open_file
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep, eval_step
from marin_assets.pipeline.evals.token_scores import document_start_id
from marin_assets.pipeline.training.export import checkpoint_step_of
from marin_assets.pipeline.training.generation import Sampling
from marin_assets.pipeline.training.training_run import TrainStep

COMPLETIONS_FILE = "completions.parquet"
"""One row per completion: prompt index, sample, prompt, completion, token counts, finish reason (and log-probs)."""


class GenerationInputError(ValueError):
    """A prompt cannot be generated from: empty, too long for the model, or a conversation that ends with no user
    turn. Names the step and (for a dataset) the file and line or row."""


@dataclass(frozen=True)
class Prompt:
    """One prompt as read: a text or a conversation, where it came from, and its reference answer if it had one."""

    text: str | None
    messages: tuple[Mapping[str, str], ...] | None
    where: str
    """`prompt 3`, or `{file}, line 12`."""
    reference: str | None = None


@dataclass(frozen=True)
class Prompts:
    """Where a generation's prompts come from: `texts`, or a dataset step's `split`."""

    texts: tuple[str, ...] = ()
    """Prompts given inline (their text is identity)."""
    dataset: Step | None = None
    """A dataset step whose documents (or conversations, with `chat`) are the prompts."""
    split: str = "validation"
    """The dataset's split read (its layout's `{split}/` files, as tokenize finds them)."""
    text_field: str = "text"
    chat: bool = False
    """Read conversations (`messages` or `conversations`) instead of documents."""
    limit: int | None = None
    """The first `limit` prompts (None: all)."""

    def identity(self) -> dict[str, Any]:
        if self.dataset is None:
            return {"texts": list(self.texts)}
        return {"dataset": self.dataset.name_with_hash, "split": self.split, "text_field": self.text_field,
                "chat": self.chat, "limit": self.limit}

    def describe(self) -> str:
        if self.dataset is None:
            return f"{len(self.texts)} prompts"
        what = "conversations" if self.chat else f"documents ({self.text_field!r})"
        first = f"the first {self.limit} " if self.limit else ""
        return f"{first}{what} of {self.dataset.name}'s {self.split} split"

    def read(self) -> list[Prompt]:
        """The prompts, in order (a dataset's read from its output under the current prefix)."""
        if self.dataset is None:
            return [Prompt(t, None, f"prompt {i}") for i, t in enumerate(self.texts)]
        return list(itertools.islice(self._conversations() if self.chat else self._documents(), self.limit))

    def _files(self) -> list[str]:
        from marin_assets.pipeline.data.readers import DatasetError
        from marin_assets.pipeline.data.text_files import expand_files, find_splits

        assert self.dataset is not None
        root = self.dataset.output_path
        splits = find_splits(root)
        if self.split not in splits:
            raise DatasetError(f"{self.dataset.name} ({root}) has no {self.split!r} split (it has"
                               f" {', '.join(sorted(splits)) or 'none'})")
        return expand_files(root, splits[self.split])

    def _documents(self) -> Iterator[Prompt]:
        from marin_assets.pipeline.data.readers import iter_documents

        for file, number, text in iter_documents(self._files(), self.text_field):
            yield Prompt(text, None, f"{file}, line or row {number}")

    def _conversations(self) -> Iterator[Prompt]:
        from marin_assets.pipeline.data.readers import DatasetError, format_of, iter_records
        from marin_assets.pipeline.tokens.chat import FORMS, conversation_turns

        for file in self._files():
            unit = "row" if format_of(file) == "parquet" else "line"
            for numbers, records in iter_records(file, tuple(FORMS)):
                for number, record in zip(numbers, records, strict=True):
                    where = f"{file}, {unit} {number}"
                    messages = conversation_turns(record, where)
                    reference = None
                    if messages and messages[-1]["role"] == "assistant":
                        reference = messages.pop()["content"]
                    if not messages or messages[-1]["role"] != "user":
                        raise DatasetError(f"{where}: the conversation does not end with a user turn (after its"
                                           " reference answer, the last assistant turn): nothing to answer")
                    yield Prompt(None, tuple(messages), where, reference)


@record_type("generation_result")
@dataclass(frozen=True)
class GenerationResult:
    """What a generation wrote: `completions.parquet` under the output, and its counts."""

    checkpoint: str
    step: int | None
    prompts: int
    completions: int
    prompt_tokens: int
    completion_tokens: int
    """Tokens written, stops excluded: the rows' `completion_tokens`, summed."""
    finish_reasons: dict[str, int]
    """`stop` / `length` → completions that ended so."""
    seconds: float
    """Generating (the model loaded; compiling included)."""
    load_seconds: float
    tokens_per_second: float
    """`completion_tokens` ÷ `seconds`."""
    sampling: dict[str, Any]
    file: str = COMPLETIONS_FILE


def generate_completions(output_path: str, checkpoint: Checkpoint, prompts: Prompts, sampling: Sampling,
                         logprobs: bool = False, max_seqs: int = 32, who: str = "the model") -> GenerationResult:
    """`sampling.n` completions of each prompt by `checkpoint`, written as `completions.parquet` under
    `output_path` (columns `prompt_index`, `sample`, `prompt`, `completion`, `reference`, `prompt_tokens`,
    `completion_tokens`, `finish_reason`, `token_ids`, and `logprobs` when asked)."""
    from marin_assets.pipeline.evals.token_scores import token_scorer
    from marin_assets.pipeline.training.generation import (
        EngineSettings,
        GenerationError,
        Generator,
        cut_at_stop_texts,
    )

    read = prompts.read()
    if not read:
        raise GenerationInputError(f"{who}: no prompts ({prompts.describe()} is empty)")
    started = time.monotonic()
    with token_scorer(checkpoint, who) as scorer:
        tokenizer, seq_len = scorer.tokenizer, checkpoint.model.seq_len
        ids = [_prompt_ids(tokenizer, p, who) for p in read]
        for prompt, tokens in zip(read, ids, strict=True):
            if len(tokens) + sampling.max_tokens > seq_len:
                raise GenerationInputError(f"{who}: {prompt.where} has {len(tokens)} tokens; with max_tokens="
                                           f"{sampling.max_tokens} it passes the model's {seq_len} positions")
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        generator = Generator(scorer.model, settings=EngineSettings.for_length(seq_len, max_seqs),
                              vocab_limit=len(tokenizer), eos_ids=eos, tokenizer=tokenizer, who=who)
        loaded = time.monotonic()
        try:
            written = generator.generate(ids, sampling)
        except GenerationError as e:
            raise GenerationInputError(f"{who}: {e}") from None
        finished = time.monotonic()
    rows: list[dict[str, Any]] = []
    for prompt, tokens, samples in zip(read, ids, written, strict=True):
        for completion in samples:
            completion, text = cut_at_stop_texts(tokenizer, completion, sampling.stop)
            row = {"prompt_index": completion.prompt, "sample": completion.sample,
                   "prompt": prompt.text if prompt.text is not None else tokenizer.decode(tokens),
                   "completion": text, "reference": prompt.reference, "prompt_tokens": len(tokens),
                   "completion_tokens": len(completion.tokens), "finish_reason": completion.finish_reason,
                   "token_ids": completion.tokens}
            if logprobs:
                row["logprobs"] = [float(x) for x in completion.logprobs]
            rows.append(row)
    _write_parquet(join_path(output_path, COMPLETIONS_FILE), rows)
    written_tokens = sum(r["completion_tokens"] for r in rows)
    reasons = {r: sum(1 for row in rows if row["finish_reason"] == r) for r in ("stop", "length")}
    seconds = finished - loaded
    return GenerationResult(checkpoint.path, checkpoint_step_of(checkpoint.path), len(read), len(rows),
                            sum(map(len, ids)), written_tokens, reasons, round(seconds, 3), round(loaded - started, 2),
                            round(written_tokens / seconds, 1) if seconds > 0 else 0.0, _sampling_identity(sampling))


def _prompt_ids(tokenizer: Any, prompt: Prompt, who: str) -> list[int]:
    from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE

    if prompt.messages is not None:
        template = getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE
        got = tokenizer.apply_chat_template([dict(m) for m in prompt.messages], chat_template=template,
                                            add_generation_prompt=True, tokenize=True)
        if hasattr(got, "keys"):
            got = got["input_ids"]
        return [int(t) for t in got]
    assert prompt.text is not None
    if not prompt.text.strip():
        raise GenerationInputError(f"{who}: {prompt.where} is empty")
    start = document_start_id(tokenizer)
    return ([start] if start is not None else []) + list(tokenizer(prompt.text, add_special_tokens=False)["input_ids"])


def _write_parquet(url: str, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_file(url, "wb") as f:
        pq.write_table(pa.Table.from_pylist(rows), f)


def _sampling_identity(sampling: Sampling) -> dict[str, Any]:
    """Every sampling field; with n > 1, also that each sample is its own sequence (before, Levanter's clones wrote
    samples 1 … n−1 from a cache without the prompt: those outputs are other, wrong ones)."""
    found = {**asdict(sampling), "stop": list(sampling.stop)}
    if sampling.n > 1:
        found["samples"] = "own-sequences"
    return found


def every_prompt_answered(output_path: str, result: dict) -> CheckOutcome:
    """The check that every prompt got its `n` completions."""
    n = (result.get("sampling") or {}).get("n", 1)
    prompts, completions = result.get("prompts", 0), result.get("completions", 0)
    if not prompts or completions != prompts * n:
        return CheckOutcome(False, f"{completions} completions of {prompts} prompts; {n} each were asked")
    return CheckOutcome(True, f"{completions} completions of {prompts} prompts",
                        {"completion_tokens": result.get("completion_tokens", 0)})


@dataclass(frozen=True)
class GenerateKind:
    """Generation as an evaluation kind: prompts and sampling (identity) answered by one checkpoint."""

    prompts: Prompts
    sampling: Sampling
    logprobs: bool = False
    max_seqs: int = field(default=32, compare=False)
    """Sequences the engine decodes together: speed, not identity."""
    tags: ClassVar[tuple[str, ...]] = ("levanter", "jax", "generate")
    function: ClassVar[Callable[..., Any]] = staticmethod(generate_completions)
    spans_hosts: ClassVar[bool] = False
    """The engine generates on one host."""

    def identity(self) -> dict[str, Any]:
        return {"generate": {"prompts": self.prompts.identity(), "sampling": _sampling_identity(self.sampling),
                             "logprobs": self.logprobs, "format": "completions-v1"}}

    @property
    def deps(self) -> list[Step]:
        return [self.prompts.dataset] if self.prompts.dataset is not None else []

    def summary(self) -> str:
        s = self.sampling
        how = "greedy" if s.greedy else f"temperature {s.temperature}, top-p {s.top_p}, seed {s.seed}"
        return f"{s.n} completion(s) ({how}, at most {s.max_tokens} tokens) of {self.prompts.describe()}"

    def evaluate(self, output_path: str, checkpoint: Checkpoint) -> GenerationResult:
        return generate_completions(output_path, checkpoint, self.prompts, self.sampling, self.logprobs,
                                    self.max_seqs, who=f"generation from {checkpoint.path}")

    def checks(self) -> list[Check]:
        return [Check("every_prompt_answered", every_prompt_answered, "Every prompt got its n completions.")]

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        return {k: v for k, v in self.row(result).items() if v is not None}

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        completions = result.get("completions") or 0
        stopped = (result.get("finish_reasons") or {}).get("stop", 0)
        return {"mean_completion_tokens": result.get("completion_tokens", 0) / completions if completions else None,
                "stopped": stopped / completions if completions else None,
                "tokens_per_second": result.get("tokens_per_second")}

    def columns(self) -> list[str]:
        return ["mean_completion_tokens", "stopped", "tokens_per_second"]

    def summary_columns(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        return {}


def prompts_from(dataset: Step, split: str = "validation", *, chat: bool = False, text_field: str = "text",
                 limit: int | None = None) -> Prompts:
    """A dataset step's documents (or conversations, with `chat`) of `split` as prompts."""
    if not isinstance(dataset, Step):
        raise StepDefinitionError(f"prompts come from a dataset step, not {dataset!r}")
    if limit is not None and limit < 1:
        raise StepDefinitionError(f"prompts from {dataset.name}: limit must be positive, got {limit}")
    return Prompts(dataset=dataset, split=split, text_field=text_field, chat=chat, limit=limit)


def _as_prompts(where: str, prompts: Prompts | Sequence[str]) -> Prompts:
    if isinstance(prompts, Prompts):
        return prompts
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise StepDefinitionError(f"{where}: prompts are a list of texts or prompts_from(dataset, …)")
    if not prompts:
        raise StepDefinitionError(f"{where}: no prompts")
    blank = [i for i, p in enumerate(prompts) if not p.strip()]
    if blank:
        raise StepDefinitionError(f"{where}: prompt {blank[0]} is empty")
    return Prompts(texts=tuple(prompts))


def generate_step(name: str, model: Step, prompts: Prompts | Sequence[str], sampling: Sampling | None = None, *,
                  checkpoint_step: int | None = None, export: Step | None = None, logprobs: bool = False,
                  max_seqs: int = 32, gpu: float = 0, gpu_type: str | None = None) -> EvalStep:
    """Completions of `prompts` (texts, or `prompts_from(dataset, …)`) by checkpoint `checkpoint_step` (default: the
    last) of a training step — or `export`, or a Hub model or conversion step as `model` — with `sampling` (default:
    greedy, 64 tokens), as `completions.parquet`; each token's log-probability too with `logprobs`.

    Identity: the prompts (texts, or the dataset and what is read of it), `sampling` (seed included), `logprobs`,
    `checkpoint_step` (and `model`, `export`); not `max_seqs`, `gpu` nor `gpu_type`.
    """
    kind = GenerateKind(_as_prompts(f"step {name!r}", prompts), sampling or Sampling(), logprobs, max_seqs)
    return eval_step(name, kind, model, checkpoint_step, export=export, gpu=gpu, gpu_type=gpu_type)


def generate_checkpoints(name: str, train: TrainStep, prompts: Prompts | Sequence[str],
                         sampling: Sampling | None = None, *, logprobs: bool = False) -> CheckpointEvals:
    """Completions of `prompts` by each checkpoint of `train` as it lands (one partition per checkpoint).

    Identity: each checkpoint's step's: the prompts, `sampling`, `logprobs`, the checkpoint (and `train`).
    """
    kind = GenerateKind(_as_prompts(f"checkpoint generations {name!r}", prompts), sampling or Sampling(), logprobs)
    return CheckpointEvals(name, train, kind)
