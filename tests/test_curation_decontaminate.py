"""decontaminate on the planted corpus: every planted evaluation paragraph found and traced to its record, near
misses and clean documents untouched; the three modes; exact confirmation of Bloom hits; the threshold; the same
output fanned out and after a kill; bad input; identity; the step through the protocol."""

import functools
import json
import re
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from marin_assets import Step, StepDefinitionError, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.pipeline.curation import eval_index
from marin_assets.pipeline.curation.decontaminate import (
    CONTAMINATION_DIR,
    MARK_COLUMN,
    DecontaminationResult,
    EvalSet,
    SetHits,
    decontaminate,
    decontaminate_step,
)
from marin_assets.pipeline.curation.eval_index import hash_in_chunks
from marin_assets.pipeline.curation.ngrams import ngram_hashes
from marin_assets.pipeline.curation.normalize import normalize
from marin_assets.pipeline.curation.shards import CurationError, list_shards
from tests.support.curation import documents, id_counts, kill_when
from tests.support.helpers import FAST, subprocess_env


def eval_sets_of(planted) -> dict[str, list[str]]:
    return {name: [path] for name, path in planted.truth.eval_sets.items()}


def eval_record(path: str, line: int) -> str:
    return json.loads(Path(path).read_text().splitlines()[line - 1])["text"]


