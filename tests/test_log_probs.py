"""Per-token log-probs (`log_probs_step`) of a tiny model trained on the demo's real text: every log-prob and entropy
equals an independent forward pass of the exported model (numpy, as transformers computes Llama), for the
checkpoint and for its export alike; the table has one row per scored token, in order; the hardest documents and
tokens are the table's; the HTML colours each token by its log-prob; Dagster shows the record; bad input is refused
naming the step. A document longer than the model is scored in sliding windows: every token is predicted from at
least half the model's length (Levanter's windows overlapping by one token on request, under their old identity)."""

import html
import re
from types import SimpleNamespace

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from marin_assets import Step, StepDefinitionError, build_definitions, materialize_step
from marin_assets.core.record import read_record
from marin_assets.pipeline.evals.log_probs import (
    LogProbsError,
    log_probs_checkpoint_evals,
    log_probs_step,
    token_texts,
)
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep
from marin_assets.pipeline.evals.token_scores import windows
from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer
from tests.support.looking_inside import DEFAULT_CONTEXT, MODEL, looking_inside, materialized, sliding_log_probs

MAX_DOCS = 12


@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    """The BPE model trained and exported (shared with the perplexity-gap tests), its cache, and both scored."""
    with looking_inside(tmp_path_factory, "export_bpe", "tokenized_bpe") as (steps, prefix):
        by_checkpoint = log_probs_step("evals/inside-log-probs", steps["train_bpe"], steps["tokenized_bpe"],
                                       max_docs=MAX_DOCS)
        by_export = log_probs_step("evals/inside-log-probs-export", steps["export_bpe"], steps["tokenized_bpe"],
                                   max_docs=MAX_DOCS)
        levanter = log_probs_step("evals/inside-log-probs-levanter", steps["export_bpe"], steps["tokenized_bpe"],
                                  max_docs=MAX_DOCS, min_context=1)
        outcomes = {s.name: materialize_step(s, prefix=prefix) for s in (by_checkpoint, by_export)}
        yield SimpleNamespace(prefix=prefix, steps=steps, checkpoint=by_checkpoint, export=by_export,
                              levanter=materialize_step(levanter, prefix=prefix),
                              outcomes=outcomes, tokenizer=load_hf_tokenizer(steps["tokenizer_bpe"].output_path),
                              documents=cached_documents(steps["tokenized_bpe"].output_path, MAX_DOCS))


def cached_documents(cache: str, count: int) -> list[np.ndarray]:
    """The first documents of the validation cache, read with Levanter's reader."""
    from levanter.store.cache import TreeCache

    rows = TreeCache.load(f"{cache}/validation", {"input_ids": np.zeros((0,), dtype=np.int32)})
    return [np.asarray(r["input_ids"]) for r in rows.get_batch_sync(list(range(count)))]


def table_of(outcome):
    return pq.read_table(outcome.record.result["table_path"]).to_pandas()


def test_log_probs_and_entropies_equal_a_direct_forward_pass(inside):
    """Every token predicted from at least half the model's length (all of its document before it, near the start),
    as a sliding-window forward pass predicts it."""
    export_folder = inside.steps["export_bpe"].output_path
    assert any(len(ids) > MODEL.seq_len + DEFAULT_CONTEXT for ids in inside.documents), "no document needs 3 windows"
    tables = {name: table_of(outcome) for name, outcome in inside.outcomes.items()}
    for d, ids in enumerate(inside.documents):
        log_probs, entropies, contexts = sliding_log_probs(export_folder, ids, MODEL.seq_len,
                                                           MODEL.seq_len - DEFAULT_CONTEXT)
        assert (contexts >= np.minimum(DEFAULT_CONTEXT, np.arange(1, len(ids)))).all(), d
        for name, table in tables.items():
            rows = table[table.document == d]
            np.testing.assert_allclose(rows.log_prob.to_numpy(), log_probs, atol=2e-5, err_msg=f"{name} doc {d}")
            np.testing.assert_allclose(rows.entropy.to_numpy(), entropies, atol=2e-5, err_msg=f"{name} doc {d}")
    # the checkpoint and the export of it are the same weights, loaded two ways
    a, b = tables.values()
    np.testing.assert_allclose(a.log_prob.to_numpy(), b.log_prob.to_numpy(), atol=1e-5)
    assert inside.outcomes[inside.checkpoint.name].record.result["step"] == max(
        read_record(inside.steps["train_bpe"].output_path).result["checkpoint_steps"])


