"""The perplexity gap: where two models differ, byte by byte, on raw text — whatever their tokenizers.

Each model tokenizes each document itself (its BOS — else its EOS, the token training put before a document — then
the text's ids, then EOS) and scores it (`token_scores.py`: a document longer than the model in sliding windows,
every token predicted from at least `min_context` tokens, default half the model's length). Every predicted token's
loss is spread evenly over the bytes of text it covers (a token inside a character shares the character's bytes with
the others of it), so both models' losses land on the same bytes and compare whatever the tokenization: per
document, per set and per kind of text. The attribution is exact: a set's per-byte losses sum to the model's loss on
the tokens that cover text; the loss of tokens that cover none (the end of document, special tokens) is reported
beside it and, as in Levanter's `perplexity_gap`, not in bits per byte. Bytes a tokenizer drops (a normalizer
collapsing whitespace) carry no loss for that model and are counted (`uncovered_bytes`).

The kinds of text, the worst documents and segments, the literals and the report are Levanter's
(`levanter.analysis.perplexity_gap`: `GapReportBuilder`, its segment buckets — words, numbers, punctuation, URLs,
whitespace by sort — and its markdown report), so our report reads as Marin's does. A kind of evaluation
(`kind.py`): model A is the evaluated checkpoint (or export) and model B a fixed reference, so
`perplexity_gap_checkpoint_evals` follows the gap over a run's checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import open_file
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.data.text_files import expand_files, find_splits, iter_documents
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.evals.models import ModelRef, model_ref
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep, eval_step
from marin_assets.pipeline.evals.token_scores import (
    LEVANTER_CONTEXT,
    ModelTokenizerError,
    TokenScorer,
    checked_context,
    checkpoint_tokenizer,
    context_identity,
    document_start_id,
    stated_context,
    token_scorer,
)
from marin_assets.pipeline.tokens.array_store import s3_arrays
from marin_assets.pipeline.tokens.validation_suite import ValidationSuite
from marin_assets.pipeline.training.training_run import TrainStep

LOG2E = float(np.log2(np.e))
REPORT_FILE = "report.md"
SUMMARY_FILE = "summary.json"
WORST_DOCUMENTS_FILE = "worst_documents.jsonl"
TOP_ROWS = 10
PREVIEW_ROWS = 5
DOCUMENTS_PER_BATCH = 32


class PerplexityGapError(ValueError):
    """A set cannot be compared (no documents, no validation split)."""


@dataclass(frozen=True)
class TextFiles:
    """Raw documents of one set: files and how to read them (the library function's form of a set)."""

    files: tuple[str, ...]
    text_field: str = "text"
    text_format: str = "auto"
    root: str = ""
    """The folder the files are named relative to in reports."""


@dataclass(frozen=True)
class TextSet:
    """Raw documents of a dataset step as text (the step's form of a set): its validation split, or the files of
    `globs`; read as the tokenize step reads them."""

    dataset: Step
    globs: tuple[str, ...] = ()
    """File globs relative to the dataset's folder; empty: its `validation` split as its layout holds it."""
    text_field: str = "text"
    text_format: str = "auto"

    def identity(self) -> dict[str, Any]:
        """How the set's documents are chosen and read (the dataset itself is a dependency)."""
        return {"dataset": self.dataset.name, "globs": list(self.globs), "text_field": self.text_field,
                "text_format": self.text_format}

    def text_files(self) -> TextFiles:
        """Its files (run time)."""
        root = self.dataset.output_path
        globs = list(self.globs)
        if not globs:
            splits = find_splits(root)
            if "validation" not in splits:
                raise PerplexityGapError(f"{self.dataset.name!r} has no validation split (it has {sorted(splits)});"
                                         " give the set's files as TextSet(dataset, globs=[…])")
            globs = splits["validation"]
        return TextFiles(tuple(expand_files(root, globs)), self.text_field, self.text_format, root)


def suite_text_sets(suite: ValidationSuite) -> dict[str, TextSet]:
    """A validation suite's sets as text, named as its tokenized components are (`{suite}-{set}`)."""
    return {f"{suite.name}-{key}": TextSet(suite.download, tuple(globs), suite.text_field)
            for key, globs in sorted(suite.sets.items())}


@dataclass(frozen=True)
class Document:
    """One document to compare: where it is and its text (cut to `max_doc_bytes`)."""

    set: str
    file: str
    row: int
    text: str


@dataclass(frozen=True)
class ByteScores:
    """One model's loss on one document, spread over its bytes."""

    per_byte: np.ndarray
    """float64 nats per byte of the document's UTF-8 text."""
    no_byte_loss: float
    """Loss (nats) of predicted tokens covering no text: the end of document, special tokens."""
    tokens: int
    """Tokens predicted (the first, BOS or EOS, is not)."""
    uncovered_bytes: int
    """Bytes no token covers (dropped by the tokenizer's normalizer)."""
    ids: np.ndarray
    byte_starts: np.ndarray
    """Per id, the first byte it covers (-1: none)."""
    byte_ends: np.ndarray


@dataclass
class _Totals:
    documents: int = 0
    bytes: int = 0
    loss: dict[str, float] = field(default_factory=lambda: {"a": 0.0, "b": 0.0})
    no_byte_loss: dict[str, float] = field(default_factory=lambda: {"a": 0.0, "b": 0.0})
    tokens: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})
    uncovered: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})

    def add(self, side: str, scores: ByteScores) -> None:
        self.loss[side] += float(scores.per_byte.sum())
        self.no_byte_loss[side] += scores.no_byte_loss
        self.tokens[side] += scores.tokens
        self.uncovered[side] += scores.uncovered_bytes

    def row(self) -> dict[str, Any]:
        bpb = {s: self.loss[s] * LOG2E / self.bytes for s in "ab"}
        return {"documents": self.documents, "bytes": self.bytes, "model_a_bpb": bpb["a"], "model_b_bpb": bpb["b"],
                "gap_bpb": bpb["a"] - bpb["b"], "delta_bits": (self.loss["a"] - self.loss["b"]) * LOG2E,
                "model_a_bits": self.loss["a"] * LOG2E, "model_b_bits": self.loss["b"] * LOG2E,
                "model_a_no_byte_bits": self.no_byte_loss["a"] * LOG2E,
                "model_b_no_byte_bits": self.no_byte_loss["b"] * LOG2E,
                "model_a_tokens": self.tokens["a"], "model_b_tokens": self.tokens["b"],
                "model_a_uncovered_bytes": self.uncovered["a"], "model_b_uncovered_bytes": self.uncovered["b"]}


