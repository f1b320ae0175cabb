"""Preference data: an `ultrafeedback_binarized`-layout parquet dataset and `{prompt, chosen, rejected}` JSON lines
into one preference format — whole conversations, stable hashes, duplicates and ties dropped and counted, splits
chosen by name or glob; bad rows named by file and row; a failed run leaves nothing; the step through the
protocol."""

import functools
import gzip
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_assets import StepDefinitionError, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status
from marin_assets.pipeline.data.preference import (
    FORMAT,
    MANIFEST,
    PreferenceData,
    PreferenceSplit,
    preference_data,
    preference_data_step,
)
from marin_assets.pipeline.data.readers import DatasetError
from tests.support.chat import SYSTEM, doc_answers
from tests.support.helpers import FAST, output_files


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


Q_JSON = "What does json.dumps do?"
A_JSON = "It serializes obj to a JSON formatted str, using the conversion table of the json module."
W_JSON = "It parses a JSON document from a str and returns the Python object it describes."
Q_WRAP = "How do I wrap a paragraph to 40 columns?"
A_WRAP = "Use textwrap.wrap(text, width=40): it returns a list of lines, each at most 40 characters long."
Q_FILL = "And as one string?"
A_FILL = "textwrap.fill(text, width=40) returns the wrapped lines joined with newlines."
W_FILL = "Call str.center(40) on the paragraph; it pads the text to 40 columns."
Q_HEAP = "Which function pushes onto a heap and pops the smallest item in one step?"
A_HEAP = "heapq.heappushpop(heap, item): it is more efficient than heappush followed by heappop."
W_HEAP = "heapq.heapify(x): it transforms the list into a heap, in place, in linear time."
Q_BISECT = "How do I find where to insert 5 into a sorted list?"
A_BISECT = "bisect.bisect_left(a, 5) returns the insertion point that keeps the list sorted."
W_BISECT = "sorted(a + [5]) gives the position, since sorting always keeps the original order."

WRAP_PROMPT = [system(SYSTEM), user(Q_WRAP), assistant(A_WRAP), user(Q_FILL)]


def uf_row(prompt, chosen, rejected, scores=(8.0, 3.0)):
    """A row as `HuggingFaceH4/ultrafeedback_binarized` has it."""
    return {"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(), "chosen": chosen,
            "rejected": rejected, "messages": chosen, "score_chosen": scores[0], "score_rejected": scores[1]}


TRAIN_PREFS = [
    uf_row(Q_JSON, [user(Q_JSON), assistant(A_JSON)], [user(Q_JSON), assistant(W_JSON)]),
    uf_row(Q_WRAP, WRAP_PROMPT + [assistant(A_FILL)], WRAP_PROMPT + [assistant(W_FILL)]),
    uf_row(Q_HEAP, [user(Q_HEAP), assistant(A_HEAP)], [user(Q_HEAP), assistant(A_HEAP)], (7.0, 7.0)),  # a tie
    uf_row(Q_JSON, [user(Q_JSON), assistant(A_JSON)], [user(Q_JSON), assistant(W_JSON)]),  # row 1 again
    uf_row(Q_BISECT, [user(Q_BISECT), assistant(A_BISECT)], [user(Q_BISECT), assistant(W_BISECT)]),
]
TEST_PREFS = [
    uf_row(Q_HEAP, [user(Q_HEAP), assistant(A_HEAP)], [user(Q_HEAP), assistant(W_HEAP)]),
    uf_row(Q_BISECT, [user(Q_BISECT), assistant(A_BISECT)], [user(Q_BISECT), assistant(W_BISECT)]),
]
TRAIN_SFT = [uf_row(Q_WRAP, WRAP_PROMPT + [assistant(A_FILL)], WRAP_PROMPT + [assistant(W_FILL)])]

MESSAGES = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
SCHEMA = pa.schema([("prompt", pa.string()), ("prompt_id", pa.string()), ("chosen", MESSAGES),
                    ("rejected", MESSAGES), ("messages", MESSAGES), ("score_chosen", pa.float64()),
                    ("score_rejected", pa.float64())])