def test_windows_predict_every_token_once_from_at_least_the_stated_context():
    assert windows(5, 128) == [(0, 5, 1)]
    assert windows(300, 128) == [(0, 128, 1), (127, 255, 128), (254, 300, 255)]  # Levanter's: one token overlaps
    assert windows(300, 128, 64) == [(0, 128, 1), (64, 192, 128), (128, 256, 192), (192, 300, 256)]
    assert windows(128, 128) == [(0, 128, 1)] and windows(129, 128) == [(0, 128, 1), (127, 129, 128)]
    assert windows(1, 128) == [] and windows(0, 128) == []
    for context in (1, 2, 64, 100, 127):
        for length in (2, 127, 128, 129, 255, 256, 1000):
            spans = windows(length, 128, context)
            predicted = [t for _, end, first in spans for t in range(first, end)]
            assert predicted == list(range(1, length)), (context, length)
            assert all(end - start <= 128 and t - start >= min(context, t)
                       for start, end, first in spans for t in range(first, end)), (context, length)
    for bad in (0, 128, 200):
        with pytest.raises(ValueError, match=r"min_context must be at least 1 and below the model's length"):
            windows(300, 128, bad)


def test_levanters_one_token_overlap_is_still_there_and_keeps_its_identity(inside):
    """`min_context=1`: Levanter's windows, the first token of each predicted from one token, and the identity every
    log-probs step had before the setting existed (pinned from that code); the default is another identity."""
    from marin_assets.experiments import tiny_stories
    from marin_assets.pipeline.evals.perplexity_gap import perplexity_gap_step

    folder = inside.steps["export_bpe"].output_path
    levanter, table = inside.levanter.record.result, table_of(inside.levanter)
    default = table_of(inside.outcomes[inside.export.name])
    assert levanter["min_context"] == 1
    assert inside.outcomes[inside.export.name].record.result["min_context"] == DEFAULT_CONTEXT
    starts = {"one token": [], "half the length": []}
    for d, ids in enumerate(inside.documents):
        log_probs, entropies, contexts = sliding_log_probs(folder, ids, MODEL.seq_len, MODEL.seq_len - 1)
        rows = table[table.document == d]
        np.testing.assert_allclose(rows.log_prob.to_numpy(), log_probs, atol=2e-5, err_msg=f"doc {d}")
        np.testing.assert_allclose(rows.entropy.to_numpy(), entropies, atol=2e-5, err_msg=f"doc {d}")
        window_starts = np.flatnonzero(contexts == 1)[1:]  # a window's first token (the document's own is not one)
        starts["one token"] += rows.log_prob.to_numpy()[window_starts].tolist()
        starts["half the length"] += default[default.document == d].log_prob.to_numpy()[window_starts].tolist()
    assert len(starts["one token"]) >= 2
    assert not np.allclose(starts["one token"], starts["half the length"], atol=1e-3)  # other contexts, other values
    print({k: (len(v), round(float(np.mean(v)), 4)) for k, v in starts.items()})

    pipeline = tiny_stories.build()
    train, tokenized = pipeline["train"], pipeline["tokenized"]
    pinned = {  # made by the code before `min_context` existed (commit cd9f8a7)
        "evals/pinned-log-probs_41bfd44b": log_probs_step("evals/pinned-log-probs", train, tokenized, max_docs=4,
                                                          min_context=1),
        "evals/pinned-gap_6a37565c": perplexity_gap_step("evals/pinned-gap", train, pipeline["export"],
                                                         {"stories": pipeline["corpus"]}, max_docs=4, min_context=1),
        "evals/pinned-lp-every/step-50_75185c3c": log_probs_checkpoint_evals(
            "evals/pinned-lp-every", train, tokenized, max_docs=4, min_context=1).step(50)}
    assert {name: step.name_with_hash for name, step in pinned.items()} == {name: name for name in pinned}
    assert log_probs_step("evals/pinned-log-probs", train, tokenized, max_docs=4).name_with_hash not in pinned


