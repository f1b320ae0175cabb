"""The preference cache, for real: pairs built from the standard library's docstrings (chosen: the answer, rejected:
another function's docstring) → `preference_data` → a Levanter preference cache tokenized with a trained BPE and
the default chat template → read back exactly as `train_dpo` reads it (`PreferenceLmDataConfig.build_caches`, then
`dataset_for_preference_format`): the ids are the rendered conversations, the loss weights exactly the assistant's
answers on both sides, the record's counts those of the arrays; the rows are those Levanter's own
`PreferenceChatProcessor` makes; a crash mid-split resumes; the step through the protocol with its check."""

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from marin_assets import StepDefinitionError, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.core.step import Step
from marin_assets.pipeline.data.preference import preference_data, preference_data_step
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.tokens import levanter_cache as lc
from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE
from marin_assets.pipeline.tokens.preference_cache import (
    BOTH_SIDES,
    PreferenceRenderer,
    pairs_without_answers,
    preference_exemplar,
    preference_tokenize,
    preference_tokenize_step,
    tokenize_preference_files,
)
from marin_assets.pipeline.tokens.tokenize import TokenizedCache
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step, load_hf_tokenizer, train_tokenizer
from tests.support.chat import SYSTEM, assistant_positions, doc_answers, write_docs_dataset, write_jsonl
from tests.support.helpers import FAST

TRAIN, VALIDATION = 24, 6
SEQ_LEN = 256


def preference_records(count: int, seed: int) -> list[dict]:
    """`{prompt, chosen, rejected}` rows: a question about a function (after a system prompt in every other row,
    a first exchange in every third), its docstring as the chosen answer, another function's as the rejected."""
    answers = doc_answers()
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        (name, answer), (_, wrong), (first, first_answer) = rng.sample(answers, 3)
        prompt = [{"role": "system", "content": SYSTEM}] if i % 2 else []
        if i % 3 == 0:
            prompt += [{"role": "user", "content": f"What does {first} do?"},
                       {"role": "assistant", "content": first_answer}]
        prompt.append({"role": "user", "content": f"What does {name} do?"})
        rows.append({"prompt": prompt, "chosen": answer, "rejected": wrong})
    return rows


