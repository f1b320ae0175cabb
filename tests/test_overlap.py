"""Train–test overlap: Marin's matrix (each evaluation set × each training dataset of a model's lineage, and their
union) measured on overlaps planted in real text — the Python standard library's docstrings — verbatim,
re-wrapped, inside conversations, cut one word short; the lineage found on the experiments' real graphs; the
report through Dagster; bad input named."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import shutil
import textwrap

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_assets import build_definitions, materialize_step
from marin_assets.core.files import atomic_write
from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.curation.decontaminate import EvalSet
from marin_assets.pipeline.curation.ngram_overlap import (
    UNION,
    EvalExamples,
    OverlapError,
    TrainText,
    ngram_overlap,
)
from marin_assets.pipeline.data.preference import preference_data_step
from marin_assets.pipeline.evals.harness_tasks import harness_task
from marin_assets.pipeline.reports.overlap import HITS_FILE, MATRIX_FILE, overlap_step
from marin_assets.pipeline.tokens.chat import chat_tokenize_step
from marin_assets.pipeline.tokens.preference_cache import preference_tokenize_step
from marin_assets.pipeline.tokens.pretokenized import pretokenized_step
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.training.dpo.step import dpo_step
from marin_assets.pipeline.training.lineage import training_datasets_of
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.sources import from_checkpoint, from_hf
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec

WORD = re.compile(r"[0-9a-z\u0080-\U0010ffff]+")


def prose(module: str) -> list[str]:
    """The prose paragraphs (18 words or more) of a standard-library module's public docstrings, each once."""
    mod = importlib.import_module(module)
    found: list[str] = []
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module:
            continue
        members = [v for k, v in sorted(vars(obj).items()) if inspect.isfunction(v) and not k.startswith("_")] \
            if inspect.isclass(obj) else []
        for o in [obj, *members]:
            for paragraph in (inspect.getdoc(o) or "").split("\n\n"):
                if paragraph.startswith(" ") or any(line.lstrip().startswith((">>>", "-", "*"))
                                                    for line in paragraph.splitlines()):
                    continue
                flat = " ".join(paragraph.split())
                if len(flat.split()) >= 18 and flat not in found:
                    found.append(flat)
    return found


def summary_lines(module: str) -> list[str]:
    """The one-line summaries of a module's public functions that have 5 to 14 words."""
    mod = importlib.import_module(module)
    return [line for name, obj in sorted(vars(mod).items()) if not name.startswith("_") and inspect.isfunction(obj)
            for line in [(inspect.getdoc(obj) or "").split("\n")[0]] if 5 <= len(line.split()) < 15]


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def distinct(texts: list[str], n: int = 15) -> list[str]:
    """Those of `texts` that share no n words in a row with an earlier one kept (docstrings repeat each other:
    `textwrap.fill`'s and `TextWrapper.fill`'s), so that what one plant hits is known."""
    kept: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for text in texts:
        w = words(text)
        grams = {tuple(w[i:i + n]) for i in range(max(len(w) - n + 1, 1))}
        if not grams & seen and not any(" ".join(w) in " ".join(words(k)) for k in kept):
            kept.append(text)
            seen |= grams
    return kept


def first_words(text: str, count: int) -> str:
    """`text` up to the end of its `count`-th word (as the overlap counts words)."""
    return text[:list(WORD.finditer(text.lower()))[count - 1].end()]


def rewrapped(text: str) -> str:
    """Other line breaks, other case, other punctuation: the same words."""
    return textwrap.fill(text.upper(), width=27).replace(",", " ;").replace(".", "!")