def test_the_table_has_one_row_per_scored_token_in_order(inside):
    table = table_of(inside.outcomes[inside.checkpoint.name])
    result = inside.outcomes[inside.checkpoint.name].record.result
    assert list(table.columns) == ["document", "position", "token_id", "token", "log_prob", "entropy"]
    assert len(table) == result["tokens"] == sum(len(ids) - 1 for ids in inside.documents)
    assert result["documents"] == MAX_DOCS and sorted(table.document.unique()) == list(range(MAX_DOCS))
    for d, ids in enumerate(inside.documents):
        rows = table[table.document == d]
        assert rows.position.tolist() == list(range(1, len(ids)))
        assert rows.token_id.tolist() == ids[1:].tolist()
        # the token texts, after the unscored BOS, spell the document as the tokenizer decodes it
        first = inside.tokenizer.decode(ids[:1])
        assert first + "".join(rows.token) == inside.tokenizer.decode(ids)
    assert result["mean_log_prob"] == pytest.approx(table.log_prob.mean(), rel=1e-5)
    assert result["loss"] == pytest.approx(-table.log_prob.mean(), rel=1e-5)
    assert result["mean_entropy"] == pytest.approx(table.entropy.mean(), rel=1e-5)
    assert 0 < result["mean_entropy"] <= np.log(read_record(inside.steps["train_bpe"].output_path).result["vocab_size"])


def test_the_hardest_documents_and_tokens_are_the_tables(inside):
    outcome = inside.outcomes[inside.checkpoint.name]
    table, result = table_of(outcome), outcome.record.result
    means = table.groupby("document").log_prob.mean()
    expected = means.sort_values().index[:len(result["hardest_documents"])].tolist()
    assert [r["document"] for r in result["hardest_documents"]] == expected and len(expected) == 10
    for row in result["hardest_documents"]:
        rows = table[table.document == row["document"]]
        assert row["mean_log_prob"] == pytest.approx(rows.log_prob.mean(), rel=1e-5)
        assert row["loss"] == pytest.approx(-row["mean_log_prob"])
        assert row["tokens"] == len(rows) and row["worst_log_prob"] == pytest.approx(rows.log_prob.min())
        assert row["worst_token"] == rows.token.iloc[int(rows.log_prob.to_numpy().argmin())]
        text = inside.tokenizer.decode(inside.documents[row["document"]], skip_special_tokens=True)
        visible = {"\u2420": " ", "\u23ce": "\n", "\u21e5": "\t", "\u21b5": "\r"}
        assert "".join(visible.get(c, c) for c in row["start"]).rstrip("\u2026") in text
    named = [t or inside.tokenizer.convert_ids_to_tokens(int(i)) for t, i in zip(table.token, table.token_id,
                                                                                   strict=True)]
    grouped = table.assign(token=named).log_prob.groupby(named)
    means, counts = grouped.mean(), grouped.count()
    hardest = result["hardest_tokens"]
    assert len(hardest) == 20
    assert [r["mean_log_prob"] for r in hardest] == pytest.approx(sorted(means)[:len(hardest)], rel=1e-5)
    for row in hardest:
        assert row["count"] == counts[row["token"]]
        assert row["mean_log_prob"] == pytest.approx(means[row["token"]], rel=1e-5)
        assert row["min_log_prob"] <= row["mean_log_prob"]
        assert row["total_loss"] == pytest.approx(-row["mean_log_prob"] * row["count"], rel=1e-5)
    preview = result["hardest_documents_markdown"].splitlines()
    assert preview[0].startswith("| document | tokens | mean log-prob") and len(preview) == 2 + 5
    assert preview[2].startswith(f"| {result['hardest_documents'][0]['document']} | ")


SPAN = re.compile(r"<span data-lp='(-?[0-9.]+)' data-argmax='([^']*)'>(.*?)</span>", re.S)


def levanter_unescape(shown: str) -> str:
    """Levanter's view shows newlines, tabs and runs of spaces visibly; this undoes it."""
    return html.unescape(shown).replace("\u23ce", "\n").replace("\u21e5", "\t").replace("\u2423", " ")


def test_the_html_colours_each_token_by_its_log_prob(inside):
    outcome = inside.outcomes[inside.checkpoint.name]
    table, result = table_of(outcome), outcome.record.result
    with open(result["html_path"], encoding="utf-8") as f:
        page = f.read()
    assert result["html_path"] == f"{outcome.output_path}/log_probs.html"
    assert f"Log-probs of {result['checkpoint']}" in page and f"{MAX_DOCS} documents" in page
    assert "hsla(${hue}, 100%, 50%, ${alpha})" in page  # Levanter's colouring script
    body = page.split("<div class='lp'>", 1)[1].split("</div>", 1)[0]
    documents = body.split("<br><br>")[:-1]
    assert len(documents) == MAX_DOCS
    for d, (shown, ids) in enumerate(zip(documents, inside.documents, strict=True)):
        spans = SPAN.findall(shown)
        assert len(spans) == len(ids), d
        rows = table[table.document == d]
        assert float(spans[0][0]) == 0 and spans[0][1] == ""  # the first token is not scored
        np.testing.assert_allclose([float(lp) for lp, _, _ in spans[1:]], rows.log_prob.to_numpy(), atol=6e-4)
        assert [levanter_unescape(text) for _, _, text in spans] == token_texts(inside.tokenizer, ids)
        assert all(top for _, top, _ in spans[1:])  # the model's most likely token in each tooltip


