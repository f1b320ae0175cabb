"""Per-token log-probabilities: which tokens of a validation set a model gets wrong, and how unsure it was.

For the first `max_docs` documents of a tokenized validation cache (documents as cached: BOS, the text's ids,
EOS), every token after the first gets the log-probability the checkpoint gave it and the entropy of the
next-token distribution it was drawn from (`token_scores.py`), predicted from at least `min_context` tokens (default
half the model's length) when a document is longer than the model. Written as a parquet table (one row per scored
token), an HTML page of the documents coloured by log-prob — Levanter's own `visualize_log_probs` view (each
token a span coloured by its log-prob; its tooltip the value and the model's most likely token there) — and a
record holding the hardest documents (lowest mean log-prob per token) and the hardest tokens (lowest mean
log-prob, grouped by their text, with counts). A kind of evaluation (`kind.py`): of a run's last checkpoint, an
export or a model from the Hub (`log_probs_step`), or of every checkpoint as it lands (`log_probs_checkpoint_evals`).
"""

from __future__ import annotations

import html
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import open_file
from marin_assets.core.paths import join_path
from marin_assets.core.record import load_result
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.evals.models import model_ref
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep, eval_step
from marin_assets.pipeline.evals.token_scores import (
    LEVANTER_CONTEXT,
    checked_context,
    checkpoint_tokenizer,
    context_identity,
    stated_context,
    token_scorer,
)
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizeStep, tokenizer_fingerprint
from marin_assets.pipeline.training.export import checkpoint_step_of
from marin_assets.pipeline.training.specs import ModelSpec
from marin_assets.pipeline.training.training_run import TrainStep

TABLE_FILE = "log_probs.parquet"
HTML_FILE = "log_probs.html"
TOP_DOCUMENTS = 10
TOP_TOKENS = 20
PREVIEW_DOCUMENTS = 5
SNIPPET_CHARS = 120


class LogProbsError(ValueError):
    """The validation set cannot be scored by this model (no documents, another tokenizer, a chat cache)."""


@record_type("log_probs_result")
@dataclass(frozen=True)
class LogProbsResult:
    """Per-token log-probs of one checkpoint on a validation set: the totals, the hardest documents and tokens, and
    where the table and the coloured view are."""

    checkpoint: str
    """The Levanter checkpoint or Hugging Face folder scored."""
    step: int | None
    """Its training step (None for a folder not named `step-N`)."""
    documents: int
    """Documents scored: the first `max_docs` of the split, in cache order."""
    tokens: int
    """Tokens scored (every token of a document but its first, which nothing predicts)."""
    mean_log_prob: float
    """Mean natural-log probability per scored token."""
    loss: float
    """Mean next-token loss per scored token (nats): minus `mean_log_prob`."""
    mean_entropy: float
    """Mean entropy (nats) of the next-token distributions the scored tokens were drawn from."""
    hardest_documents: list[dict[str, Any]]
    """The documents with the lowest mean log-prob per token: document index, tokens, mean log-prob, loss, mean
    entropy, the worst token and its log-prob, the document's start."""
    hardest_tokens: list[dict[str, Any]]
    """Token texts with the lowest mean log-prob: the text, how often it was scored, its mean and lowest
    log-prob, and the loss it carries in all."""
    table_path: str
    """The parquet table: document, position, token_id, token, log_prob, entropy (one row per scored token)."""
    html_path: str
    """The documents coloured by log-prob (Levanter's `viz_logprobs` view), one span per token."""
    hardest_documents_markdown: str
    """The hardest documents as a short markdown table, for the UI."""
    seconds: float
    """Scoring time, the model loaded."""
    min_context: int = LEVANTER_CONTEXT
    """Tokens every scored token was predicted from at least (all of its document before it, near the start); 1:
    Levanter's windows overlapping by one token (every record written before the setting existed)."""


def token_texts(tokenizer: Any, ids: Sequence[int] | np.ndarray) -> list[str]:
    """The text each token adds to the document, decoded in order (`tokenizers`' `DecodeStream`): a token that
    ends inside a character adds "" and the character comes with the token completing it; special tokens show."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=False)
    return [stream.step(tokenizer.backend_tokenizer, int(i)) or "" for i in ids]


def _token_name(tokenizer: Any, token_id: int) -> str:
    """A token's text on its own (the model's top choice, which may lie outside the tokenizer's ids)."""
    try:
        return tokenizer.decode([int(token_id)]) or f"<id {token_id}>"
    except Exception:  # noqa: BLE001 - an id with no text is shown by number
        return f"<id {token_id}>"