def read_pairs(prefs: str, split: str) -> list[dict]:
    """The pairs of a preference split, in order, as the preference data wrote them."""
    return [json.loads(line) for shard in sorted((Path(prefs) / split).glob("shard-*.jsonl.gz"))
            for line in gzip.open(shard, "rt")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("preference-cache")
    write_docs_dataset(root / "docs")
    tokenizer = train_tokenizer(str(root / "bpe"), str(root / "docs"), vocab_size=512).path
    records = preference_records(TRAIN + VALIDATION, seed=7)
    write_jsonl(root / "raw" / "train" / "a.jsonl", records[:TRAIN // 2])
    write_jsonl(root / "raw" / "train" / "b.jsonl", records[TRAIN // 2:TRAIN])
    write_jsonl(root / "raw" / "validation" / "a.jsonl", records[TRAIN:])
    prefs = str(root / "prefs")
    preference_data(prefs, str(root / "raw"), rows_per_shard=5)  # several shards per split: several commits
    result = preference_tokenize(str(root / "cache"), prefs, tokenizer)
    return {"root": root, "tokenizer": tokenizer, "prefs": prefs, "cache": str(root / "cache"), "result": result}


def dpo_examples(cache: str, tokenizer: str, split: str) -> list:
    """The split's examples as `train_dpo` builds its datasets: Levanter's DPO data config over the cache, its
    caches loaded (never built), `dataset_for_preference_format` over them — `DpoExample`s, in cache order."""
    import haliax as hax
    from levanter.data.text.datasets import DatasetComponent
    from levanter.data.text.preference import (
        PreferenceChatLmDatasetFormat,
        PreferenceLmDataConfig,
        PreferencePairDataset,
        dataset_for_preference_format,
    )

    format = PreferenceChatLmDatasetFormat(chat_template=DEFAULT_CHAT_TEMPLATE)
    config = PreferenceLmDataConfig(tokenizer=tokenizer, cache_dir=None, auto_build_caches=False, shuffle=False,
                                    components={"prefs": DatasetComponent(cache_dir=cache, format=format)})
    dataset = dataset_for_preference_format(format, hax.Axis("position", SEQ_LEN), config.build_caches(split)["prefs"])
    assert isinstance(dataset, PreferencePairDataset)
    synced = dataset.as_sync_dataset()
    return [synced[i] for i in range(len(synced))]


def test_train_dpo_reads_the_pairs_with_loss_exactly_on_each_sides_answer(built, caplog):
    caplog.set_level("WARNING")
    tokenizer = load_hf_tokenizer(built["tokenizer"])
    result = built["result"]
    for split, count in (("train", TRAIN), ("validation", VALIDATION)):
        pairs = read_pairs(built["prefs"], split)
        examples = dpo_examples(built["cache"], built["tokenizer"], split)
        assert len(pairs) == len(examples) == count
        tokens = weighted = 0
        for pair, example in zip(pairs, examples, strict=True):
            for side in ("chosen", "rejected"):
                conversation = pair[side]
                lm = getattr(example, side)
                ids = tokenizer.apply_chat_template(conversation, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=True,
                                                    return_dict=False)
                got, loss = np.asarray(lm.tokens.array), np.asarray(lm.loss_weight.array)
                assert got[:len(ids)].tolist() == ids  # the whole conversation, as the template renders it
                assert not loss[len(ids) - 1:].any(), "nothing past the conversation carries loss"
                # Position i's weight is for predicting token i + 1: the targets are exactly the assistant tokens
                # found by rendering each prefix — the first exchange's answer too, no system or user token.
                targets = {i + 1 for i in np.flatnonzero(loss)}
                assert targets == assistant_positions(tokenizer, DEFAULT_CHAT_TEMPLATE, conversation)
                answers = "".join(t["content"].strip() + tokenizer.eos_token
                                  for t in conversation if t["role"] == "assistant")
                assert tokenizer.decode([ids[t] for t in sorted(targets)]) == answers
                tokens += len(ids)
                weighted += len(targets)
            assert pair["chosen"][:-1] == pair["rejected"][:-1] and pair["chosen"] != pair["rejected"]
        stats = result.splits[split]
        assert (stats.documents, stats.tokens, stats.files) == (count, tokens, len(range(0, count, 5)))
        assert result.assistant_tokens[split] == weighted < tokens / 2
    assert result.chat_template == DEFAULT_CHAT_TEMPLATE and result.tokenizer == built["tokenizer"]
    assert "Metadata mismatch" not in caplog.text  # Levanter found the ledger's processor metadata its own


def test_the_rows_are_those_levanters_own_preference_processor_makes(built):
    pairs = read_pairs(built["prefs"], "train")
    levanter = lc.preference_processor(built["tokenizer"], DEFAULT_CHAT_TEMPLATE)
    expected = levanter(pairs)  # Levanter's rendering (for this byte-level BPE, masks agree with our span masks)
    exemplar = levanter.output_exemplar
    cache = lc.load_cache(str(Path(built["cache"]) / "train"), exemplar)
    got = cache.get_batch_sync(list(range(len(pairs))))
    for row, theirs in zip(got, expected, strict=True):
        assert sorted(row) == sorted(theirs) == sorted(exemplar)
        for field, value in theirs.items():
            assert np.array_equal(np.asarray(row[field]), value), field
    metadata = lc.load_ledger(str(Path(built["cache"]) / "train")).metadata.preprocessor_metadata
    assert metadata == levanter.metadata  # what train_dpo's loader compares the cache with
    assert metadata["chosen"]["chat_template"] == metadata["rejected"]["chat_template"] == DEFAULT_CHAT_TEMPLATE


def test_a_crash_mid_split_resumes_from_the_last_committed_shard(built, tmp_path):
    tokenizer = load_hf_tokenizer(built["tokenizer"])
    shards = sorted(str(p) for p in (Path(built["prefs"]) / "train").glob("shard-*.jsonl.gz"))
    assert len(shards) == 5

    class Crashing(PreferenceRenderer):
        calls = 0

        def __call__(self, batch):
            Crashing.calls += 1
            if Crashing.calls == 3:
                raise KeyboardInterrupt("killed in the third shard")
            return super().__call__(batch)

    cache = str(tmp_path / "train")
    with pytest.raises(KeyboardInterrupt):
        tokenize_preference_files(shards, cache, Crashing(tokenizer, DEFAULT_CHAT_TEMPLATE), batch_size=256)
    ledger = lc.load_ledger(cache)
    assert not ledger.is_finished and ledger.total_num_rows == 10 and len(ledger.finished_shards) == 2

    class Counting(PreferenceRenderer):
        rows = 0

        def __call__(self, batch):
            Counting.rows += len(batch)
            return super().__call__(batch)

    resumed = tokenize_preference_files(shards, cache, Counting(tokenizer, DEFAULT_CHAT_TEMPLATE))
    assert Counting.rows == TRAIN - 10  # the committed shards were not rendered again
    result = built["result"]
    assert resumed == (TRAIN, result.splits["train"].tokens, result.assistant_tokens["train"])
    exemplar = preference_exemplar(tokenizer, DEFAULT_CHAT_TEMPLATE)
    ours, fresh = (lc.load_cache(c, exemplar).get_batch_sync(list(range(TRAIN)))
                   for c in (cache, str(Path(built["cache"]) / "train")))
    for a, b in zip(ours, fresh, strict=True):
        assert all(np.array_equal(a[f], b[f]) for f in exemplar)
    assert tokenize_preference_files(shards, cache, Counting(tokenizer, DEFAULT_CHAT_TEMPLATE)) == resumed
    assert Counting.rows == TRAIN - 10  # finished: read, not rebuilt


def test_splits_map_to_the_names_dpo_reads_and_bad_input_is_named(built, tmp_path):
    mapped = preference_tokenize(str(tmp_path / "mapped"), built["prefs"], built["tokenizer"],
                                 splits={"validation": "train"})
    assert list(mapped.splits) == ["validation"] and mapped.splits["validation"].documents == TRAIN
    with pytest.raises(DatasetError, match=r"no preference split 'test_prefs' \(it holds: train, validation\)"):
        preference_tokenize(str(tmp_path / "x"), built["prefs"], built["tokenizer"], splits=["test_prefs"])
    with pytest.raises(DatasetError, match="is not finished preference data"):
        preference_tokenize(str(tmp_path / "y"), str(built["root"] / "raw"), built["tokenizer"])

    # A template that leaves a wrong answer unmarked: that pair's rejected side would carry no loss.
    unmarked = DEFAULT_CHAT_TEMPLATE.replace(
        "{%- if message['role'] == 'assistant' -%}",
        "{%- if message['role'] == 'assistant' and 'Return' not in message['content'] -%}")
    pairs = read_pairs(built["prefs"], "train")
    line, side = next((n, s) for n, p in enumerate(pairs, start=1) for s in ("chosen", "rejected")
                      if all("Return" in t["content"] for t in p[s] if t["role"] == "assistant"))
    shard = (line - 1) // 5
    with pytest.raises(DatasetError, match=rf"shard-{shard:05d}\.jsonl\.gz, line {(line - 1) % 5 + 1}: the chat"
                                           rf" template marks no assistant token in the {side} conversation"):
        preference_tokenize(str(tmp_path / "z"), built["prefs"], built["tokenizer"], chat_template=unmarked)


def test_the_step_materializes_and_its_check_finds_a_pair_without_an_answer(built, tmp_path, prefix):
    raw = Step(name="raw/prefs", fn=lambda out: write_jsonl(Path(out) / "train" / "a.jsonl",
                                                            preference_records(8, seed=1)), hash_attrs={"v": 1})
    docs = Step(name="raw/docs", fn=lambda out: write_docs_dataset(Path(out)), hash_attrs={"v": 1})
    bpe = bpe_tokenizer_step("tokenizers/docs-bpe", docs, vocab_size=512)
    prefs = preference_data_step("prefs/docs", raw)
    step = preference_tokenize_step("tokenized/prefs", prefs, bpe)
    assert step.kind == "tokenize" and list(step.deps) == [prefs, bpe] and step.tokenizer is bpe and not step.chat
    assert step.hash_attrs["default_chat_template"] == DEFAULT_CHAT_TEMPLATE
    given = preference_tokenize_step("tokenized/prefs", prefs, bpe, chat_template=DEFAULT_CHAT_TEMPLATE)
    assert given.hash != step.hash
    assert preference_tokenize_step("tokenized/prefs", prefs, bpe, splits={"train": "train"}).hash != step.hash
    with pytest.raises(StepDefinitionError, match="no {% generation %} block"):
        preference_tokenize_step("tokenized/x", prefs, bpe, chat_template="{{ messages }}")
    with pytest.raises(StepDefinitionError, match="splits must be"):
        preference_tokenize_step("tokenized/x", prefs, bpe, splits="train")

    for each in (raw, docs, bpe, prefs):
        materialize_step(each, prefix=prefix, settings=FAST)
    outcome = materialize_step(step, prefix=prefix, settings=FAST)
    cache = load_result(outcome.output_path, TokenizedCache)
    assert cache.splits["train"].documents == 8 and cache.assistant_tokens["train"] > 0
    record = read_record(outcome.output_path)
    for check in step.checks:
        assert run_check(check, outcome.output_path, record.result).passed, check.name
    check = run_check(BOTH_SIDES, outcome.output_path, record.result)
    assert check.message == "train: 8 pairs" and check.metadata == {"train_pairs_without_answer": 0}
    assert materialize_step(step, prefix=prefix, settings=FAST).cached

    # A cache (written by hand, as a foreign writer might) whose second pair has no rejected answer marked.
    tokenizer = load_hf_tokenizer(built["tokenizer"])
    processor = PreferenceRenderer(tokenizer, DEFAULT_CHAT_TEMPLATE)
    rows = processor(read_pairs(built["prefs"], "validation")[:3])
    rows[1]["rejected_assistant_masks"] = np.zeros_like(rows[1]["rejected_assistant_masks"])
    split = str(tmp_path / "foreign" / "train")
    store = lc.open_store(processor.output_exemplar, split, mode="w")
    store.extend(rows)
    lc.commit_ledger(split, lc.new_ledger(3, {"a": 3}, ["a"], True, lc.cache_metadata(processor),
                                          lc.data_sizes(store)))
    assert pairs_without_answers(split, processor.output_exemplar) == (3, 1)
    bad = run_check(BOTH_SIDES, str(tmp_path / "foreign"), {**record.result, "tokenizer": built["tokenizer"]})
    assert not bad.passed and bad.message == "train: 1 of 3 pairs lack an answer"