def side_rows(output: str) -> list[dict]:
    """The side index: every contaminated paragraph, shard by shard."""
    files = sorted(Path(output, CONTAMINATION_DIR).glob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def contents(output: str) -> tuple[list[dict], list[dict]]:
    """Everything a reader sees: the documents (all columns) and the side index."""
    rows = [row for shard in list_shards("test", output) for row in pq.read_table(shard.path).to_pylist()]
    return rows, side_rows(output)


def same_result(result: DecontaminationResult, reference: DecontaminationResult) -> bool:
    return result == DecontaminationResult(**{**reference.__dict__, "path": result.path,
                                              "contamination_path": result.contamination_path})


@pytest.fixture(scope="module")
def decontaminated(planted, tmp_path_factory):
    """The planted corpus decontaminated once (remove_paragraph, the defaults): (output path, result)."""
    out = str(tmp_path_factory.mktemp("decontaminate") / "out")
    return out, decontaminate(out, planted.normalized, eval_sets_of(planted))


def test_every_planted_paragraph_is_found_and_traced_to_its_record(planted, decontaminated):
    out, result = decontaminated
    truth = planted.truth
    side = {row["id"]: row for row in side_rows(out)}
    before = {row["id"]: row["text"] for row in documents(planted.normalized)}
    for c in truth.contaminated:
        row = side.get(c.id)
        assert row is not None, f"recall: {c.id} ({c.eval_set} line {c.eval_record}) was not found"
        assert (row["eval_set"], row["eval_file"], row["eval_record"]) == (c.eval_set, truth.eval_sets[c.eval_set],
                                                                           c.eval_record)
        assert row["overlap"] == 1.0 and row["paragraph"] == before[c.id].count("\n")  # the inserted last line
        assert row["source"].startswith("train/")
    caught = set(side) & {c.id for c in truth.contaminated}
    print(f"\ndecontaminate: recall {len(caught)}/{len(truth.contaminated)},"
          f" precision {len(caught)}/{len(side)} documents")
    per_set = {name: sum(c.eval_set == name for c in truth.contaminated) for name in truth.eval_sets}
    assert result.hits == {name: SetHits(n, n) for name, n in per_set.items()}
    assert {name: (r.documents, r.modified) for name, r in result.removed.items()} == {
        name: (0, n) for name, n in per_set.items()}
    assert result.eval_set_records == {name: 40 for name in truth.eval_sets}
    assert all(n > 40 for n in result.eval_set_ngrams.values())
    assert result.counters["paragraphs_removed"] == len(truth.contaminated)


def test_near_misses_and_clean_documents_are_untouched(planted, decontaminated):
    out, result = decontaminated
    truth = planted.truth
    contaminated = {c.id for c in truth.contaminated}
    assert {row["id"] for row in side_rows(out)} == contaminated, "precision: nothing else is listed"
    after = {row["id"]: row["text"] for row in documents(out)}
    before = documents(planted.normalized)
    assert id_counts(out) == id_counts(planted.normalized), "remove_paragraph removed no whole document"
    untouched = {row["id"] for row in before if row["id"] not in contaminated}
    assert all(after[row["id"]] == row["text"] for row in before if row["id"] in untouched)
    assert set(truth.near_misses + truth.base_ids + truth.validation_ids) <= untouched
    assert result.documents_out == result.documents_in == len(before)


def test_remove_paragraph_keeps_the_carriers_own_text(planted, decontaminated):
    out, _ = decontaminated
    after = {row["id"]: row["text"] for row in documents(out)}
    before = {row["id"]: row["text"] for row in documents(planted.normalized)}
    for c in planted.truth.contaminated:
        inserted = "\n" + eval_record(planted.truth.eval_sets[c.eval_set], c.eval_record)
        assert before[c.id].endswith(inserted)
        assert after[c.id] == before[c.id][:-len(inserted)]


def test_remove_document_drops_exactly_the_contaminated(planted, tmp_path):
    out = str(tmp_path / "out")
    result = decontaminate(out, planted.normalized, eval_sets_of(planted), mode="remove_document")
    truth = planted.truth
    expected = id_counts(planted.normalized)
    for c in truth.contaminated:
        del expected[c.id]
    assert id_counts(out) == expected
    assert {name: (r.documents, r.modified) for name, r in result.removed.items()} == {
        name: (sum(c.eval_set == name for c in truth.contaminated), 0) for name in truth.eval_sets}


def test_mark_keeps_everything_and_marks_exactly_the_contaminated(planted, tmp_path):
    out = str(tmp_path / "out")
    result = decontaminate(out, planted.normalized, eval_sets_of(planted), mode="mark")
    marked = {row["id"]: row for row in documents(out, ("id", "text", MARK_COLUMN))}
    before = documents(planted.normalized)
    assert len(marked) == len({row["id"] for row in before}) and result.removed == {}
    assert all(marked[row["id"]]["text"] == row["text"] for row in before)
    by_id = {c.id: c.eval_set for c in planted.truth.contaminated}
    assert {i: row[MARK_COLUMN] for i, row in marked.items() if row[MARK_COLUMN]} == by_id
    assert result.counters["documents_marked"] == len(by_id)


def test_bloom_false_positives_never_remove_anything(planted, decontaminated, tmp_path):
    out, result = decontaminated
    leaky = str(tmp_path / "leaky")
    found = decontaminate(leaky, planted.normalized, eval_sets_of(planted), false_positive_rate=0.5)
    assert found.counters["bloom_false_positives"] > found.counters["ngrams"] // 10, "the Bloom filter does leak"
    assert result.counters["bloom_false_positives"] < found.counters["bloom_false_positives"]
    assert contents(leaky) == contents(out)
    assert found.removed == result.removed and found.hits == result.hits


def test_the_threshold_decides(planted, tmp_path):
    """A paragraph with about 30% of its 13-grams from an evaluation record: kept at 0.5, removed at 0.2."""
    path = planted.truth.eval_sets["stdlib-qa"]
    record = re.findall(r"[A-Za-z0-9]+", eval_record(path, 1))
    filler = re.findall(r"[A-Za-z0-9]+", documents(planted.normalized)[0]["text"])
    assert len(record) >= 24 and len(filler) >= 28
    mixed = " ".join(record[:24] + filler[:28])  # 12 of its 40 13-grams lie inside the record
    raw = tmp_path / "raw" / "train"
    raw.mkdir(parents=True)
    texts = ["An opening line of its own.\n" + mixed, documents(planted.normalized)[1]["text"]]
    (raw / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    data = str(tmp_path / "data")
    normalize(data, str(tmp_path / "raw"))

    kept = decontaminate(str(tmp_path / "at-0.5"), data, {"stdlib-qa": [path]})
    assert [row["text"] for row in documents(str(tmp_path / "at-0.5"))] == texts
    assert kept.hits == {"stdlib-qa": SetHits(0, 0)} and side_rows(str(tmp_path / "at-0.5")) == []

    removed = decontaminate(str(tmp_path / "at-0.2"), data, {"stdlib-qa": [path]}, threshold=0.2)
    assert [row["text"] for row in documents(str(tmp_path / "at-0.2"))] == ["An opening line of its own.", texts[1]]
    [row] = side_rows(str(tmp_path / "at-0.2"))
    assert (row["paragraph"], row["eval_record"]) == (1, 1) and 0.25 <= row["overlap"] < 0.35
    assert removed.hits == {"stdlib-qa": SetHits(1, 1)}


def test_hashing_in_chunks_changes_nothing(planted, decontaminated, tmp_path, monkeypatch):
    """Text is hashed ~2 MB at a time (memory); in small chunks the hashes and the whole output are the same."""
    out, result = decontaminated
    paragraphs = [p for row in documents(planted.normalized) for p in row["text"].split("\n")]
    monkeypatch.setattr(eval_index, "CHUNK_CHARACTERS", 2000)
    grams, offsets = hash_in_chunks(paragraphs, 13)
    expected = ngram_hashes(paragraphs, 13)
    assert len(offsets) == len(paragraphs) + 1 and (grams == expected[0]).all() and (offsets == expected[1]).all()
    chunked = str(tmp_path / "chunked")
    assert same_result(decontaminate(chunked, planted.normalized, eval_sets_of(planted)), result)
    assert contents(chunked) == contents(out)


def test_identity_holds_the_eval_sets_and_parameters_not_the_workers():
    data = Step(name="curated/data", fn=print, hash_attrs={"v": 1})
    evals = Step(name="raw/evals", fn=print, hash_attrs={"v": 1})
    other = Step(name="raw/evals", fn=print, hash_attrs={"v": 2})
    qa = EvalSet("qa", evals, ("qa.jsonl",))

    def step(**kwargs):
        return decontaminate_step("curated/decon", data, kwargs.pop("eval_sets", [qa]), **kwargs)

    base = step()
    assert evals in base.deps and data in base.deps
    same = [step(workers=4), step(false_positive_rate=0.1), step(max_removed_fraction=0.9)]
    assert {s.hash for s in same} == {base.hash}
    changed = [step(ngram=8), step(threshold=0.8), step(mode="mark"), step(paragraph_separator="\n\n"),
               step(eval_sets=[EvalSet("qa", evals, ("other.jsonl",))]),
               step(eval_sets=[EvalSet("qb", evals, ("qa.jsonl",))]),
               step(eval_sets=[EvalSet("qa", evals, ("qa.jsonl",), text_field="question")]),
               step(eval_sets=[EvalSet("qa", other, ("qa.jsonl",))])]
    assert len({s.hash for s in changed} | {base.hash}) == len(changed) + 1
    with pytest.raises(StepDefinitionError, match=r"decontaminate step 'curated/decon': mode 'drop' is not one of"):
        step(mode="drop")
    with pytest.raises(StepDefinitionError, match=r"threshold must be in \(0, 1\], got 0"):
        step(threshold=0)
    with pytest.raises(StepDefinitionError, match=r"evaluation set names repeat"):
        step(eval_sets=[qa, qa])


def test_two_workers_on_ray_give_the_same_output(planted, decontaminated, local_ray, tmp_path):
    out, result = decontaminated
    fanned = str(tmp_path / "fanned")
    assert same_result(decontaminate(fanned, planted.normalized, eval_sets_of(planted), workers=2), result)
    assert contents(fanned) == contents(out)
    assert list(Path(fanned, "_work", "shards").glob("*.claim")), "the shards went through Ray's fan-out claims"


HANG_AFTER_FIRST_SHARD = """
import time
from marin_assets.pipeline.curation import decontaminate as dc
decide = dc.Decontaminate.decide
def slow(self, table, shard):
    if shard.key != {first!r}:
        time.sleep(600)  # a worker stuck on the second shard: the kill lands there
    return decide(self, table, shard)
dc.Decontaminate.decide = slow
dc.decontaminate({out!r}, {data!r}, {eval_sets!r})
"""


def test_a_killed_run_resumes_without_redoing_finished_work(planted, decontaminated, tmp_path):
    whole, result = decontaminated
    out = tmp_path / "out"
    first = list_shards("test", planted.normalized)[0]
    code = HANG_AFTER_FIRST_SHARD.format(first=first.key, out=str(out), data=planted.normalized,
                                         eval_sets=eval_sets_of(planted))
    kill_when([sys.executable, "-c", code], str(out / "_work" / "shards" / f"{first.key}.json"), env=subprocess_env())
    work = out / "_work"
    assert [p.name for p in (work / "shards").glob("*.json")] == [f"{first.key}.json"], "killed after one shard"
    finished = {p: p.stat().st_mtime_ns for p in [*work.rglob("*.json"), Path(first.output_under(str(out))),
                                                  out / CONTAMINATION_DIR / f"{first.key}.parquet",
                                                  work / "eval_index" / "index.npz"]}

    resumed = decontaminate(str(out), planted.normalized, eval_sets_of(planted))
    assert {p: p.stat().st_mtime_ns for p in finished} == finished, "finished outcomes and data were not redone"
    assert contents(str(out)) == contents(whole)
    assert same_result(resumed, result)


def test_bad_input_names_the_stage_the_file_and_the_line(planted, tmp_path):
    eval_sets = eval_sets_of(planted)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a fine record with words"}\n{"question": "where is the text?"}\n')
    with pytest.raises(CurationError, match=r"^decontaminate: evaluation set 'broken': .*/bad\.jsonl, line 2: no"
                                            r" 'text' field \(fields: 'question'\)\n"):
        decontaminate(str(tmp_path / "out1"), planted.normalized, {**eval_sets, "broken": [str(bad)]})

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(CurationError, match=r"^decontaminate: evaluation set 'nothing' has no records \(1 files: "
                                            r".*/empty\.jsonl\); an empty evaluation set decontaminates nothing\n"):
        decontaminate(str(tmp_path / "out2"), planted.normalized, {**eval_sets, "nothing": [str(empty)]})

    qa = {"stdlib-qa": eval_sets["stdlib-qa"]}
    decontaminate(str(tmp_path / "out4"), planted.normalized, qa)
    with pytest.raises(CurationError, match=r"^decontaminate: .*/out4 holds an evaluation index built from other"
                                            r" evaluation sets or n-gram size"):
        decontaminate(str(tmp_path / "out4"), planted.normalized, qa, ngram=8)

    data = tmp_path / "data"
    shutil.copytree(planted.normalized, data, ignore=shutil.ignore_patterns("_work"))
    corrupt = list_shards("test", str(data))[3].path
    Path(corrupt).write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CurationError, match=rf"^decontaminate: shard {re.escape(corrupt)} is unreadable: "):
        decontaminate(str(tmp_path / "out3"), str(data), eval_sets)


def _copy(source: str, output_path: str) -> None:
    shutil.copytree(source, output_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_work"))


def test_the_step_through_the_protocol_records_its_counts_and_passes_its_check(planted, prefix):
    data = Step(name="curated/planted-copy", fn=functools.partial(_copy, planted.normalized),
                hash_attrs={"from": planted.normalized})
    sets = [EvalSet(name, planted.step, (f"evalsets/{name}.jsonl",)) for name in planted.truth.eval_sets]
    step = decontaminate_step("curated/planted-decontaminated", data, sets, mode="remove_document")
    materialize_step(data, prefix=prefix, settings=FAST)
    outcome = materialize_step(step, prefix=prefix, settings=FAST)
    record = read_record(outcome.output_path)
    contaminated = len(planted.truth.contaminated)
    assert record.result["documents_in"] - record.result["documents_out"] == contaminated
    assert sum(h["documents"] for h in record.result["hits"].values()) == contaminated
    typed = load_result(outcome.output_path, DecontaminationResult)
    assert typed.contamination_path == f"{outcome.output_path}/{CONTAMINATION_DIR}" and typed.mode == "remove_document"
    assert {row["id"] for row in side_rows(outcome.output_path)} == {c.id for c in planted.truth.contaminated}
    check = run_check(step.checks[0], outcome.output_path, record.result)
    assert check.passed and f"of {record.result['documents_in']} documents" in check.message
    strict = decontaminate_step("curated/planted-decontaminated", data, sets, max_removed_fraction=0.01)
    assert not run_check(strict.checks[0], outcome.output_path, record.result).passed
