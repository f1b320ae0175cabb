"""The perplexity gap (`perplexity_gap_step`) between two tiny models with different tokenizers — a byte-level BPE
(a checkpoint) and a SentencePiece Unigram (an export) — on the demo's real text and on its documents with non-ASCII
characters: each model's bytes carry exactly its loss on the tokens covering text, its bits per byte equal a direct
computation (an independent forward pass of each exported model), the kinds of text partition the bytes, the worst
documents are the largest per-document gaps, Dagster shows the record, and bad input is refused naming the step."""

import json
from dataclasses import replace
from types import SimpleNamespace

import dagster as dg
import numpy as np
import pytest

from marin_assets import Step, StepDefinitionError, build_definitions, load_result, materialize_step
from marin_assets.pipeline.data.text_files import expand_files, iter_documents
from marin_assets.pipeline.evals.models import model_ref
from marin_assets.pipeline.evals.perplexity_gap import (
    PerplexityGapError,
    TextSet,
    perplexity_gap,
    perplexity_gap_checkpoint_evals,
    perplexity_gap_step,
    spread_over_bytes,
)
from marin_assets.pipeline.evals.token_scores import ModelTokenizerError
from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer
from tests.support.looking_inside import (
    DEFAULT_CONTEXT,
    MODEL,
    build,
    materialized,
    shared_prefix,
    sliding_log_probs,
)

LOG2E = float(np.log2(np.e))
MAX_DOCS = 8
MAX_DOC_BYTES = 700
"""Long enough that some documents need two windows of the BPE model's 128 tokens."""


def write_jsonl(path, texts):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def around_non_ascii(text: str) -> str:
    """The passage of a document around its first non-ASCII character (most are curly quotes and dashes)."""
    first = next(i for i, c in enumerate(text) if not c.isascii())
    return text[max(0, first - 200):first + 300]