class Plant:
    """Real documentation with evaluation examples planted in some training datasets and not others."""

    def __init__(self) -> None:
        picked = distinct([*prose("textwrap"), *prose("json"), *summary_lines("textwrap")])
        long, short = [t for t in picked if len(words(t)) >= 15], [t for t in picked if len(words(t)) < 15]
        self.task = [*long[:10], *short[:2]]                       # A: an lm-eval task, 12 documents
        self.task_ids = [str(i) for i in range(len(self.task))]    # lm-eval's doc_id
        a, s = long, short
        self.files = distinct(prose("base64"))[:6]                  # B: records of a step's files
        b = self.files
        filler = prose("difflib")
        self.validation = [filler[0], prose("statistics")[30]]     # the verbatim dataset's validation split
        self.heldout_only = a[6]                                    # only in a validation-only component

        # verbatim (JSON lines): A0 inside a document, A1 as one, A2 inside one; B0 inside one
        self.verbatim = [" ".join(filler[i:i + 2]) for i in range(0, 20, 2)]
        self.verbatim += [f"{filler[20]} {a[0]} {filler[21]}", a[1], f"{filler[22]}\n\n{a[2]}", f"{b[0]} {filler[23]}"]
        # re-wrapped (parquet): A2 and A3 re-wrapped; A4 only its first 14 words (one short of a 15-gram);
        # S0 whole inside a sentence; S1 with its last word changed
        stats = prose("statistics")
        self.rewrapped = [*stats[:20], rewrapped(a[2]), f"{stats[20]} {rewrapped(a[3])}",
                          first_words(a[4], 14) + " and so on.", f"As said: {s[0]} Then more.",
                          s[1].rsplit(" ", 1)[0] + " lists."]
        # conversations (chat JSON lines): A5 as an answer, B1 as a question
        others = prose("calendar") + prose("gzip")
        self.chat = [[{"role": "user", "content": others[i]}, {"role": "assistant", "content": others[i + 1]}]
                     for i in range(0, 16, 2)]
        self.chat += [[{"role": "user", "content": "What does it do?"}, {"role": "assistant", "content": a[5]}],
                      [{"role": "user", "content": b[1]}, {"role": "assistant", "content": others[17]}]]
        # what each training dataset holds, by example
        self.holds = {"raw/planted-verbatim": {"A": {0, 1, 2}, "B": {0}, "V": {0}},
                      "raw/planted-rewrapped": {"A": {2, 3, 10}, "B": set(), "V": set()},
                      "raw/planted-chat": {"A": {5}, "B": {1}, "V": set()}}

    def write_task(self, folder) -> str:
        """A loglikelihood lm-eval task whose documents are the A examples (context, last word)."""
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "test.jsonl", "w") as f:
            for text in self.task:
                context, word = text.rsplit(" ", 1)
                f.write(json.dumps({"context": context, "word": word}) + "\n")
        (folder / "planted_docs.yaml").write_text(textwrap.dedent("""\
            task: planted_docs
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: test.jsonl
            test_split: test
            output_type: loglikelihood
            doc_to_text: "{{context}}"
            doc_to_target: "{{' ' + word}}"
            target_delimiter: ""
            metric_list:
              - metric: perplexity
                aggregation: perplexity
                higher_is_better: false
            """))
        return str(folder / "planted_docs.yaml")


def jsonl(path: str, rows: list[dict]) -> None:
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows).encode())


def dataset_step(name: str, write, version: str) -> Step:
    return Step(name=name, fn=write, hash_attrs={"plant": version}, kind="generate")


@pytest.fixture(scope="module")
def plant():
    return Plant()


def planted_steps(plant: Plant, tmp_path) -> dict[str, Step]:
    """The planted datasets as steps, tokenized (by definition only: the overlap never reads a cache) into one
    training run with a validation-only component and a pretokenized cache."""

    def verbatim(out):
        jsonl(f"{out}/train/part-0.jsonl", [{"text": t} for t in plant.verbatim])
        jsonl(f"{out}/validation/part-0.jsonl", [{"text": t} for t in plant.validation])

    def rewrapped_parquet(out):
        import os
        os.makedirs(f"{out}/train", exist_ok=True)
        pq.write_table(pa.table({"text": plant.rewrapped}), f"{out}/train/part-0.parquet")

    def chat(out):
        jsonl(f"{out}/train/conversations.jsonl", [{"messages": m} for m in plant.chat])

    def heldout(out):
        jsonl(f"{out}/train/part-0.jsonl", [{"text": plant.heldout_only}])

    def evalsets(out):
        jsonl(f"{out}/b.jsonl", [{"text": t} for t in plant.files])
        jsonl(f"{out}/empty.jsonl", [])

    steps = {"verbatim": dataset_step("raw/planted-verbatim", verbatim, "1"),
             "rewrapped": dataset_step("raw/planted-rewrapped", rewrapped_parquet, "1"),
             "chat": dataset_step("raw/planted-chat", chat, "1"),
             "heldout": dataset_step("raw/planted-heldout", heldout, "1"),
             "evalsets": dataset_step("raw/planted-evalsets", evalsets, "1")}
    tokenizer = Step(name="tokenizers/planted", fn=print, hash_attrs={"never": "materialized"})
    caches = {k: tokenize_step(f"tokenized/planted-{k}", steps[k], tokenizer) for k in ("verbatim", "rewrapped")}
    caches["chat"] = chat_tokenize_step("tokenized/planted-chat", steps["chat"], tokenizer)
    heldout = tokenize_step("tokenized/planted-heldout", steps["heldout"], tokenizer)
    elsewhere = pretokenized_step("tokenized/planted-elsewhere", "org/some-cache", tokenizer, revision="a" * 40)
    train = train_step("checkpoints/planted", {**caches, "elsewhere": elsewhere}, validation={"heldout": heldout},
                       trainer=TrainerSpec(num_train_steps=10, train_batch_size=2))
    return {**steps, **{f"cache_{k}": v for k, v in caches.items()}, "train": train, "tokenizer": tokenizer}


