"""decontaminate on the planted corpus: every planted evaluation paragraph found and traced to its record, near
misses and clean documents untouched; the three modes; exact confirmation of Bloom hits; the threshold; the same
output fanned out and after a kill; bad input; identity; the step through the protocol. Re-wrapped text:
evaluation paragraphs hard-wrapped into short lines (widths, trailing spaces, CRLF) caught line by line through
Dagster where the old path saw only lines of 13 words or more; the old output where nothing is re-wrapped; and on
real documentation contaminated as it is written (hard-wrapped docstrings), exactly the lines an independent
reference of the rule removes, none without evaluation text."""

import functools
import gzip
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from marin_assets import Step, StepDefinitionError, build_definitions, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.pipeline.curation import eval_index
from marin_assets.pipeline.curation.decontaminate import (
    ACROSS,
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
from marin_assets.pipeline.curation.normalize import normalize, normalize_step
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
               step(across_paragraphs=False),
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
    with pytest.raises(StepDefinitionError, match=r"across_paragraphs must be True or False, got 'yes'"):
        step(across_paragraphs="yes")
    # re-wrapped text is caught by default (a new output, a new identity); off, the identity is the one from
    # before the option, whose output it still makes (test_without_rewrapping_the_output_is_the_old_one)
    assert base.hash_attrs["across_paragraphs"] == ACROSS
    assert "across_paragraphs" not in step(across_paragraphs=False).hash_attrs


def test_two_workers_on_ray_give_the_same_output(planted, decontaminated, local_ray, tmp_path):
    out, result = decontaminated
    fanned = str(tmp_path / "fanned")
    assert same_result(decontaminate(fanned, planted.normalized, eval_sets_of(planted), workers=2), result)
    assert contents(fanned) == contents(out)
    assert list(Path(fanned, "_work", "shards").glob("*.claim")), "the shards went through Ray's fan-out claims"


HANG_AFTER_FIRST_SHARD = """
import threading
from marin_assets.pipeline.curation import decontaminate as dc
decide = dc.Decontaminate.decide
def slow(self, table, shard):
    if shard.key != {first!r}:
        threading.Event().wait()  # a worker stuck on the second shard until the kill lands there
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


# --- re-wrapped text -------------------------------------------------------------------------------------------

WORD = re.compile(r"[a-z0-9\u0080-\U0010ffff]+")
"""A word as `ngrams` counts one, on lowercased text."""
WRAPS = {  # name: (width, line end, trailing spaces)
    "width-20": (20, "\n", ""), "width-40": (40, "\n", ""), "width-60": (60, "\n", ""), "width-80": (80, "\n", ""),
    "width-100": (100, "\n", ""), "trailing-spaces": (50, "\n", "  "), "crlf": (60, "\r\n", ""),
    "crlf-trailing-spaces": (30, "\r\n", " "),
}


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def rewrapped_corpus(planted) -> tuple[list[str], list[tuple[str, str, int, set[int]]]]:
    """Real documentation (the planted corpus' clean base documents, blank-line paragraphs of hard-wrapped lines)
    carrying planted evaluation records re-wrapped each way of `WRAPS`: once between two paragraphs, once as the
    last; and clean documents. The texts, and per carrier (text, set, record line, positions of the record's lines
    in `text.split("\n")`)."""
    truth = planted.truth
    base = {row["id"]: row["text"] for row in documents(planted.normalized)}
    carriers = [base[i] for i in truth.base_ids if base[i].count("\n\n") >= 2][:2 * len(WRAPS) + 8]
    texts, planted_in = [], []
    for k, (width, end, trailing) in enumerate(v for v in WRAPS.values() for _ in range(2)):
        name = sorted(truth.eval_sets)[(k + k // 2) % 2]  # each set in both places
        line = 1 + (7 * k) % 40
        record = [row + trailing for row in textwrap.wrap(eval_record(truth.eval_sets[name], line), width,
                                                          break_long_words=False, break_on_hyphens=False)]
        paragraphs = [p.split("\n") for p in carriers[k].split("\n\n")]
        cut = 1 if k % 2 == 0 else len(paragraphs)  # between the first two paragraphs, or the last
        lines = [row for p in paragraphs[:cut] for row in [*p, ""]] + record
        lines += [row for p in paragraphs[cut:] for row in ["", *p]]
        start = sum(len(p) + 1 for p in paragraphs[:cut])
        text = end.join(lines)
        texts.append(text)
        planted_in.append((text, name, line, set(range(start, start + len(record)))))
    return texts + carriers[2 * len(WRAPS):], planted_in


def _write_raw(texts: list[str], output_path: str) -> None:
    folder = Path(output_path, "train")
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "part-00000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in texts)


def test_rewrapped_evaluation_paragraphs_are_caught_line_by_line_through_dagster(planted, tmp_path, prefix,
                                                                                 local_ray, dagster_home):
    texts, carriers = rewrapped_corpus(planted)
    raw = Step(name="raw/rewrapped", fn=functools.partial(_write_raw, texts), hash_attrs={"texts": len(texts)})
    data = normalize_step("curated/rewrapped", raw, target_shard_bytes=20_000)
    sets = [EvalSet(name, planted.step, (f"evalsets/{name}.jsonl",)) for name in planted.truth.eval_sets]
    step = decontaminate_step("curated/rewrapped-decontaminated", data, sets)
    result = build_definitions([step]).resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.get())
    assert result.success
    metadata = {e.asset_key.to_user_string(): e for e in result.get_asset_materialization_events()}[step.name]
    assert sorted(r.data["name"] for r in metadata.materialization.metadata["result.removed"].records) == sorted(
        planted.truth.eval_sets)
    old = str(tmp_path / "old")
    decontaminate(old, data.output_path, eval_sets_of(planted), across_paragraphs=False)

    new_after = {row["id"]: row["text"] for row in documents(step.output_path)}
    old_after = {row["id"]: row["text"] for row in documents(old)}
    ids = {row["text"]: row["id"] for row in documents(data.output_path)}
    side = {(row["id"], row["paragraph"]): row for row in side_rows(step.output_path)}
    caught: dict[str, list[int]] = {name: [0, 0, 0] for name in WRAPS}  # lines with a word; caught before, now
    expected_side = set()
    short_lines = 0
    for (text, name, line, positions), wrap in zip(carriers, [w for w in WRAPS for _ in range(2)], strict=True):
        parts = text.split("\n")
        record = [j for j in sorted(positions) if words(parts[j])]  # a line of punctuation only has nothing to judge
        long = [j for j in record if len(words(parts[j])) >= 13]
        short_lines += len(record) - len(long)
        # now: every line of the record goes, nothing else (the blank lines around it stay)
        assert new_after[ids[text]] == "\n".join(p for j, p in enumerate(parts) if j not in record), wrap
        # before: only the lines of 13 words or more, which hold n-grams of their own
        assert old_after[ids[text]] == "\n".join(p for j, p in enumerate(parts) if j not in long), wrap
        caught[wrap] = [caught[wrap][0] + len(record), caught[wrap][1] + len(long), caught[wrap][2] + len(record)]
        for j in record:
            row = side[(ids[text], j)]
            assert (row["eval_set"], row["eval_record"], row["overlap"]) == (name, line, 1.0)
            expected_side.add((ids[text], j))
    assert set(side) == expected_side, "nothing else is listed"
    clean = texts[len(carriers):]
    assert clean and all(new_after[ids[t]] == t == old_after[ids[t]] for t in clean)
    assert sum(c[1] for c in caught.values()) < sum(c[0] for c in caught.values()) // 4
    assert caught["width-20"][1] == caught["width-40"][1] == 0 < caught["width-20"][0]
    recorded = load_result(step.output_path, DecontaminationResult)
    assert recorded.across_paragraphs and recorded.counters["paragraphs_across"] == short_lines
    assert {name: (r.documents, r.modified) for name, r in recorded.removed.items()} == {
        name: (0, len(carriers) // 2) for name in planted.truth.eval_sets}
    print("\nre-wrapped evaluation paragraphs, lines caught (before → now): " + ", ".join(
        f"{name} {before}→{now}/{total}" for name, (total, before, now) in caught.items()))


def test_without_rewrapping_the_output_is_the_old_one(planted, decontaminated, tmp_path):
    """The planted corpus holds its evaluation paragraphs one per line (no re-wrapping): the default and the old
    path (`across_paragraphs=False`) write the same documents and side index and count the same."""
    out, result = decontaminated
    old = str(tmp_path / "old")
    before = decontaminate(old, planted.normalized, eval_sets_of(planted), across_paragraphs=False)
    assert contents(old) == contents(out)
    counters = dict(result.counters)
    assert counters.pop("paragraphs_across") == 0 and counters.pop("ngrams_across") > 0
    assert same_result(before, DecontaminationResult(**{**result.__dict__, "counters": counters,
                                                        "across_paragraphs": False}))
    assert result.across_paragraphs and not before.across_paragraphs


def reference_removals(text: str, grams: set[tuple[str, ...]], whole: set[tuple[str, ...]], n: int = 13,
                       threshold: float = 0.5) -> list[int]:
    """The rule, written out slowly in Python: the lines (by position) the default removes. A line of n words or
    more: at least `threshold` of its own n-grams are an evaluation set's; a shorter one: it is an evaluation
    record whole, or at least `threshold` of its words lie inside evaluation n-grams of the document's word
    stream (n-grams across line breaks)."""
    lines = [words(p) for p in text.split("\n")]
    stream = [w for line in lines for w in line]
    inside = [False] * len(stream)
    for i in range(len(stream) - n + 1):
        if tuple(stream[i:i + n]) in grams:
            inside[i:i + n] = [True] * n
    if 0 < len(stream) < n and tuple(stream) in whole:
        inside = [True] * len(stream)
    removed, at = [], 0
    for j, line in enumerate(lines):
        own = [tuple(line[i:i + n]) in grams for i in range(len(line) - n + 1)]
        if own:
            hit = sum(own) / len(own) >= threshold
        else:
            covered = sum(inside[at:at + len(line)]) / max(len(line), 1)
            hit = bool(line) and (tuple(line) in whole or (covered > 0 and covered >= threshold))
        if hit:
            removed.append(j)
        at += len(line)
    return removed


def test_on_real_documentation_exactly_the_contaminated_lines_go(planted, tmp_path):
    """Contamination as real text holds it: 40 paragraphs of the documentation, hard-wrapped as written, are the
    evaluation set, and the planted corpus (those documents, their copies, and the rest) is decontaminated. What
    goes is exactly what the reference of the rule says, every line of every paragraph in its document, and no
    line without a word of evaluation text; the old path saw only the few lines of 13 words or more."""
    truth = planted.truth
    rows = documents(planted.normalized)
    base = {row["id"]: row["text"] for row in rows}
    wrapped = [[p for p in base[i].split("\n\n") if len(words(p)) >= 25 and "\n" in p.strip()]
               for i in truth.base_ids[::5]]
    chosen = [paragraphs[0] for paragraphs in wrapped if paragraphs]
    assert len(chosen) == 40
    path = tmp_path / "real.jsonl"
    path.write_text("".join(json.dumps({"text": p}) + "\n" for p in chosen))
    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    decontaminate(new, planted.normalized, {"real": [str(path)]})
    decontaminate(old, planted.normalized, {"real": [str(path)]}, across_paragraphs=False)
    new_after = {row["id"]: row["text"] for row in documents(new)}
    old_after = {row["id"]: row["text"] for row in documents(old)}

    records = [words(p) for p in chosen]
    grams = {tuple(r[i:i + 13]) for r in records for i in range(len(r) - 12)}
    lines_removed = words_removed = outside = 0
    for row in rows:
        parts = row["text"].split("\n")
        gone = reference_removals(row["text"], grams, set())
        assert new_after[row["id"]] == "\n".join(p for j, p in enumerate(parts) if j not in gone), row["id"]
        stream = words(row["text"])
        inside = [False] * len(stream)
        for i in range(len(stream) - 12):
            if tuple(stream[i:i + 13]) in grams:
                inside[i:i + 13] = [True] * 13
        at = 0
        for j, p in enumerate(parts):
            n = len(words(p))
            if j in gone:
                assert any(inside[at:at + n]), f"{row['id']} line {j} holds no evaluation text: {p!r}"
                lines_removed += 1
                words_removed += n
                outside += n - sum(inside[at:at + n])
            at += n
    expected = caught_before = caught_now = 0
    for p in chosen:
        for row in rows:
            if p in row["text"]:
                lines = [q for q in p.split("\n") if words(q)]
                expected += len(lines)
                caught_now += sum(q not in new_after[row["id"]].split("\n") for q in lines)
                caught_before += sum(q not in old_after[row["id"]].split("\n") for q in lines)
    assert caught_now == expected > 300
    assert caught_before < expected // 10
    assert outside <= words_removed // 50, "the lines that go are evaluation text, a few words at their edges aside"
    print(f"\nreal documentation, 40 hard-wrapped paragraphs: lines of them caught {caught_before}/{expected} before,"
          f" {caught_now}/{expected} now; removed {lines_removed} lines, {words_removed} words, {outside} of them"
          f" outside evaluation n-grams (partly copied lines)")


def test_a_short_line_goes_when_half_its_words_lie_in_evaluation_ngrams(planted, tmp_path):
    """The rule at its edges: a line whose words are mostly inside evaluation n-grams across its breaks goes, one
    mostly of its own stays; a short document wrapped over lines is matched whole against a short record; a line
    of punctuation only stays; long lines are judged on their own n-grams as before."""
    record = eval_record(planted.truth.eval_sets["stdlib-qa"], 3)
    r = record.split()
    assert len(words(" ".join(r[:20]))) == 20, "the premise: the record's first 20 tokens are one word each"
    short = "What is the capital city of France"
    evals = tmp_path / "evals.jsonl"
    evals.write_text(json.dumps({"text": record}) + "\n" + json.dumps({"text": short}) + "\n")
    own = "alpha bravo charlie delta"
    texts = [
        f"An opening line of its own.\n{own[:-6]} {' '.join(r[:4])}\n{' '.join(r[4:11])}\n{' '.join(r[11:20])}\n--",
        f"An opening line of its own.\n{own} {' '.join(r[:3])}\n{' '.join(r[3:11])}\n{' '.join(r[11:20])}",
        "What is the capital\ncity of France?",
        "Q: What is the capital\ncity of France?",
    ]
    raw = tmp_path / "raw" / "train"
    raw.mkdir(parents=True)
    (raw / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    data = str(tmp_path / "data")
    normalize(data, str(tmp_path / "raw"))
    out = str(tmp_path / "out")
    result = decontaminate(out, data, {"qa": [str(evals)]})
    after = {row["text"] for row in documents(out)}
    # 3 own words + 4 of the record (4/7 inside): goes; 4 own + 3 of the record (3/7): stays; "--": stays
    assert "An opening line of its own.\n--" in after
    assert f"An opening line of its own.\n{own} {' '.join(r[:3])}" in after
    assert texts[3] in after and texts[2] not in after, "the short document, matched whole, is removed"
    assert result.documents_out == 3 and result.removed["qa"].documents == 1
    assert result.counters["paragraphs_across"] == 3 + 2 + 2


def test_blank_line_paragraphs_would_miss_glued_paragraphs_and_take_their_neighbours(planted, tmp_path):
    """Why lines stay the unit: with paragraphs between blank lines (the other way to see across line breaks),
    an evaluation paragraph glued to its carrier's last paragraph (one line break, as the planted ones are) is
    judged with the carrier's text: most are missed, and those caught take carrier text with them. The default
    catches every one and keeps every carrier's own text (test_remove_paragraph_keeps_the_carriers_own_text)."""
    out = str(tmp_path / "blank-lines")
    decontaminate(out, planted.normalized, eval_sets_of(planted), paragraph_separator="\n\n",
                  across_paragraphs=False)
    after = {row["id"]: row["text"] for row in documents(out)}
    before = {row["id"]: row["text"] for row in documents(planted.normalized)}
    caught = taken = 0
    for c in planted.truth.contaminated:
        record = eval_record(planted.truth.eval_sets[c.eval_set], c.eval_record)
        if record not in after[c.id]:
            caught += 1
            taken += len(before[c.id]) - len(record) - 1 - len(after[c.id])
    assert caught < len(planted.truth.contaminated) // 2 and taken > 0
    print(f"\nblank-line paragraphs: caught {caught}/{len(planted.truth.contaminated)} planted evaluation paragraphs,"
          f" taking {taken} characters of their carriers with them")