@pytest.fixture(scope="module")
def gap(tmp_path_factory):
    """Both models (shared with the log-probs tests), a set of passages of the corpus around its non-ASCII
    characters, and the gap step materialized."""
    prefix = shared_prefix(tmp_path_factory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARIN_PREFIX", prefix)
        steps = build(prefix)
        materialized(prefix, steps["train_bpe"], steps["export_bpe"], steps["export_sp"])
        files = expand_files(steps["corpus"].output_path_under(prefix), ["train/*"])
        unicode = [around_non_ascii(t) for _, _, t in iter_documents(files) if not t.isascii()][:MAX_DOCS]
        folder = tmp_path_factory.mktemp("unicode-docs")
        write_jsonl(folder / "validation" / "docs.jsonl", unicode)
        unicode_step = Step(name="raw/inside-unicode", fn=lambda out: None, override_output_path=str(folder))
        materialize_step(unicode_step, prefix=prefix)
        sets = {"docs": steps["corpus"], "unicode": unicode_step}
        step = perplexity_gap_step("evals/inside-gap", steps["train_bpe"], steps["export_sp"], sets,
                                   max_docs=MAX_DOCS, max_doc_bytes=MAX_DOC_BYTES)
        outcome = materialize_step(step, prefix=prefix)
        texts = {name: [t for _, _, t in iter_documents(TextSet(s).text_files().files) if t.strip()][:MAX_DOCS]
                 for name, s in sets.items()}
        yield SimpleNamespace(prefix=prefix, steps=steps, sets=sets, step=step, outcome=outcome,
                              result=outcome.record.result, texts=texts)


def cut(text: str) -> str:
    raw = text.encode()
    return raw[:MAX_DOC_BYTES].decode("utf-8", "ignore") if len(raw) > MAX_DOC_BYTES else text


def direct(folder: str, tokenizer, text: str) -> dict:
    """One model's losses on one document by the numpy forward pass of its export (sliding windows of the model's
    length, every token predicted from at least half of it): the loss of every predicted token, and whether it
    covers text."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    first = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    ids = np.array([first, *encoded.input_ids, tokenizer.eos_token_id])
    covers = np.array([end > start for start, end in encoded.offset_mapping] + [False])
    log_probs, _, contexts = sliding_log_probs(folder, ids, MODEL.seq_len, MODEL.seq_len - DEFAULT_CONTEXT)
    assert (contexts >= np.minimum(DEFAULT_CONTEXT, np.arange(1, len(ids)))).all()
    covered = np.zeros(len(text.encode()), bool)
    for (start, end) in encoded.offset_mapping:
        covered[len(text[:start].encode()):len(text[:end].encode())] = True
    return {"losses": -log_probs, "covers": covers, "ids": ids, "uncovered": int((~covered).sum())}


@pytest.fixture(scope="module")
def directly(gap):
    """Each model's direct losses on every document of each set."""
    models = {"a": gap.steps["export_bpe"], "b": gap.steps["export_sp"]}
    tokenizers = {side: load_hf_tokenizer(step.output_path_under(gap.prefix)) for side, step in models.items()}
    return {name: [{side: direct(models[side].output_path_under(gap.prefix), tokenizers[side], cut(t))
                    for side in models} for t in texts] for name, texts in gap.texts.items()}


def test_the_bytes_carry_each_models_loss_exactly_and_bpb_is_the_direct_one(gap, directly):
    result = gap.result
    assert result["documents"] == 2 * MAX_DOCS and set(result["sets"]) == {"docs", "unicode"}
    assert any(len(doc["a"]["ids"]) > MODEL.seq_len for doc in directly["docs"]), "no document needs two windows"
    assert result["model_a_min_context"] == result["model_b_min_context"] == DEFAULT_CONTEXT
    assert not all(t.isascii() for t in gap.texts["unicode"])
    total_bytes = 0
    for name, docs in directly.items():
        row = result["sets"][name]
        num_bytes = sum(len(cut(t).encode()) for t in gap.texts[name])
        assert row["documents"] == MAX_DOCS and row["bytes"] == num_bytes
        total_bytes += num_bytes
        for side, model in (("a", "model_a"), ("b", "model_b")):
            text_loss = sum(float(d[side]["losses"][d[side]["covers"]].sum()) for d in docs)
            # exact: the bytes carry the loss of the tokens covering text, the rest is reported beside it
            assert row[f"{model}_bits"] + row[f"{model}_no_byte_bits"] == pytest.approx(
                sum(float(d[side]["losses"].sum()) for d in docs) * LOG2E, rel=1e-5)
            assert row[f"{model}_bpb"] == pytest.approx(text_loss * LOG2E / num_bytes, rel=1e-5)
            assert row[f"{model}_bits"] == pytest.approx(row[f"{model}_bpb"] * num_bytes, rel=1e-9)
            assert row[f"{model}_tokens"] == sum(len(d[side]["ids"]) - 1 for d in docs)
            assert row[f"{model}_uncovered_bytes"] == sum(d[side]["uncovered"] for d in docs)
        assert row["gap_bpb"] == pytest.approx(row["model_a_bpb"] - row["model_b_bpb"], rel=1e-9)
    assert result["bytes"] == total_bytes
    # the SentencePiece normalizer drops whitespace runs, which then cost model B nothing; the BPE covers every byte
    assert result["sets"]["docs"]["model_b_uncovered_bytes"] > 0
    assert result["sets"]["docs"]["model_a_uncovered_bytes"] == 0
    overall_a = sum(r["model_a_bits"] for r in result["sets"].values()) / total_bytes
    assert result["model_a_bpb"] == pytest.approx(overall_a, rel=1e-9)


def test_the_kinds_of_text_partition_every_byte(gap):
    result, rows = gap.result, gap.result["kinds"].values()
    assert sum(r["bytes"] for r in rows) == result["bytes"]
    for model in ("model_a", "model_b"):
        assert sum(r[f"{model}_bpb"] * r["bytes"] for r in rows) == pytest.approx(
            sum(r[f"{model}_bits"] for r in result["sets"].values()), rel=1e-6)
    assert {"text/word", "whitespace/single_space", "text/punctuation"} <= set(result["kinds"])
    assert any(k.startswith("text/non_ascii") for k in result["kinds"])  # the unicode set's words and symbols
    deltas = [abs(r["delta_bits"]) for r in rows]
    assert deltas == sorted(deltas, reverse=True)


def test_the_worst_documents_are_the_largest_gaps(gap, directly):
    per_document = {}
    for name, docs in directly.items():
        texts = [cut(t) for t in gap.texts[name]]
        for text, d in zip(texts, docs, strict=True):
            bits = {side: float(d[side]["losses"][d[side]["covers"]].sum()) * LOG2E for side in "ab"}
            per_document[(name, text[:30])] = (bits["a"] - bits["b"], len(text.encode()))
    worst = gap.result["documents_a_worse"]
    assert worst and [r["delta_bits"] for r in worst] == sorted((r["delta_bits"] for r in worst), reverse=True)
    expected = sorted((v[0] for v in per_document.values() if v[0] > 0), reverse=True)[:len(worst)]
    assert [r["delta_bits"] for r in worst] == pytest.approx(expected, rel=1e-5)
    for row in worst:
        assert row["gap_bpb"] == pytest.approx(row["delta_bits"] / row["bytes"], rel=1e-9)
        assert row["model_a_bpb"] - row["model_b_bpb"] == pytest.approx(row["gap_bpb"], rel=1e-6)
        assert row["set"] in gap.sets and row["file"].endswith(".jsonl.gz" if row["set"] == "docs" else "docs.jsonl")
        assert row["snippet"] and row["worst_kind"]
    for row in gap.result["literals_a_worse"]:
        assert row["delta_bits"] > 0 and row["model_a_tokens"].startswith("|")


def test_levanters_report_is_written_beside_the_record(gap):
    result = gap.result
    with open(result["report_path"]) as f:
        report = f.read()
    assert report.startswith("# Perplexity Gap Report") and "## Pattern Buckets" in report
    with open(result["report_path"].replace("report.md", "summary.json")) as f:
        summary = json.load(f)
    levanter_sets = {r["name"]: r for r in summary["datasets"]}
    for name, row in result["sets"].items():
        assert levanter_sets[name]["model_a_bpb"] == pytest.approx(row["model_a_bpb"], rel=1e-9)
        assert levanter_sets[name]["bytes"] == row["bytes"]
    with open(result["report_path"].replace("report.md", "worst_documents.jsonl")) as f:
        assert len(f.readlines()) == len(summary["top_documents"]["model_a_worse"]) + len(
            summary["top_documents"]["model_b_worse"])
    preview = result["preview_markdown"]
    assert "| set | documents | bytes | model A bpb | model B bpb | gap |" in preview
    assert f"| docs | {MAX_DOCS} | {result['sets']['docs']['bytes']} |" in preview


def test_spreading_a_tokens_loss_over_its_bytes():
    # "aé!" plus a zero-width token: bytes a=0, é=1-2, !=3; two tokens share é (a byte-level split of it)
    starts, ends = np.array([0, 1, 1, 3, -1, 4]), np.array([1, 3, 3, 4, -1, 4])
    losses = np.array([1.0, 2.0, 4.0, 0.5, 3.0, 7.0])
    per_byte, no_byte, uncovered = spread_over_bytes(5, starts, ends, losses)
    assert per_byte.tolist() == [1.0, 3.0, 3.0, 0.5, 0.0]
    assert no_byte == 10.0 and uncovered == 1  # the last byte: no token covers it
    assert per_byte.sum() + no_byte == losses.sum()


def test_dagster_shows_the_sets_kinds_and_worst_documents(gap, dagster_home):
    from resources import StorageResource

    defs = build_definitions([gap.step], resources={"storage": StorageResource(prefix=gap.prefix)})
    run = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.get(), asset_selection=[dg.AssetKey(["evals", "inside-gap"])])
    assert run.success
    (event,) = run.get_asset_materialization_events()
    metadata, result = event.materialization.metadata, gap.result
    assert metadata["cached"].value is True
    for key in ("model_a_bpb", "model_b_bpb", "gap_bpb", "bytes", "documents"):
        assert metadata[f"result.{key}"].value == result[key], key
    sets = metadata["result.sets"]
    assert isinstance(sets, dg.TableMetadataValue)
    assert {r.data["name"]: r.data["gap_bpb"] for r in sets.records} == {
        n: r["gap_bpb"] for n, r in result["sets"].items()}
    assert {r.data["name"] for r in metadata["result.kinds"].records} == set(result["kinds"])
    assert [r.data["delta_bits"] for r in metadata["result.documents_a_worse"].records] == [
        r["delta_bits"] for r in result["documents_a_worse"]]
    (check,) = [e for e in run.get_asset_check_evaluations() if e.check_name == "every_set_compared"]
    assert check.passed