def expected(plant: Plant, which: str, size: int) -> dict[str, float]:
    """The matrix row the plant makes: per training dataset the share it holds, and the union's."""
    row = {t: len(held[which]) / size for t, held in plant.holds.items()}
    row[UNION] = len(set().union(*(held[which] for held in plant.holds.values()))) / size
    return row


def test_the_overlap_matrix_of_planted_examples_through_dagster(plant, tmp_path, prefix, local_ray, dagster_home):
    steps = planted_steps(plant, tmp_path)
    lineage = training_datasets_of(steps["train"])
    task = harness_task(plant.write_task(tmp_path / "task"))
    report = overlap_step("reports/planted-overlap",
                          [task, EvalSet("base64-docs", steps["evalsets"], ("b.jsonl",)), steps["cache_verbatim"]],
                          lineage)
    # the report reads the datasets' text, never the model, its caches or its tokenizer
    assert {d.name for d in report.deps} == {"raw/planted-verbatim", "raw/planted-rewrapped", "raw/planted-chat",
                                             "raw/planted-evalsets"}
    result = build_definitions([report]).resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.get())
    assert result.success
    recorded = json.loads(open(f"{report.output_path}/.artifact.json").read())["result"]
    matrix = recorded["matrix"]
    validation = "raw/planted-verbatim:validation"
    assert set(matrix) == {"planted_docs", "base64-docs", validation}
    assert matrix["planted_docs"] == pytest.approx(expected(plant, "A", len(plant.task)))
    assert matrix["base64-docs"] == pytest.approx(expected(plant, "B", len(plant.files)))
    assert matrix[validation] == pytest.approx(expected(plant, "V", len(plant.validation)))
    assert matrix["planted_docs"][UNION] == 6 / 12  # A0, A1, A2, A3, A5 and S0; not A4 (14 words), S1, A6
    assert recorded["eval_sets"]["planted_docs"]["short_examples"] == 2
    assert recorded["max_union"] == max(row[UNION] for row in matrix.values())
    assert recorded["unscanned"] == [
        "tokenized/planted-elsewhere: a pretokenized cache, whose text is not in this graph"]

    # every match is real: its words are the example's and are in the training document it names
    hits = [json.loads(line) for line in open(f"{report.output_path}/{HITS_FILE}")]
    assert {(h["train"], h["example"]) for h in hits if h["eval_set"] == "planted_docs"} == {
        (t, str(i)) for t, held in plant.holds.items() for i in held["A"]}
    examples = {"planted_docs": dict(zip(plant.task_ids, plant.task, strict=True)),
                "base64-docs": {f"b.jsonl:{i + 1}": t for i, t in enumerate(plant.files)},
                validation: {f"validation/part-0.jsonl:{i + 1}": t for i, t in enumerate(plant.validation)}}
    assert len(hits) == sum(len(held[k]) for held in plant.holds.values() for k in ("A", "B", "V"))
    for h in hits:
        example = examples[h["eval_set"]][h["example"]]
        assert len(words(h["ngram"])) == h["words"] == min(15, len(words(example)))
        shared = " ".join(words(h["ngram"]))
        assert shared in " ".join(words(example))
        if h["file"].endswith(".parquet"):
            document = pq.read_table(h["file"])["text"][h["line"] - 1].as_py()
        else:
            row = json.loads(open(h["file"]).read().splitlines()[h["line"] - 1])
            document = row.get("text") or "\n".join(m["content"] for m in row["messages"])
        assert shared in " ".join(words(document))
    csv_rows = open(f"{report.output_path}/{MATRIX_FILE}").read().splitlines()
    columns = [d.name for d in lineage.datasets]  # in the lineage's order
    assert csv_rows[0] == ",".join(["evaluation_dataset", *columns, UNION])

    # the UI: the matrix as a table, one row per evaluation set, a column per training dataset and the union
    event = next(e for e in result.get_asset_materialization_events()
                 if e.asset_key.to_user_string() == "reports/planted-overlap")
    metadata = event.materialization.metadata
    table = metadata["result.matrix"]
    assert isinstance(table, dg.TableMetadataValue)
    assert [c.name for c in table.schema.columns] == ["name", *columns, UNION]
    assert {r.data["name"]: r.data[UNION] for r in table.records} == {e: row[UNION] for e, row in matrix.items()}
    shown = metadata["result.hits"]
    assert isinstance(shown, dg.TableMetadataValue) and {"example", "ngram", "train", "file"} <= {
        c.name for c in shown.schema.columns}