def test_dagster_shows_the_numbers_the_tables_and_the_html(inside, local_ray, dagster_home):
    """A fresh evaluation (two documents of the export) computed through Dagster on Ray, and the cached one."""
    from resources import StorageResource

    fresh = log_probs_step("evals/inside-log-probs-dagster", inside.steps["export_bpe"], inside.steps["tokenized_bpe"],
                           max_docs=2)
    defs = build_definitions([fresh, inside.checkpoint], resources={"storage": StorageResource(prefix=inside.prefix)})
    keys = [dg.AssetKey(s.name.split("/")) for s in (fresh, inside.checkpoint)]
    run = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=dg.DagsterInstance.get(),
                                                                          asset_selection=keys)
    assert run.success
    shown = {e.asset_key.to_user_string(): e.materialization.metadata for e in run.get_asset_materialization_events()}
    assert shown[fresh.name]["cached"].value is False and shown[inside.checkpoint.name]["cached"].value is True
    made = read_record(fresh.output_path_under(inside.prefix)).result
    assert made["documents"] == 2 and made["tokens"] == sum(len(ids) - 1 for ids in inside.documents[:2])
    metadata = shown[inside.checkpoint.name]
    result = inside.outcomes[inside.checkpoint.name].record.result
    for key in ("mean_log_prob", "loss", "mean_entropy", "tokens", "documents"):
        assert metadata[f"result.{key}"].value == result[key], key
    table = metadata["result.hardest_documents"]
    assert isinstance(table, dg.TableMetadataValue)
    assert [r.data["document"] for r in table.records] == [r["document"] for r in result["hardest_documents"]]
    assert {c.name for c in metadata["result.hardest_tokens"].schema.columns} >= {"token", "count", "mean_log_prob"}
    assert str(metadata["result.html_path"].value).endswith("/log_probs.html")
    assert "| document |" in str(metadata["result.hardest_documents_markdown"].value)
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in run.get_asset_check_evaluations()}
    assert checks[(fresh.name, "every_token_scored")] and checks[(inside.checkpoint.name, "every_token_scored")]


def full_text(error: BaseException) -> str:
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


@pytest.mark.parametrize("max_docs", [0, -3, True, 2.5])
def test_max_docs_must_be_a_positive_count(inside, max_docs):
    with pytest.raises(StepDefinitionError, match=r"step 'evals/bad': max_docs must be a positive number"):
        log_probs_step("evals/bad", inside.steps["train_bpe"], inside.steps["tokenized_bpe"], max_docs=max_docs)


@pytest.mark.parametrize("min_context", [0, -1, True, 2.5, "half"])
def test_min_context_must_be_a_positive_count(inside, min_context):
    with pytest.raises(StepDefinitionError, match=r"step 'evals/bad': min_context must be a positive number of"):
        log_probs_step("evals/bad", inside.steps["train_bpe"], inside.steps["tokenized_bpe"], min_context=min_context)


def test_a_context_as_long_as_the_model_fails_naming_the_model_and_the_step(inside):
    step = log_probs_step("evals/inside-log-probs-too-long", inside.steps["train_bpe"], inside.steps["tokenized_bpe"],
                          max_docs=2, min_context=MODEL.seq_len)
    with pytest.raises(LogProbsError) as caught:
        materialize_step(step, prefix=inside.prefix)
    text = full_text(caught.value)
    assert f"min_context must be at least 1 and below the model's length ({MODEL.seq_len} tokens), got 128" in text
    assert "step 'evals/inside-log-probs-too-long'" in text and "the model " in text


def test_a_step_that_is_not_a_model_is_refused(inside):
    with pytest.raises(StepDefinitionError, match=r"step 'evals/bad': step 'tokenizers/inside-bpe' is not a model"
                                                  r" \(a training step, an export of one, or a model from the Hub\)"):
        log_probs_step("evals/bad", inside.steps["tokenizer_bpe"], inside.steps["tokenized_bpe"])
    with pytest.raises(StepDefinitionError, match=r"is an export \(of one checkpoint\); checkpoint_step 1"):
        log_probs_step("evals/bad", inside.steps["export_bpe"], inside.steps["tokenized_bpe"], checkpoint_step=1)