@record_type("perplexity_gap_result")
@dataclass(frozen=True)
class PerplexityGapResult:
    """Bits per byte of two models on the same text, where they differ (by set, kind of text, document, literal)
    and where Levanter's report is."""

    model_a: str
    """Model A's checkpoint or Hugging Face folder (the evaluated one)."""
    model_b: str
    """Model B's (the reference)."""
    model_a_bpb: float
    """Model A's bits per byte over every set: its loss on the tokens covering text, in bits, per byte of text."""
    model_b_bpb: float
    gap_bpb: float
    """`model_a_bpb - model_b_bpb`: positive where model A is worse."""
    documents: int
    bytes: int
    sets: dict[str, dict[str, Any]]
    """Set → documents, bytes, each model's bpb, the gap, delta bits; each model's bits, bits on tokens covering no
    text (`*_no_byte_bits`, outside bpb), tokens, and bytes its tokenizer drops (`*_uncovered_bytes`)."""
    kinds: dict[str, dict[str, Any]]
    """Kind of text (Levanter's buckets: `text/word`, `text/number`, `text/punctuation`, `whitespace/newline`, …) →
    segments, bytes, each model's bpb, the gap and delta bits, largest |delta| first."""
    documents_a_worse: list[dict[str, Any]]
    """The documents where model A loses most bits to B: set, file, row, bytes, bpbs, gap, the worst segment, a
    snippet around it."""
    documents_b_worse: list[dict[str, Any]]
    literals_a_worse: list[dict[str, Any]]
    """Short segments (a word, a number, a run of spaces) where model A loses most bits in all, with how each
    tokenizer split them (`|` between tokens)."""
    literals_b_worse: list[dict[str, Any]]
    report_path: str
    """Levanter's markdown report (sets, kinds, top documents, segments and literals both ways); `summary.json`
    and `worst_documents.jsonl` beside it."""
    preview_markdown: str
    """The sets and the largest gaps as a short markdown table, for the UI."""
    seconds: float
    """Scoring time of both models."""
    model_a_min_context: int = LEVANTER_CONTEXT
    """Tokens model A predicted every token from at least (all of its document before it, near the start); 1:
    Levanter's windows overlapping by one token (every record written before the setting existed)."""
    model_b_min_context: int = LEVANTER_CONTEXT
    """Model B's (half of each model's own length by default: the two can differ)."""