def token_log_probs(output_path: str, checkpoint: str, model: ModelSpec, tokenizer_path: str, cache_split: str,
                    max_docs: int, vocab_size: int | None = None, platform: str | None = None,
                    batch_size: int = 8, min_context: int | None = None) -> LogProbsResult:
    """Log-prob and entropy of every token of the first `max_docs` documents of a Levanter cache split
    (`cache_split`: `{cache}/validation`), under a Levanter checkpoint or Hugging Face folder.

    Writes `log_probs.parquet` and `log_probs.html` under `output_path`. `vocab_size`: rows of the model's
    embedding (None: as a fresh training run sizes it); `platform`: the JAX platform (None: JAX's choice);
    `min_context`: tokens every token is predicted from at least in a document longer than the model (None: half
    the model's length; 1: Levanter's windows overlapping by one token)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_assets.pipeline.tokens import levanter_cache as lc

    if max_docs <= 0:
        raise LogProbsError(f"max_docs must be positive, got {max_docs}")
    try:
        context = stated_context(min_context, model.seq_len)
    except ValueError as e:
        raise LogProbsError(f"the model {checkpoint}: {e}") from None
    with s3_arrays([checkpoint, output_path, cache_split]):
        cache = lc.load_cache(cache_split, {"input_ids": np.zeros((0,), dtype=np.int32)})
        count = min(len(cache), max_docs)
        if count == 0:
            raise LogProbsError(f"the validation cache {cache_split} has no documents")
        documents = [np.asarray(row["input_ids"], dtype=np.int32) for row in cache.get_batch_sync(list(range(count)))]
        where = Checkpoint(checkpoint, model, tokenizer_path, vocab_size, platform)
        with token_scorer(where, f"the model {checkpoint}", batch_size) as scorer:
            started = time.monotonic()
            scores = scorer.score(documents, context)
            seconds = round(time.monotonic() - started, 2)
        tokenizer = scorer.tokenizer
        texts = [token_texts(tokenizer, ids) for ids in documents]

        columns: dict[str, list[Any]] = {k: [] for k in ("document", "position", "token_id", "token", "log_prob",
                                                         "entropy")}
        for d, (ids, pieces, scored) in enumerate(zip(documents, texts, scores, strict=True)):
            n = max(len(ids) - 1, 0)
            columns["document"].append(np.full(n, d, np.int32))
            columns["position"].append(np.arange(1, n + 1, dtype=np.int32))
            columns["token_id"].append(ids[1:])
            columns["token"].extend(pieces[1:])
            columns["log_prob"].append(scored.log_probs)
            columns["entropy"].append(scored.entropies)
        table = pa.table({k: (pa.array(v, pa.string()) if k == "token" else pa.array(np.concatenate(v)))
                          for k, v in columns.items()})
        table_path, html_path = join_path(output_path, TABLE_FILE), join_path(output_path, HTML_FILE)
        with open_file(table_path, "wb") as f:
            pq.write_table(table, f)
        _write_html(html_path, tokenizer, texts, scores, checkpoint, cache_split, context)

    log_probs = np.concatenate([s.log_probs for s in scores])
    entropies = np.concatenate([s.entropies for s in scores])
    if log_probs.size == 0:
        raise LogProbsError(f"the first {count} documents of {cache_split} have no token to score (one id each)")
    hardest = hardest_documents(texts, documents, scores, tokenizer)
    return LogProbsResult(
        checkpoint, checkpoint_step_of(checkpoint), count, int(log_probs.size), float(log_probs.mean()),
        float(-log_probs.mean()), float(entropies.mean()), hardest, hardest_tokens(texts, documents, scores, tokenizer),
        table_path, html_path, _preview_markdown(hardest), seconds, context)


def hardest_documents(texts: Sequence[Sequence[str]], documents: Sequence[np.ndarray], scores: Sequence[Any],
                      tokenizer: Any, top: int = TOP_DOCUMENTS) -> list[dict[str, Any]]:
    """The `top` documents with the lowest mean log-prob per scored token, each with its start (special tokens
    left out, whitespace made visible as Levanter's reports show it)."""
    from levanter.analysis.perplexity_gap import preview_text

    rows = []
    for d, (pieces, ids, scored) in enumerate(zip(texts, documents, scores, strict=True)):
        if scored.log_probs.size == 0:
            continue
        worst = int(np.argmin(scored.log_probs))
        mean = float(scored.log_probs.mean())
        rows.append({"document": d, "tokens": int(scored.log_probs.size), "mean_log_prob": mean, "loss": -mean,
                     "mean_entropy": float(scored.entropies.mean()), "worst_token": pieces[worst + 1],
                     "worst_log_prob": float(scored.log_probs[worst]),
                     "start": preview_text(tokenizer.decode(ids, skip_special_tokens=True), SNIPPET_CHARS)})
    return sorted(rows, key=lambda r: r["mean_log_prob"])[:top]


def hardest_tokens(texts: Sequence[Sequence[str]], documents: Sequence[np.ndarray], scores: Sequence[Any],
                   tokenizer: Any, top: int = TOP_TOKENS) -> list[dict[str, Any]]:
    """Scored tokens grouped by their text (a token inside a character by its vocabulary name), the `top` with the
    lowest mean log-prob: how often each was scored, its mean and lowest log-prob and its total loss."""
    groups: dict[str, list[float]] = defaultdict(list)
    for pieces, ids, scored in zip(texts, documents, scores, strict=True):
        for piece, token_id, lp in zip(pieces[1:], ids[1:], scored.log_probs.tolist(), strict=True):
            groups[piece or str(tokenizer.convert_ids_to_tokens(int(token_id)))].append(lp)
    rows = [{"token": text, "count": len(lps), "mean_log_prob": float(np.mean(lps)), "min_log_prob": float(min(lps)),
             "total_loss": float(-np.sum(lps))} for text, lps in groups.items()]
    return sorted(rows, key=lambda r: (r["mean_log_prob"], r["token"]))[:top]


def _write_html(path: str, tokenizer: Any, texts: Sequence[Sequence[str]], scores: Sequence[Any], checkpoint: str,
                cache_split: str, min_context: int) -> None:
    """Levanter's log-prob view of the documents (`levanter.analysis.visualize_log_probs`): each token a span
    coloured by its log-prob, its tooltip the value and the model's top token there; the unscored first token of
    each document shows with log-prob 0. A heading says what was scored."""
    from levanter.analysis import visualize_log_probs

    width = max(len(t) for t in texts)
    log_probs = np.zeros((len(texts), width), np.float32)
    names: dict[int, str] = {}
    tops = []
    for d, scored in enumerate(scores):
        log_probs[d, 1:1 + scored.log_probs.size] = scored.log_probs
        ids = scored.top_ids.tolist()
        tops.append([""] + [names.setdefault(i, _token_name(tokenizer, i)) for i in ids])
    with tempfile.TemporaryDirectory(prefix="marin-logprobs-") as scratch:
        local = os.path.join(scratch, HTML_FILE)
        visualize_log_probs([list(t) for t in texts], log_probs, local, argmaxes=tops)
        with open(local, encoding="utf-8") as f:
            page = f.read()
    heading = (f"<h3 style='font-family: sans-serif'>Log-probs of {html.escape(checkpoint)} on"
               f" {html.escape(cache_split)}: {len(texts)} documents</h3><p style='font-family: sans-serif'>Each token"
               " is coloured by the log-probability the model gave it (clear: likely; red: unlikely); hover for the"
               f" value and the model's most likely token there. Every token was predicted from at least"
               f" {min_context} tokens before it (or its whole document before it).</p>")
    with open_file(path, "w") as f:
        f.write(page.replace("<body>", "<body>" + heading, 1))


def _preview_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "'")

    lines = ["| document | tokens | mean log-prob | worst token (log-prob) | start |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['document']} | {r['tokens']} | {r['mean_log_prob']:.3f} | `{cell(r['worst_token'])}`"
              f" ({r['worst_log_prob']:.2f}) | {cell(r['start'])} |" for r in rows[:PREVIEW_DOCUMENTS]]
    return "\n".join(lines)