def test_another_tokenizers_cache_or_a_missing_split_fail_naming_the_step(inside):
    materialized(inside.prefix, inside.steps["tokenized_sp"])
    other = log_probs_step("evals/inside-log-probs-other", inside.steps["train_bpe"], inside.steps["tokenized_sp"])
    with pytest.raises(LogProbsError) as caught:
        materialize_step(other, prefix=inside.prefix)
    text = full_text(caught.value)
    assert "'tokenized/inside-sp' was tokenized with" in text and "not the model's tokenizer" in text
    assert "step 'evals/inside-log-probs-other'" in text
    missing = log_probs_step("evals/inside-log-probs-test", inside.steps["train_bpe"], inside.steps["tokenized_bpe"],
                             split="test")
    with pytest.raises(LogProbsError) as caught:
        materialize_step(missing, prefix=inside.prefix)
    text = full_text(caught.value)
    assert "'tokenized/inside-bpe' has no split 'test' (it has ['train', 'validation'])" in text
    assert "step 'evals/inside-log-probs-test'" in text
    assert isinstance(other, EvalStep) and other.evaluates is inside.steps["train_bpe"]


def test_every_checkpoint_and_the_export_are_one_kind_of_evaluation(inside):
    """The final step reads the run (or its export); each checkpoint's partition reads only the cache."""
    train, cache = inside.steps["train_bpe"], inside.steps["tokenized_bpe"]
    family = log_probs_checkpoint_evals("evals/inside-log-probs-checkpoints", train, cache, max_docs=MAX_DOCS)
    assert isinstance(family, CheckpointEvals) and family.eval_kind == inside.checkpoint.eval_kind
    partition = family.step(1)
    assert list(partition.deps) == [cache] and partition.hash_attrs["checkpoint_step"] == 1
    assert inside.checkpoint.hash_attrs == {"max_docs": MAX_DOCS, "split": "validation",
                                            "min_context": "half the model's length", "checkpoint_step": None}
    assert list(inside.export.deps) == [train, cache, inside.steps["export_bpe"]]
    assert inside.export.hash != inside.checkpoint.hash
    assert log_probs_step("evals/x", train, cache, max_docs=3).hash != log_probs_step("evals/x", train, cache).hash


def hub_model(inside, name: str, with_tokenizer: bool) -> Step:
    """A model from the Hub as `hf_model_step` records one (`HfModel`), here the export's folder, copied from nowhere:
    what an evaluation reads of it is its record."""
    import json

    from marin_assets.pipeline.training.hf_model import HfModel, model_spec_of

    folder = inside.steps["export_bpe"].output_path_under(inside.prefix)
    with open(f"{folder}/config.json") as f:
        config = json.load(f)
    record = HfModel("local/inside-bpe", "main", "0" * 40, folder, "llama", ["LlamaForCausalLM"], config["vocab_size"],
                     0, ["F32"], model_spec_of(config), None, folder if with_tokenizer else None, [], 0)
    return Step(name=name, fn=lambda out: record, hash_attrs={"tokenizer": with_tokenizer}, kind="model")


def test_a_model_from_the_hub_is_scored_as_the_run_it_came_from(inside):
    model = hub_model(inside, "models/inside-bpe", with_tokenizer=True)
    materialize_step(model, prefix=inside.prefix)
    step = log_probs_step("evals/inside-log-probs-hub", model, inside.steps["tokenized_bpe"], max_docs=3)
    assert step.evaluates is model and model in step.deps
    table = table_of(materialize_step(step, prefix=inside.prefix))
    expected = table_of(inside.outcomes[inside.checkpoint.name])
    expected = expected[expected.document < 3]
    assert table.token_id.tolist() == expected.token_id.tolist()
    np.testing.assert_allclose(table.log_prob.to_numpy(), expected.log_prob.to_numpy(), atol=1e-5)

    # a model whose record has no tokenizer: refused at run time, naming the model and the step
    bare = hub_model(inside, "models/inside-bpe-bare", with_tokenizer=False)
    materialize_step(bare, prefix=inside.prefix)
    from marin_assets.pipeline.training.hf_model import HfModelError

    with pytest.raises(HfModelError) as caught:
        materialize_step(log_probs_step("evals/inside-log-probs-bare", bare, inside.steps["tokenized_bpe"]),
                         prefix=inside.prefix)
    text = full_text(caught.value)
    assert "local/inside-bpe@000000000000 has no tokenizer files" in text
    assert "step 'evals/inside-log-probs-bare'" in text