def full_text(error: BaseException) -> str:
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


def test_a_set_with_no_documents_fails_naming_the_step_and_its_files(gap, tmp_path):
    write_jsonl(tmp_path / "blank" / "validation" / "a.jsonl", ["", "   ", "\n\t"])
    blank = Step(name="raw/inside-blank", fn=lambda out: None, override_output_path=str(tmp_path / "blank"))
    materialize_step(blank, prefix=gap.prefix)
    step = perplexity_gap_step("evals/inside-gap-blank", gap.steps["train_bpe"], gap.steps["export_sp"],
                               {"blank": blank})
    with pytest.raises(PerplexityGapError) as caught:
        materialize_step(step, prefix=gap.prefix)
    text = full_text(caught.value)
    assert f"set 'blank' has no documents (files: {tmp_path / 'blank' / 'validation' / 'a.jsonl'})" in text
    assert "step 'evals/inside-gap-blank'" in text


def test_a_model_without_a_tokenizer_is_refused(gap, tmp_path):
    steps = gap.steps
    with pytest.raises(StepDefinitionError, match=r"step 'evals/bad': step 'tokenizers/inside-sp' is not a model"
                                                  r" \(a training step, an export of one, or a model from the Hub\)"):
        perplexity_gap_step("evals/bad", steps["train_bpe"], steps["tokenizer_sp"], {"docs": steps["corpus"]})
    # a model whose tokenizer folder holds no tokenizer: refused before either model is loaded
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARIN_PREFIX", gap.prefix)
        a, b = (model_ref("test", steps[k]).checkpoint() for k in ("train_bpe", "export_sp"))
        (tmp_path / "no-tokenizer").mkdir()
        sets = {"docs": TextSet(steps["corpus"]).text_files()}
        with pytest.raises(ModelTokenizerError, match=rf"model_b \({b.path}\) has no usable tokenizer: tokenizer"
                                                      r" '.*no-tokenizer' does not load: the folder holds no"):
            perplexity_gap(str(tmp_path / "out"), a, replace(b, tokenizer_path=str(tmp_path / "no-tokenizer")), sets)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("arguments", "message"), [
    (lambda steps: {"max_docs": 0}, "max_docs must be a positive number, got 0"),
    (lambda steps: {"max_doc_bytes": -1}, "max_doc_bytes must be a positive number, got -1"),
    (lambda steps: {"sets": {}}, "no sets to compare on"),
    (lambda steps: {"sets": {"a/b": steps["corpus"]}}, "set name 'a/b' must be a non-empty name without '/'"),
    (lambda steps: {"sets": {"docs": "raw/x"}}, "set 'docs' is 'raw/x', not a dataset step or a TextSet"),
])
def test_bad_arguments_are_refused_naming_the_step(gap, arguments, message):
    kwargs = {"sets": {"docs": gap.steps["corpus"]}, **arguments(gap.steps)}
    with pytest.raises(StepDefinitionError, match=f"step 'evals/bad': {message}"):
        perplexity_gap_step("evals/bad", gap.steps["train_bpe"], gap.steps["export_sp"], **kwargs)