def test_a_model_trained_on_what_it_was_trained_on_the_lineage_of_the_experiments(plant, tmp_path):
    from marin_assets.experiments import curated_docs, overlap_demo, python_docs, sft_chat

    # the demo: the raw corpus its tokenize step read, from the run or from its export
    for model in (python_docs.pipeline["train"], python_docs.pipeline["export"]):
        lineage = training_datasets_of(model)
        assert [(d.step.name, d.split, d.reader) for d in lineage.datasets] == [("raw/python-docs", "train", "text")]
        assert lineage.datasets[0].caches == ("tokenized/python-docs-bpe",) and not lineage.unknown
    # curation: what was tokenized is the decontaminated dataset; the stages above it are where it came from
    (curated,) = training_datasets_of(curated_docs.pipeline["train"]).datasets
    assert curated.step is curated_docs.pipeline["decontaminated"]
    assert curated.derived_from[0] == "raw/curated-docs" and "curated/curated-docs-fuzzy-dedup" in curated.derived_from
    # SFT: its conversations, and through the export it started from, the pretraining corpus
    sft = training_datasets_of(sft_chat.pipeline["sft"])
    assert {(d.step.name, d.reader, d.trained_by) for d in sft.datasets} == {
        ("raw/python-docs-chat", "conversations", ("checkpoints/python-docs-chat-sft",)),
        ("raw/python-docs", "text", ("checkpoints/python-docs-llama",))}
    # DPO: its preference pairs, and what the weights it tunes were trained on (SFT, then pretraining)
    prefs = preference_data_step("prefs/planted", Step(name="raw/planted-pairs", fn=print, hash_attrs={"v": 1}))
    dpo = dpo_step("checkpoints/planted-dpo", preference_tokenize_step("tokenized/planted-pairs", prefs,
                                                                      sft_chat.pipeline["tokenizer"]),
                   from_hf(sft_chat.pipeline["sft_export"]))
    assert [(d.step.name, d.reader, d.derived_from) for d in training_datasets_of(dpo).datasets] == [
        ("prefs/planted", "conversations", ("raw/planted-pairs",)),
        ("raw/python-docs-chat", "conversations", ("raw/python-docs",)), ("raw/python-docs", "text", ())]
    # a validation-only component is not trained on; a pretokenized cache has no text in the graph
    planted = training_datasets_of(planted_steps(plant, tmp_path)["train"])
    assert [d.name for d in planted.datasets] == ["raw/planted-chat", "raw/planted-rewrapped", "raw/planted-verbatim"]
    assert len(planted.unknown) == 1 and "planted-elsewhere" in planted.unknown[0]
    # the demo's report depends on the corpus alone, not on the model: it is ready before training
    assert [d.name for d in overlap_demo.overlap.deps] == ["raw/python-docs"]
    assert [s["dataset"] for s in overlap_demo.overlap.hash_attrs["train"]] == ["raw/python-docs"]
    assert overlap_demo.overlap.hash_attrs["ngram"] == 15


def test_shared_words_count_not_their_wrapping_nor_one_word_less(plant, tmp_path):
    """The library alone: a 15-gram re-wrapped is a hit, 14 words are not; an example shorter than 15 words is
    checked whole."""
    a, s = plant.task, plant.task[10:]
    jsonl(str(tmp_path / "t.jsonl"), [{"text": rewrapped(a[0])}, {"text": first_words(a[1], 14)},
                                      {"text": " ".join(a[2].split()[3:18])}, {"text": f"so {s[0]} too"}])
    found = ngram_overlap([EvalExamples("a", ("0", "1", "2", "10"), (a[0], a[1], a[2], s[0]))],
                          [TrainText("t", (str(tmp_path / "t.jsonl"),))])
    assert found.hit["a"]["t"] == ["0", "2", "10"] and found.fraction("a") == 3 / 4
    assert [h.words for h in found.hits] == [15, 15, len(words(s[0]))]
    assert words(found.hits[1].ngram) == words(" ".join(a[2].split()[3:18]))[:15]  # its earliest 15-gram