def encode_with_bytes(tokenizer: Any, text: str, byte_offsets: np.ndarray,
                      who: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A document framed as training frames it — BOS (else EOS), the text's ids, EOS — with the bytes each id
    covers (from the tokenizer's character offsets; -1 where it covers none)."""
    prefix = document_start_id(tokenizer)
    if prefix is None or tokenizer.eos_token_id is None:
        raise ModelTokenizerError(f"{who}: its tokenizer has no EOS token to end documents with")
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    starts, ends = byte_offsets[spans[:, 0]], byte_offsets[spans[:, 1]]
    empty = ends <= starts
    starts, ends = np.where(empty, -1, starts), np.where(empty, -1, ends)
    ids = np.asarray([prefix, *encoded["input_ids"], tokenizer.eos_token_id], dtype=np.int32)
    return ids, np.concatenate([[-1], starts, [-1]]).astype(np.int32), np.concatenate([[-1], ends, [-1]]).astype(
        np.int32)


def spread_over_bytes(num_bytes: int, starts: np.ndarray, ends: np.ndarray,
                      losses: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Each token's loss spread evenly over the bytes `[start, end)` it covers: per-byte losses (float64), the loss
    of tokens covering no byte, and how many bytes no token covers."""
    covering = (starts >= 0) & (ends > starts)
    losses = losses.astype(np.float64)
    weights = losses[covering] / (ends[covering] - starts[covering])
    density, coverage = np.zeros(num_bytes + 1), np.zeros(num_bytes + 1, np.int64)
    np.add.at(density, starts[covering], weights)
    np.add.at(density, ends[covering], -weights)
    np.add.at(coverage, starts[covering], 1)
    np.add.at(coverage, ends[covering], -1)
    uncovered = int((np.cumsum(coverage[:-1]) == 0).sum())
    return np.cumsum(density[:-1]), float(losses[~covering].sum()), uncovered


def score_bytes(scorer: TokenScorer, texts: Sequence[str], who: str, min_context: int) -> list[ByteScores]:
    """One model's loss on each text, spread over the text's bytes, every token predicted from at least
    `min_context` tokens."""
    from levanter.analysis.perplexity_gap import char_to_byte_offsets

    encoded: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    for text in texts:
        offsets = char_to_byte_offsets(text)
        ids, starts, ends = encode_with_bytes(scorer.tokenizer, text, offsets, who)
        encoded.append((int(offsets[-1]), ids, starts, ends))
    scored = scorer.score([ids for _, ids, _, _ in encoded], min_context)
    out = []
    for (num_bytes, ids, starts, ends), scores in zip(encoded, scored, strict=True):
        if not np.isfinite(scores.log_probs).all():
            raise ValueError(f"{who}: non-finite log-probs (a broken checkpoint, or another tokenizer than its own)")
        per_byte, no_byte, uncovered = spread_over_bytes(num_bytes, starts[1:], ends[1:], -scores.log_probs)
        out.append(ByteScores(per_byte, no_byte, len(ids) - 1, uncovered, ids, starts, ends))
    return out


def read_documents(name: str, text_files: TextFiles, max_docs: int, max_doc_bytes: int) -> list[Document]:
    """The set's first `max_docs` documents with text (blank ones are no documents), each cut to `max_doc_bytes`
    bytes at a character boundary; none is an error naming the set and its files."""
    documents: list[Document] = []
    root = text_files.root.rstrip("/")
    for file, row, text in iter_documents(list(text_files.files), text_files.text_field, text_files.text_format):
        if len(documents) >= max_docs:
            break
        if not text.strip():
            continue
        raw = text.encode("utf-8")
        if len(raw) > max_doc_bytes:
            text = raw[:max_doc_bytes].decode("utf-8", "ignore")
        relative = file[len(root) + 1:] if root and file.startswith(root + "/") else file
        documents.append(Document(name, relative, row, text))
    if not documents:
        shown = ", ".join(text_files.files[:5]) + (" …" if len(text_files.files) > 5 else "")
        raise PerplexityGapError(f"set {name!r} has no documents (files: {shown or 'none'})")
    return documents


def perplexity_gap(output_path: str, model_a: Checkpoint, model_b: Checkpoint, sets: Mapping[str, TextFiles],
                   max_docs: int = 256, max_doc_bytes: int = 32_768, batch_size: int = 8,
                   min_context: int | None = None) -> PerplexityGapResult:
    """Per-byte loss of two checkpoints (Levanter checkpoints or Hugging Face folders, each with its own tokenizer)
    on the first `max_docs` documents of each set (cut to `max_doc_bytes` bytes), compared byte by byte; every token
    predicted from at least `min_context` tokens (None: half each model's length; 1: Levanter's windows overlapping
    by one token).

    Writes Levanter's `report.md`, `summary.json` and `worst_documents.jsonl` under `output_path`."""
    from levanter.analysis.perplexity_gap import (
        GapReportBuilder,
        RawTextDocument,
        TokenizedDocument,
        render_report_markdown,
        worst_document_rows,
    )

    if not sets:
        raise PerplexityGapError("no sets to compare on")
    if max_docs <= 0 or max_doc_bytes <= 0:
        raise PerplexityGapError(f"max_docs and max_doc_bytes must be positive, got {max_docs} and {max_doc_bytes}")
    documents = {name: read_documents(name, files, max_docs, max_doc_bytes) for name, files in sets.items()}
    contexts = {}
    for who, checkpoint in (("model_a", model_a), ("model_b", model_b)):  # both before either model loads
        checkpoint_tokenizer(checkpoint, who)
        try:
            contexts[who] = stated_context(min_context, checkpoint.model.seq_len)
        except ValueError as e:
            raise PerplexityGapError(f"{who} ({checkpoint.path}): {e}") from None
    builder = GapReportBuilder(model_a_name=model_a.path, model_b_name=model_b.path, output_path=output_path)
    totals = {name: _Totals() for name in sets}
    with s3_arrays([model_a.path, model_b.path, output_path]), contextlib.ExitStack() as stack:
        scorer_a = stack.enter_context(token_scorer(model_a, "model_a", batch_size))
        scorer_b = stack.enter_context(token_scorer(model_b, "model_b", batch_size))
        started = time.monotonic()
        for name, docs in documents.items():
            for batch in _batches(docs, DOCUMENTS_PER_BATCH):
                texts = [d.text for d in batch]
                scored_a = score_bytes(scorer_a, texts, "model_a", contexts["model_a"])
                scored_b = score_bytes(scorer_b, texts, "model_b", contexts["model_b"])
                for doc, a, b in zip(batch, scored_a, scored_b, strict=True):
                    totals[name].documents += 1
                    totals[name].bytes += len(a.per_byte)
                    totals[name].add("a", a)
                    totals[name].add("b", b)
                    builder.add_document(
                        document=RawTextDocument(dataset_name=name, tags=(), shard_name=doc.file, row_index=doc.row,
                                                 text=doc.text),
                        per_byte_loss_a=a.per_byte, per_byte_loss_b=b.per_byte,
                        tokenized_a=TokenizedDocument(a.ids, a.byte_starts, a.byte_ends, len(a.per_byte)),
                        tokenized_b=TokenizedDocument(b.ids, b.byte_starts, b.byte_ends, len(b.per_byte)))
        seconds = round(time.monotonic() - started, 2)
        summary = builder.build_summary()
        report_path = join_path(output_path, REPORT_FILE)
        with open_file(join_path(output_path, SUMMARY_FILE), "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
        with open_file(report_path, "w") as f:
            f.write(render_report_markdown(summary))
        with open_file(join_path(output_path, WORST_DOCUMENTS_FILE), "w") as f:
            f.writelines(json.dumps(row, sort_keys=True) + "\n" for row in worst_document_rows(summary))

    overall = _Totals()
    for t in totals.values():
        overall.documents += t.documents
        overall.bytes += t.bytes
        for side in "ab":
            overall.loss[side] += t.loss[side]
    whole = overall.row()
    set_rows = {name: t.row() for name, t in totals.items()}
    return PerplexityGapResult(
        model_a.path, model_b.path, whole["model_a_bpb"], whole["model_b_bpb"], whole["gap_bpb"], overall.documents,
        overall.bytes, set_rows, _kinds(summary["pattern_buckets"]),
        [_document_row(r) for r in summary["top_documents"]["model_a_worse"][:TOP_ROWS]],
        [_document_row(r) for r in summary["top_documents"]["model_b_worse"][:TOP_ROWS]],
        [_literal_row(r) for r in summary["top_literals"]["model_a_worse"][:TOP_ROWS]],
        [_literal_row(r) for r in summary["top_literals"]["model_b_worse"][:TOP_ROWS]],
        report_path, _preview_markdown(set_rows, summary["top_documents"]), seconds, contexts["model_a"],
        contexts["model_b"])


def _batches(items: Sequence[Document], size: int) -> Iterator[Sequence[Document]]:
    for first in range(0, len(items), size):
        yield items[first:first + size]


def _kinds(buckets: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: {"segments": row["documents"], "bytes": row["bytes"], "model_a_bpb": row["model_a_bpb"],
                          "model_b_bpb": row["model_b_bpb"], "gap_bpb": row["gap_bpb"], "delta_bits": row["delta_bits"]}
            for row in buckets}


def _document_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"set": row["dataset"], "file": row["shard"], "row": row["row_index"], "bytes": row["bytes"],
            "model_a_bpb": row["model_a_bpb"], "model_b_bpb": row["model_b_bpb"], "gap_bpb": row["gap_bpb"],
            "delta_bits": row["delta_bits"], "worst_kind": row["worst_bucket"], "worst_text": row["worst_text"],
            "snippet": row["preview"]}


def _literal_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"text": row["name"], "kind": row["bucket"], "occurrences": row["documents"], "bytes": row["bytes"],
            "gap_bpb": row["gap_bpb"], "delta_bits": row["delta_bits"],
            "model_a_tokens": row["model_a_token_boundaries"], "model_b_tokens": row["model_b_token_boundaries"]}


def _preview_markdown(sets: Mapping[str, Mapping[str, Any]], documents: Mapping[str, Any]) -> str:
    def cell(text: Any) -> str:
        return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    lines = ["| set | documents | bytes | model A bpb | model B bpb | gap |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {cell(n)} | {r['documents']} | {r['bytes']} | {r['model_a_bpb']:.3f} | {r['model_b_bpb']:.3f} |"
              f" {r['gap_bpb']:+.3f} |" for n, r in sets.items()]
    for side, title in (("model_a_worse", "model A worse"), ("model_b_worse", "model B worse")):
        rows = documents[side][:PREVIEW_ROWS]
        if rows:
            lines += ["", f"**Largest gaps, {title}**", "", "| set | file:row | gap bpb | snippet |",
                      "| --- | --- | --- | --- |"]
            lines += [f"| {cell(r['dataset'])} | {cell(r['shard'])}:{r['row_index']} | {r['gap_bpb']:+.3f} |"
                      f" {cell(r['preview'])} |" for r in rows]
    return "\n".join(lines)


def every_set_compared(names: Sequence[str]) -> Check:
    """The check that every set got finite bits per byte from both models."""
    def check(output_path: str, result: dict) -> CheckOutcome:
        rows = result.get("sets") or {}
        bad = [n for n in names if not all(isinstance(v, (int, float)) and np.isfinite(v) for v in
                                           ((rows.get(n) or {}).get(k) for k in ("model_a_bpb", "model_b_bpb")))]
        if bad:
            return CheckOutcome(False, f"no finite bits per byte for {', '.join(bad)}")
        return CheckOutcome(True, ", ".join(f"{n}: gap {rows[n]['gap_bpb']:+.4g} bpb" for n in names),
                            {f"{n}_gap_bpb": rows[n]["gap_bpb"] for n in names})

    return Check("every_set_compared", check, f"Both models have finite bits per byte on {', '.join(names)}.")


@dataclass(frozen=True)
class PerplexityGapEval:
    """The perplexity-gap kind: the evaluated checkpoint is model A, `reference` model B, on raw text sets."""

    reference: ModelRef
    """Model B."""
    sets: Mapping[str, TextSet]
    max_docs: int = 256
    """Documents per set, its first."""
    max_doc_bytes: int = 32_768
    """Each document cut to this many bytes."""
    batch_size: int = 8
    min_context: int | None = None
    """Tokens every token is predicted from at least (None: half each model's length; 1: Levanter's windows)."""
    tags: ClassVar[tuple[str, ...]] = ("levanter", "jax")
    function: ClassVar[Callable[..., Any]] = staticmethod(perplexity_gap)
    spans_hosts: ClassVar[bool] = False
    """Scores on one host."""

    def identity(self) -> dict[str, Any]:
        return {"model_b": {"step": self.reference.step.name, **self.reference.identity()},
                "sets": {name: s.identity() for name, s in sorted(self.sets.items())},
                "max_docs": self.max_docs, "max_doc_bytes": self.max_doc_bytes, **context_identity(self.min_context)}

    @property
    def deps(self) -> list[Step]:
        steps = [self.reference.step, *(self.sets[name].dataset for name in sorted(self.sets))]
        return list({s.name_with_hash: s for s in steps}.values())

    def summary(self) -> str:
        return f"bits per byte against {self.reference.describe()} on {', '.join(sorted(self.sets))}"

    def evaluate(self, output_path: str, checkpoint: Checkpoint) -> PerplexityGapResult:
        return perplexity_gap(output_path, checkpoint, self.reference.checkpoint(checkpoint.platform),
                              {name: s.text_files() for name, s in sorted(self.sets.items())}, self.max_docs,
                              self.max_doc_bytes, self.batch_size, self.min_context)

    def checks(self) -> list[Check]:
        return [every_set_compared(sorted(self.sets))]

    def numbers(self, result: Mapping[str, Any]) -> dict[str, float]:
        """Both models' bits per byte and the gap."""
        return {k: float(result[k]) for k in ("model_a_bpb", "model_b_bpb", "gap_bpb")}

    def row(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """The gap overall and per set."""
        sets = result.get("sets") or {}
        gaps = {f"{n}/gap_bpb": (sets.get(n) or {}).get("gap_bpb") for n in sorted(self.sets)}
        return {**self.numbers(result), **gaps}

    def columns(self) -> list[str]:
        return ["model_a_bpb", "model_b_bpb", "gap_bpb"] + [f"{n}/gap_bpb" for n in sorted(self.sets)]

    def summary_columns(self, result: Mapping[str, Any]) -> dict[str, float | None]:
        """The evaluated model's text bits per byte and its gap to the reference."""
        return {"text_bpb": result["model_a_bpb"], "gap_bpb": result["gap_bpb"]}


def text_sets(where: str, sets: Mapping[str, Step | TextSet]) -> dict[str, TextSet]:
    """Sets given as dataset steps (their validation split) or `TextSet`s, checked; else a `StepDefinitionError`."""
    if not isinstance(sets, Mapping) or not sets:
        raise StepDefinitionError(f"{where}: no sets to compare on (give {{name: dataset step or TextSet}})")
    checked = {}
    for name, value in sets.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise StepDefinitionError(f"{where}: set name {name!r} must be a non-empty name without '/'")
        if isinstance(value, Step):
            value = TextSet(value)
        if not isinstance(value, TextSet):
            raise StepDefinitionError(f"{where}: set {name!r} is {value!r}, not a dataset step or a TextSet")
        checked[name] = value
    return checked


def _kind(where: str, reference: ModelRef, sets: Mapping[str, Step | TextSet], max_docs: int, max_doc_bytes: int,
          batch_size: int, min_context: int | None) -> PerplexityGapEval:
    for label, value in (("max_docs", max_docs), ("max_doc_bytes", max_doc_bytes), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise StepDefinitionError(f"{where}: {label} must be a positive number, got {value!r}")
    checked_context(where, min_context)
    return PerplexityGapEval(reference, text_sets(where, sets), max_docs, max_doc_bytes, batch_size, min_context)


def perplexity_gap_step(name: str, model_a: Step, model_b: Step, sets: Mapping[str, Step | TextSet],
                        max_docs: int = 256, max_doc_bytes: int = 32_768, checkpoint_step: int | None = None,
                        batch_size: int = 8, gpu: float = 0, gpu_type: str | None = None,
                        min_context: int | None = None) -> EvalStep:
    """Where `model_a` and `model_b` — each a training step (its last checkpoint; `checkpoint_step` picks model A's),
    an export step or a model from the Hub, each with its own tokenizer — differ byte by byte on raw text: `sets` maps
    names to dataset steps (their validation split) or `TextSet`s (`suite_text_sets(suite)` for a validation suite).
    A document longer than a model is scored in sliding windows in which every token sees at least `min_context`
    tokens (None: half the model's length; 1: Levanter's windows overlapping by one token).

    Identity: `model_b` and how it is read, `sets` (each one's dataset and how it is read), `max_docs`,
    `max_doc_bytes`, `min_context` unless 1, `checkpoint_step` (and `model_a`); not `batch_size`, `gpu` nor
    `gpu_type`.
    """
    where = f"step {name!r}"
    a, b = model_ref(where, model_a, checkpoint_step), model_ref(where, model_b)
    kind = _kind(where, b, sets, max_docs, max_doc_bytes, batch_size, min_context)
    return eval_step(name, kind, a.train, a.checkpoint_step, export=a.export, gpu=gpu, gpu_type=gpu_type)


def perplexity_gap_checkpoint_evals(name: str, train: TrainStep, reference: Step, sets: Mapping[str, Step | TextSet],
                                    max_docs: int = 256, max_doc_bytes: int = 32_768,
                                    min_context: int | None = None) -> CheckpointEvals:
    """The gap of every checkpoint of `train` to `reference` (a training or export step, a model from the Hub), as
    each lands.

    Identity: each checkpoint's step's: `reference`, `sets`, `max_docs`, `max_doc_bytes`, `min_context` unless 1,
    the checkpoint (and `train`).
    """
    where = f"checkpoint evaluations {name!r}"
    return CheckpointEvals(name, train, _kind(where, model_ref(where, reference), sets, max_docs, max_doc_bytes, 8,
                                              min_context))