def test_the_gap_of_a_model_to_itself_is_zero(gap):
    """The same weights as checkpoint and as export: every byte costs both the same."""
    steps = gap.steps
    itself = perplexity_gap_step("evals/inside-gap-itself", steps["train_bpe"], steps["export_bpe"],
                                 {"unicode": gap.sets["unicode"]}, max_docs=3)
    made = load_result(materialize_step(itself, prefix=gap.prefix).output_path)
    assert made.gap_bpb == pytest.approx(0, abs=1e-5) and made.model_a_bpb > 1
    assert made.sets["unicode"]["model_a_tokens"] == made.sets["unicode"]["model_b_tokens"]


def test_the_gap_follows_every_checkpoint_against_a_fixed_reference(gap):
    steps = gap.steps
    family = perplexity_gap_checkpoint_evals("evals/inside-gap-checkpoints", steps["train_bpe"], steps["export_sp"],
                                             gap.sets, max_docs=MAX_DOCS)
    partition = family.step(1)
    assert {d.name for d in partition.deps} == {"exports/inside-sp", "raw/inside-docs", "raw/inside-unicode"}
    assert partition.hash_attrs["model_b"] == {"step": "exports/inside-sp", "checkpoint_step": None, "export": True}
    assert partition.hash_attrs["sets"]["docs"] == {"dataset": "raw/inside-docs", "globs": [], "text_field": "text",
                                                    "text_format": "auto"}
    assert family.step(3).hash != partition.hash
    # the identity follows the reference and the sets
    other = perplexity_gap_step("evals/inside-gap", steps["train_bpe"], steps["export_bpe"], gap.sets,
                                max_docs=MAX_DOCS, max_doc_bytes=MAX_DOC_BYTES)
    fewer = perplexity_gap_step("evals/inside-gap", steps["train_bpe"], steps["export_sp"], {"docs": steps["corpus"]},
                                max_docs=MAX_DOCS, max_doc_bytes=MAX_DOC_BYTES)
    assert len({gap.step.hash, other.hash, fewer.hash}) == 3