def test_both_sides_of_a_preference_pair_are_read(plant, tmp_path, prefix):
    """DPO trains on the chosen and the rejected answer: an example in either is a hit."""
    a = plant.task

    def pairs(out):
        jsonl(f"{out}/train/pairs.jsonl", [
            {"prompt": "What does textwrap do?", "chosen": a[0], "rejected": "It sorts lists."},
            {"prompt": "And wrap?", "chosen": "It wraps text.", "rejected": a[1]},
            {"prompt": "And fill?", "chosen": "It fills text.", "rejected": "It empties it."}])

    raw = dataset_step("raw/planted-pairs", pairs, "1")
    prefs = preference_data_step("prefs/planted", raw)
    cache = preference_tokenize_step("tokenized/planted-pairs", prefs, Step(name="tokenizers/x", fn=print))
    for step in (raw, prefs):
        materialize_step(step, prefix=prefix)
    (text,) = [d.text() for d in training_datasets_of(
        dpo_step("checkpoints/planted-dpo", cache, from_checkpoint(planted_steps(plant, tmp_path)["train"]),
                 model=ModelSpec())).datasets if d.step is prefs]
    assert text.reader == "conversations" and text.files[0].endswith("train/shard-00000.jsonl.gz")
    found = ngram_overlap([EvalExamples("a", ("0", "1", "2"), tuple(a[:3]))], [text])
    assert found.hit["a"]["prefs/planted"] == ["0", "1"]


def test_bad_input_is_named(plant, tmp_path, prefix):
    steps = planted_steps(plant, tmp_path)
    task = harness_task(plant.write_task(tmp_path / "task"))
    # an evaluation set without examples
    empty = overlap_step("reports/empty-set", [EvalSet("nothing", steps["evalsets"], ("empty.jsonl",))],
                         [steps["cache_verbatim"]])
    materialize_step(steps["evalsets"], prefix=prefix)
    out = materialize_step(steps["verbatim"], prefix=prefix).output_path
    with pytest.raises(OverlapError) as caught:
        materialize_step(empty, prefix=prefix)
    assert "evaluation set 'nothing' has no examples (1 files of raw/planted-evalsets)" in str(caught.value)
    assert "(while materializing step 'reports/empty-set'" in "".join(caught.value.__notes__)
    # a training dataset whose files are gone
    report = overlap_step("reports/gone", [task], [steps["cache_verbatim"]])
    shutil.rmtree(f"{out}/train")
    with pytest.raises(OverlapError) as caught:
        materialize_step(report, prefix=prefix)
    assert str(caught.value).startswith(f"training dataset 'raw/planted-verbatim': dataset 'raw/planted-verbatim'"
                                        f" (step {steps['verbatim'].name_with_hash}): {out} has no 'train' split")
    with pytest.raises(OverlapError, match=r"training dataset 't': .*/missing.jsonl does not exist"):
        ngram_overlap([EvalExamples("a", ("0",), (plant.task[0],))],
                      [TrainText("t", (str(tmp_path / "missing.jsonl"),))])
    # at definition: repeated or unknown evaluation sets, no training text at all
    with pytest.raises(StepDefinitionError,
                       match=r"overlap step 'reports/x': two evaluation sets are named \['planted_docs'\]"):
        overlap_step("reports/x", [task, task], [steps["cache_verbatim"]])
    with pytest.raises(StepDefinitionError, match="overlap step 'reports/x': 3 is not an evaluation set"):
        overlap_step("reports/x", [3], [steps["cache_verbatim"]])
    with pytest.raises(StepDefinitionError, match="no training dataset to scan .not in the graph: tokenized/plan"):
        overlap_step("reports/x", [task], [pretokenized_step("tokenized/planted-elsewhere", "org/some-cache",
                                                             steps["tokenizer"], revision="a" * 40)])
    with pytest.raises(OverlapError, match="evaluation set 'blank': not one of its 1 examples has a word"):
        ngram_overlap([EvalExamples("blank", ("0",), ("...",))], [TrainText("t", ("x",))])