def write_parquet(path: Path, rows, schema=SCHEMA):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def ultrafeedback(root: Path) -> Path:
    """The dataset's layout: `data/{split}-00000-of-00001.parquet`, and a README beside it."""
    for split, rows in [("train_prefs", TRAIN_PREFS), ("test_prefs", TEST_PREFS), ("train_sft", TRAIN_SFT)]:
        write_parquet(root / "data" / f"{split}-00000-of-00001.parquet", rows)
    (root / "README.md").write_text("---\nlicense: mit\n---\n")
    return root


def write_jsonl(path: Path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def pair(chosen, rejected):
    """The row the format holds, its hash computed here from the format's definition."""
    canonical = json.dumps({"chosen": chosen, "rejected": rejected}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return {"chosen": chosen, "rejected": rejected, "hash": hashlib.sha256(canonical.encode()).hexdigest()}


def read_split(out, split) -> list[dict]:
    rows: list[dict] = []
    for shard in sorted((Path(out) / split).iterdir()):
        with gzip.open(shard, "rt", encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f)
    return rows


@pytest.fixture
def uf(tmp_path):
    return ultrafeedback(tmp_path / "ultrafeedback_binarized")


def test_the_ultrafeedback_layout_becomes_whole_conversations_with_duplicates_and_ties_dropped(uf, tmp_path):
    out = tmp_path / "prefs"
    result = preference_data(str(out), str(uf), splits=["train_prefs", "test_prefs"])

    expected_train = [
        pair([user(Q_JSON), assistant(A_JSON)], [user(Q_JSON), assistant(W_JSON)]),
        pair(WRAP_PROMPT + [assistant(A_FILL)], WRAP_PROMPT + [assistant(W_FILL)]),
        pair([user(Q_BISECT), assistant(A_BISECT)], [user(Q_BISECT), assistant(W_BISECT)]),
    ]
    expected_test = [pair([user(Q_HEAP), assistant(A_HEAP)], [user(Q_HEAP), assistant(W_HEAP)]),
                     pair([user(Q_BISECT), assistant(A_BISECT)], [user(Q_BISECT), assistant(W_BISECT)])]
    assert read_split(out, "train_prefs") == expected_train
    assert read_split(out, "test_prefs") == expected_test
    assert sorted(output_files(out)) == ["test_prefs/shard-00000.jsonl.gz", "train_prefs/shard-00000.jsonl.gz"]

    def sha(rows):
        return hashlib.sha256(b"".join((json.dumps(r, ensure_ascii=False) + "\n").encode() for r in rows)).hexdigest()

    assert result == PreferenceData(
        str(out), str(uf),
        {"train_prefs": PreferenceSplit(3, 5, 1, 1, ["data/train_prefs-00000-of-00001.parquet"],
                                        ["train_prefs/shard-00000.jsonl.gz"], sha(expected_train)),
         "test_prefs": PreferenceSplit(2, 2, 0, 0, ["data/test_prefs-00000-of-00001.parquet"],
                                       ["test_prefs/shard-00000.jsonl.gz"], sha(expected_test))},
        pairs=5, dropped=2, format=FORMAT)


def test_outputs_and_hashes_are_the_same_on_every_run_and_a_finished_output_is_left_alone(uf, tmp_path):
    first = preference_data(str(tmp_path / "a"), str(uf))
    second = preference_data(str(tmp_path / "b"), str(uf))
    assert list(first.splits) == ["test_prefs", "train_prefs", "train_sft"]  # None: every split the layout holds
    assert output_files(tmp_path / "a") == output_files(tmp_path / "b")  # byte for byte, gzip headers included
    assert {s: r.sha256 for s, r in first.splits.items()} == {s: r.sha256 for s, r in second.splits.items()}
    # One pair, one hash, in whichever split it is: the bisect pair of train_prefs and test_prefs.
    assert read_split(tmp_path / "a", "train_prefs")[2]["hash"] == read_split(tmp_path / "a", "test_prefs")[1]["hash"]

    shard = tmp_path / "a" / "train_prefs" / "shard-00000.jsonl.gz"
    before = (shard.stat().st_mtime_ns, (tmp_path / "a" / MANIFEST).stat().st_mtime_ns)
    again = preference_data(str(tmp_path / "a"), str(uf))
    assert again == first
    assert (shard.stat().st_mtime_ns, (tmp_path / "a" / MANIFEST).stat().st_mtime_ns) == before

    (uf / "data" / "test_prefs-00001-of-00001.parquet").write_bytes(
        (uf / "data" / "test_prefs-00000-of-00001.parquet").read_bytes())
    with pytest.raises(DatasetError, match=r"holds preference data made from other input files or settings \(files:"):
        preference_data(str(tmp_path / "a"), str(uf))


def test_json_lines_with_answers_as_text_or_messages_and_shards_of_real_text(tmp_path):
    answers = doc_answers()
    assert len(answers) >= 40
    rows, expected = [], []
    for i, (name, doc) in enumerate(answers[:40]):
        wrong = answers[(i + 7) % len(answers)][1]  # another function's docstring: plausible, and wrong
        question = f"What does {name} do?"
        if i % 3 == 0:
            rows.append({"prompt": question, "chosen": doc, "rejected": wrong})
        elif i % 3 == 1:
            rows.append({"prompt": question, "chosen": [assistant(doc)], "rejected": [assistant(wrong)]})
        else:
            rows.append({"chosen": [system(SYSTEM), user(question), assistant(doc)],
                         "rejected": [system(SYSTEM), user(question), assistant(wrong)], "prompt": question})
        asked = [system(SYSTEM), user(question)] if i % 3 == 2 else [user(question)]
        expected.append(pair(asked + [assistant(doc)], asked + [assistant(wrong)]))
    rows.insert(5, "")  # a blank line is no row
    rows.append(rows[0])  # a duplicate, as text
    write_jsonl(tmp_path / "docs" / "train.jsonl", rows)
    write_jsonl(tmp_path / "docs" / "validation.jsonl", [rows[1]])

    out = tmp_path / "out"
    result = preference_data(str(out), str(tmp_path / "docs"), rows_per_shard=16)
    assert read_split(out, "train") == expected
    assert read_split(out, "validation") == [expected[1]]
    assert result.splits["train"] == PreferenceSplit(
        40, 41, 1, 0, ["train.jsonl"], [f"train/shard-{i:05d}.jsonl.gz" for i in range(3)],
        result.splits["train"].sha256)
    assert [len(read_split_shard(out / s)) for s in result.splits["train"].shards] == [16, 16, 8]

    globbed = preference_data(str(tmp_path / "globbed"), str(tmp_path / "docs"), splits={"dev": ["val*.jsonl"]})
    assert list(globbed.splits) == ["dev"] and read_split(tmp_path / "globbed", "dev") == [expected[1]]


def read_split_shard(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


GOOD = {"prompt": Q_JSON, "chosen": A_JSON, "rejected": W_JSON}

BAD_ROWS = [
    ({"prompt": "q", "chosen": "a"}, "no 'rejected' field (fields: 'prompt', 'chosen')"),
    ({"prompt": "q", "chosen": "a", "rejected": None}, "'rejected' is null"),
    ({"prompt": "q", "chosen": 3, "rejected": "b"}, "'chosen' is a number, not text or a list of turns"),
    ({"prompt": "q", "chosen": "a", "rejected": {"text": "b"}}, "'rejected' is an object, not text or a list of turns"),
    ({"prompt": 7, "chosen": "a", "rejected": "b"}, "'prompt' is a number, not text or a list of turns"),
    ({"prompt": "q", "chosen": ["a"], "rejected": "b"},
     "'chosen' turn 1 is a string, not an object with 'role' and 'content'"),
    ({"prompt": "q", "chosen": [user("q"), {"role": "bot", "content": "a"}], "rejected": "b"},
     "'chosen' turn 2 has role 'bot', not one of 'system', 'user', 'assistant'"),
    ({"prompt": "q", "chosen": "a", "rejected": [user("q"), {"content": "b"}]},
     "'rejected' turn 2 has no 'role' (keys: 'content')"),
    ({"prompt": "q", "chosen": [user("q"), {"role": "assistant", "content": ["a"]}], "rejected": "b"},
     "'chosen' turn 2 (assistant) has 'content' an array, not text"),
    ({"prompt": "q", "chosen": "a", "rejected": "  \n"}, "'rejected' is empty"),
    ({"prompt": "q", "chosen": [user("q"), assistant(" ")], "rejected": "b"}, "'chosen' turn 2 (assistant) is empty"),
    ({"prompt": "", "chosen": "a", "rejected": "b"}, "'prompt' is empty"),
    ({"prompt": "q", "chosen": [], "rejected": "b"}, "'chosen' has no turns"),
    ({"chosen": "a", "rejected": "b"}, "'chosen' is only an answer, and there is no 'prompt' it answers"),
    ({"chosen": [user("q"), assistant("a")], "rejected": [user("another q"), assistant("b")]},
     "'chosen' and 'rejected' have different prompts (turn 1, user, differs)"),
    ({"chosen": [user("q"), assistant("a")], "rejected": [system("s"), user("q"), assistant("b")]},
     "'chosen' and 'rejected' have different prompts (turn 1, user, differs)"),
    ({"chosen": [user("q"), assistant("a"), user("more?"), assistant("c")], "rejected": [user("q"), assistant("b")]},
     "'chosen' and 'rejected' have different prompts (3 turns before the answer in 'chosen', 1 in 'rejected')"),
    ({"prompt": "q", "chosen": [user("q"), assistant("a"), user("and?")], "rejected": "b"},
     "'chosen' ends with a user turn, not the assistant's answer"),
    ({"prompt": "q", "chosen": [user("other"), assistant("a")], "rejected": "b"},
     "'prompt' is not the question of 'chosen' (its first user turn differs)"),
    ({"prompt": [user("q"), assistant("a")], "chosen": "a", "rejected": "b"},
     "'prompt' ends with an assistant turn; the answers are 'chosen' and 'rejected'"),
    ({"prompt": [system("s"), user("q")], "chosen": [user("q"), assistant("a")], "rejected": "b"},
     "'prompt' is not how 'chosen' begins ('chosen' turn 1 differs)"),
    ("[1, 2]", "a JSON array, not an object (JSON lines hold one object per line)"),
]


@pytest.mark.parametrize(("row", "problem"), BAD_ROWS, ids=[p.split(" (")[0][:48] for _, p in BAD_ROWS])
def test_a_bad_json_line_is_an_error_naming_the_file_the_line_and_the_problem(tmp_path, row, problem):
    file = write_jsonl(tmp_path / "data" / "train.jsonl", [GOOD, "", row])
    with pytest.raises(DatasetError) as error:
        preference_data(str(tmp_path / "out"), str(tmp_path / "data"))
    assert str(error.value) == f"{file}, line 3: {problem}"
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_a_bad_parquet_row_and_a_missing_column_name_the_file_and_the_row(tmp_path):
    rows = [TRAIN_PREFS[0], TRAIN_PREFS[1],
            uf_row(Q_HEAP, [user(Q_HEAP), assistant(A_HEAP)], [user(Q_HEAP), {"role": "gpt", "content": W_HEAP}])]
    file = tmp_path / "bad" / "data" / "train_prefs-00000-of-00001.parquet"
    write_parquet(file, rows)
    with pytest.raises(DatasetError) as error:
        preference_data(str(tmp_path / "out"), str(tmp_path / "bad"))
    assert str(error.value) == (f"{file}, row 3: 'rejected' turn 2 has role 'gpt', not one of 'system', 'user',"
                                " 'assistant'")

    narrow = tmp_path / "narrow" / "data" / "train_prefs-00000-of-00001.parquet"
    write_parquet(narrow, [{"prompt": Q_JSON, "chosen": [user(Q_JSON), assistant(A_JSON)]}],
                  pa.schema([("prompt", pa.string()), ("chosen", MESSAGES)]))
    with pytest.raises(DatasetError) as error:
        preference_data(str(tmp_path / "out"), str(tmp_path / "narrow"))
    assert str(error.value) == f"{narrow}, row 1: no 'rejected' field (fields: 'prompt', 'chosen')"


def test_splits_are_chosen_by_name_and_empty_or_unknown_ones_are_errors(uf, tmp_path):
    with pytest.raises(DatasetError, match=re.escape(f"{uf}: no split 'train' (it holds: test_prefs, train_prefs,"
                                                     " train_sft)")):
        preference_data(str(tmp_path / "a"), str(uf), splits=["train", "test_prefs"])
    with pytest.raises(ValueError, match=r"splits='train_prefs' is one name: give a list \(\['train_prefs'\]\)"):
        preference_data(str(tmp_path / "a"), str(uf), splits="train_prefs")

    write_jsonl(tmp_path / "ties" / "train.jsonl", [{"prompt": "q", "chosen": "same", "rejected": "same"}])
    with pytest.raises(DatasetError, match=r"split 'train' of .*/ties: none of its 1 rows is a preference \(1 with"
                                           r" chosen the same as rejected, 0 duplicates\)$"):
        preference_data(str(tmp_path / "b"), str(tmp_path / "ties"))
    write_jsonl(tmp_path / "blank" / "train.jsonl", ["", ""])
    with pytest.raises(DatasetError, match=r"split 'train' of .*/blank has no rows \(1 files\)$"):
        preference_data(str(tmp_path / "c"), str(tmp_path / "blank"))


def test_a_run_that_fails_in_its_last_split_leaves_nothing_and_a_killed_one_is_cleaned_up(uf, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(uf, data)
    bad = data / "data" / "test_prefs-00000-of-00001.parquet"
    write_parquet(bad, [TEST_PREFS[0], uf_row("", [user(Q_HEAP), assistant(A_HEAP)], [user(Q_HEAP)])])
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=re.escape(f"{bad}, row 2: 'prompt' is empty")):
        preference_data(str(out), str(data), splits=["train_prefs", "test_prefs"])  # train_prefs was written first
    assert os.listdir(out) == []

    (out / ".preference-tmp-0badc0de" / "train_prefs").mkdir(parents=True)  # a killed attempt's leftovers
    (out / ".preference-tmp-0badc0de" / "train_prefs" / "shard-00000.jsonl.gz").write_bytes(b"half")
    (out / "train_prefs").mkdir()
    (out / "train_prefs" / "shard-00009.jsonl.gz").write_bytes(b"moved before the kill")
    write_parquet(bad, TEST_PREFS)
    result = preference_data(str(out), str(data), splits=["train_prefs", "test_prefs"])
    assert sorted(os.listdir(out)) == [MANIFEST, "test_prefs", "train_prefs"]
    assert sorted(output_files(out)) == ["test_prefs/shard-00000.jsonl.gz", "train_prefs/shard-00000.jsonl.gz"]
    assert result.pairs == 5


def _copy(source: str, output_path: str) -> None:
    shutil.copytree(source, output_path, dirs_exist_ok=True)


def test_the_step_materializes_through_the_protocol_and_its_check_reads_the_output(uf, prefix):
    dataset = Step(name="raw/ultrafeedback-mini", fn=functools.partial(_copy, str(uf)), hash_attrs={"from": str(uf)})
    step = preference_data_step("prefs/ultrafeedback-mini", dataset, splits=["train_prefs", "test_prefs"])
    assert step.kind == "transform" and list(step.deps) == [dataset]
    assert dict(step.hash_attrs) == {"splits": ["train_prefs", "test_prefs"], "text_format": "auto",
                                     "rows_per_shard": 10_000, "format": FORMAT}
    assert preference_data_step("prefs/ultrafeedback-mini", dataset).hash != step.hash
    assert "Preference pairs from a dataset's splits" in (step.description or "")

    materialize_step(dataset, prefix=prefix, settings=FAST)
    outcome = materialize_step(step, prefix=prefix, settings=FAST)
    assert not outcome.cached and read_status(outcome.output_path).status is Status.SUCCESS
    typed = load_result(outcome.output_path, PreferenceData)
    assert typed.path == outcome.output_path and typed.pairs == 5 and sorted(typed.splits) == ["test_prefs",
                                                                                                "train_prefs"]
    assert read_split(outcome.output_path, "train_prefs")[0] == pair([user(Q_JSON), assistant(A_JSON)],
                                                                    [user(Q_JSON), assistant(W_JSON)])
    record = read_record(outcome.output_path)
    check = run_check(step.checks[0], outcome.output_path, record.result)
    assert check.passed and check.message == "test_prefs: 2 pairs (0 dropped), train_prefs: 3 pairs (2 dropped)"
    assert check.metadata == {"test_prefs_pairs": 2, "train_prefs_pairs": 3}
    assert materialize_step(step, prefix=prefix, settings=FAST).cached

    os.remove(Path(outcome.output_path) / "test_prefs" / "shard-00000.jsonl.gz")
    broken = run_check(step.checks[0], outcome.output_path, record.result)
    assert not broken.passed and broken.message.endswith("; 1 shards missing: test_prefs/shard-00000.jsonl.gz")


def test_a_failed_step_records_failed_and_leaves_no_success_and_no_partial_output(tmp_path, prefix):
    source = tmp_path / "source"
    write_jsonl(source / "train.jsonl", [GOOD, {"prompt": "q", "chosen": "a", "rejected": [user("q")]}])
    dataset = Step(name="raw/bad-prefs", fn=functools.partial(_copy, str(source)), hash_attrs={"from": str(source)})
    step = preference_data_step("prefs/bad", dataset)
    materialize_step(dataset, prefix=prefix, settings=FAST)
    with pytest.raises(DatasetError) as error:
        materialize_step(step, prefix=prefix, settings=FAST)
    assert str(error.value) == (f"{dataset.output_path_under(prefix)}/train.jsonl, line 2: 'rejected' ends with a"
                                " user turn, not the assistant's answer")
    out = step.output_path_under(prefix)
    assert read_status(out).status is Status.FAILED
    assert [n for n in os.listdir(out) if not n.startswith(".status")] == []  # no record, shards, manifest or temp


def test_bad_step_definitions_are_refused_when_defined():
    dataset = Step(name="raw/any", fn=lambda out: None)
    with pytest.raises(StepDefinitionError, match=r"^preference data step 'p': splits='train' is one name"):
        preference_data_step("p", dataset, splits="train")
    with pytest.raises(StepDefinitionError, match=r"^preference data step 'p': give split globs or config=, not"):
        preference_data_step("p", dataset, splits={"train": ["*.jsonl"]}, config="default")
    with pytest.raises(StepDefinitionError, match=r"text_format must be one of"):
        preference_data_step("p", dataset, text_format="text-lines")
    with pytest.raises(StepDefinitionError, match=r"rows_per_shard must be positive, got 0"):
        preference_data_step("p", dataset, rows_per_shard=0)


def test_preference_data_reads_and_writes_an_object_store(uf, gs_prefix):
    import fsspec

    fs = fsspec.filesystem("gs")
    fs.put(f"{uf}/", f"{gs_prefix}/raw/", recursive=True)
    out = f"{gs_prefix}/prefs"
    result = preference_data(out, f"{gs_prefix}/raw", splits=["train_prefs", "test_prefs"])
    assert (result.pairs, result.dropped) == (5, 2)
    assert result.splits["train_prefs"].files == ["data/train_prefs-00000-of-00001.parquet"]
    fs.invalidate_cache()
    listed = sorted(p.removeprefix(out.removeprefix("gs://") + "/") for p in fs.find(out, withdirs=False))
    assert listed == [MANIFEST, "test_prefs/shard-00000.jsonl.gz", "train_prefs/shard-00000.jsonl.gz"]
    local = preference_data(str(Path(uf).parent / "local"), str(uf), splits=["train_prefs", "test_prefs"])
    assert fs.cat_file(f"{out}/train_prefs/shard-00000.jsonl.gz") == (
        Path(uf).parent / "local" / "train_prefs" / "shard-00000.jsonl.gz").read_bytes()
    assert {s: r.sha256 for s, r in local.splits.items()} == {s: r.sha256 for s, r in result.splits.items()}
    assert preference_data(out, f"{gs_prefix}/raw", splits=["train_prefs", "test_prefs"]) == result