def every_token_scored(output_path: str, result: dict) -> CheckOutcome:
    """Tokens were scored, and every log-prob and entropy is finite (a NaN means a broken checkpoint)."""
    values = [result.get(k) for k in ("mean_log_prob", "mean_entropy")]
    if not result.get("tokens") or not all(isinstance(v, (int, float)) and np.isfinite(v) for v in values):
        return CheckOutcome(False, f"no finite log-probs: tokens {result.get('tokens')}, mean log-prob {values[0]},"
                                   f" mean entropy {values[1]}")
    return CheckOutcome(True, f"{result['tokens']} tokens of {result['documents']} documents: mean log-prob"
                              f" {values[0]:.4g}, mean entropy {values[1]:.4g}",
                        {"mean_log_prob": values[0], "mean_entropy": values[1]})


@dataclass(frozen=True)
class LogProbsEval:
    """The log-probs kind: per-token log-prob and entropy of a checkpoint on one validation cache's split."""

    validation: Step
    """A tokenized (text) cache made with the model's tokenizer."""
    max_docs: int = 32
    """Documents scored, the split's first."""
    split: str = "validation"
    batch_size: int = 8
    min_context: int | None = None
    """Tokens every token is predicted from at least (None: half the model's length; 1: Levanter's windows)."""
    tags: ClassVar[tuple[str, ...]] = ("levanter", "jax")
    function: ClassVar[Callable[..., Any]] = staticmethod(token_log_probs)
    spans_hosts: ClassVar[bool] = False
    """Scores on one host."""

    def identity(self) -> dict[str, Any]:
        return {"max_docs": self.max_docs, "split": self.split, **context_identity(self.min_context)}

    @property
    def deps(self) -> list[Step]:
        return [self.validation]

    def summary(self) -> str:
        return f"per-token log-probs and entropy on the first {self.max_docs} documents of {self.validation.name}"

    def evaluate(self, output_path: str, checkpoint: Checkpoint) -> LogProbsResult:
        cache = load_result(self.validation, TokenizedCache)
        name = self.validation.name
        if cache.chat_template is not None:
            raise LogProbsError(f"{name!r} is a chat cache; per-token log-probs read text caches (tokenize_step)")
        if self.split not in cache.splits:
            raise LogProbsError(f"{name!r} has no split {self.split!r} (it has {sorted(cache.splits)})")
        checkpoint_tokenizer(checkpoint, f"the model {checkpoint.path}")  # a missing tokenizer named as the model's
        if tokenizer_fingerprint(checkpoint.tokenizer_path) != cache.tokenizer_fingerprint:
            raise LogProbsError(f"{name!r} was tokenized with {cache.tokenizer}, not the model's tokenizer"
                                f" {checkpoint.tokenizer_path}: its ids would be read as other tokens")
        return token_log_probs(output_path, checkpoint.path, checkpoint.model, checkpoint.tokenizer_path,
                               join_path(cache.path, self.split), self.max_docs, checkpoint.vocab_size,
                               checkpoint.platform, self.batch_size, self.min_context)

    def checks(self) -> list[Check]:
        return [Check("every_token_scored", every_token_scored, "Tokens were scored, every log-prob finite.")]

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """Mean log-prob, loss and entropy per token."""
        return {k: float(result[k]) for k in ("mean_log_prob", "loss", "mean_entropy")}

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        return {**self.numbers(result), "tokens": float(result["tokens"])}

    def columns(self) -> list[str]:
        return ["mean_log_prob", "loss", "mean_entropy", "tokens"]

    def summary_columns(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """The mean log-prob and entropy per token of the documents scored."""
        return {"token_mean_log_prob": result["mean_log_prob"], "token_mean_entropy": result["mean_entropy"]}


def _kind(where: str, validation: Step, max_docs: int, split: str, batch_size: int,
          min_context: int | None) -> LogProbsEval:
    if not isinstance(validation, Step):
        raise StepDefinitionError(f"{where}: validation {validation!r} is not a step (a tokenize_step's cache)")
    if isinstance(validation, TokenizeStep) and validation.chat:
        raise StepDefinitionError(f"{where}: {validation.name!r} is a chat cache; give a text cache (tokenize_step)")
    if isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs <= 0:
        raise StepDefinitionError(f"{where}: max_docs must be a positive number of documents, got {max_docs!r}")
    if batch_size <= 0:
        raise StepDefinitionError(f"{where}: batch_size must be positive, got {batch_size}")
    checked_context(where, min_context)
    return LogProbsEval(validation, max_docs, split, batch_size, min_context)



def log_probs_step(name: str, model: Step, validation: Step, max_docs: int = 32, checkpoint_step: int | None = None,
                   split: str = "validation", batch_size: int = 8, gpu: float = 0,
                   gpu_type: str | None = None, min_context: int | None = None) -> EvalStep:
    """Per-token log-prob and entropy of `model` — a training step (its checkpoint `checkpoint_step`, default the
    last), an export step or a model from the Hub (`hf_model_step`, `hf_to_levanter_step`) — on the first `max_docs`
    documents of `validation` (a tokenized cache made with the model's tokenizer): a parquet table, the hardest
    documents and tokens, and a coloured HTML view. A document longer than the model is scored in sliding windows
    in which every token sees at least `min_context` tokens (None: half the model's length; 1: Levanter's windows
    overlapping by one token, where each window's first token sees one).

    Identity: `max_docs`, `split`, `min_context` unless 1, `checkpoint_step` (and `model`, `validation`); not
    `batch_size`, `gpu` nor `gpu_type`.
    """
    where = f"step {name!r}"
    kind = _kind(where, validation, max_docs, split, batch_size, min_context)
    ref = model_ref(where, model, checkpoint_step)
    return eval_step(name, kind, ref.train, ref.checkpoint_step, export=ref.export, gpu=gpu, gpu_type=gpu_type)


def log_probs_checkpoint_evals(name: str, train: TrainStep, validation: Step, max_docs: int = 32,
                               split: str = "validation", min_context: int | None = None) -> CheckpointEvals:
    """Per-token log-probs of every checkpoint of `train` on `validation`, as each lands (one partition each).

    Identity: each checkpoint's step's: `max_docs`, `split`, `min_context` unless 1, the checkpoint (and `train`,
    `validation`).
    """
    return CheckpointEvals(name, train, _kind(f"checkpoint evaluations {name!r}", validation, max_docs, split, 8,
                                              min_context))
