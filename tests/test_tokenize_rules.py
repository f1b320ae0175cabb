"""Tokenize's rules at its edges: a dataset with several config folders (`config=`), empty documents
(dropped and counted in every format, exactly across a resume), and an `s3://` output refused before
anything is computed (the pinned JAX's tensorstore would write its arrays to a local folder `s3:`)."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_assets import StepDefinitionError, load_result, materialize_step
from marin_assets.core.results import from_jsonable
from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.tokens import cache_writer
from marin_assets.pipeline.tokens import levanter_cache as lc
from marin_assets.pipeline.tokens.chat import chat_tokenize_step
from marin_assets.pipeline.tokens.encoders import encoder
from marin_assets.pipeline.tokens.tokenize import SplitStats, TokenizedCache, tokenize, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import existing_tokenizer_step
from tests.support.chat import conversations
from tests.support.helpers import FAST, corpus_and_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return corpus_and_tokenizer(tmp_path_factory.mktemp("tok"), train_documents=300, validation_documents=20,
                                seed=7, shards=1)[1]


def cache_rows(cache_dir: str) -> list[list[int]]:
    from levanter.store.cache import TreeCache

    cache = TreeCache.load(cache_dir, {"input_ids": np.zeros((0,), dtype=np.int32)})
    return [list(map(int, r["input_ids"])) for r in cache.get_batch_sync(list(range(len(cache))))]


def framed(tokenizer_dir: str, texts: list[str]) -> list[list[int]]:
    """The rows `texts` make as a cache (BOS and EOS ids around each)."""
    ids, ends = encoder(tokenizer_dir, "bos_eos", "tokenizers").encode(texts)
    return [ids[a:b].tolist() for a, b in zip(np.concatenate([[0], ends[:-1]]), ends, strict=True)]


def write_parquet(path: Path, texts: list[str], row_group_size: int = 3) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=row_group_size)


# --- a dataset with several config folders -------------------------------------------------------------

CONFIGS = {"en": ["the first English document", "a second one"], "fr": ["un document", "deux", "et trois"]}


def write_configs(out: str) -> None:
    """Two config folders of Hugging Face parquet shards: `{config}/{split}-00000-of-00001.parquet`."""
    for config, texts in CONFIGS.items():
        for split in ("train", "validation"):
            write_parquet(Path(out) / config / f"{split}-00000-of-00001.parquet", texts)


def test_a_dataset_with_several_configs_is_tokenized_with_config(tokenizer_dir, prefix):
    data = Step(name="raw/configs", fn=write_configs, hash_attrs={"configs": sorted(CONFIGS)})
    tok = existing_tokenizer_step("tokenizers/t", tokenizer_dir)
    for step in (data, tok):
        materialize_step(step, settings=FAST)
    unchosen = tokenize_step("tokenized/configs", data, tok)
    with pytest.raises(DatasetError) as caught:
        materialize_step(unchosen, settings=FAST)
    message = str(caught.value)
    assert "holds several configs (en, fr); choose one with config= (tokenize_step(…, config='en')" in message
    assert "splits={'train': ['en/train-*.parquet'], 'validation': ['en/validation-*.parquet']}" in message
    assert read_status(unchosen.output_path).status is Status.FAILED

    # the advice works: config= chooses the folder, and enters identity only when given
    chosen = tokenize_step("tokenized/configs", data, tok, config="fr")
    assert "config" not in unchosen.hash_attrs and chosen.hash_attrs["config"] == "fr"
    assert chosen.hash != unchosen.hash != tokenize_step("tokenized/configs", data, tok, config="en").hash
    materialize_step(chosen, settings=FAST)
    result = load_result(chosen, TokenizedCache)
    assert {s: st.documents for s, st in result.splits.items()} == {"train": 3, "validation": 3}
    assert cache_rows(str(Path(chosen.output_path) / "train")) == framed(tokenizer_dir, CONFIGS["fr"])
    # what the advice's other half says: the same splits, written as globs
    by_globs = tokenize(str(Path(prefix) / "by-globs"), data.output_path, tokenizer_dir,
                        splits={"train": ["fr/train-*.parquet"]})
    assert by_globs.splits["train"].tokens == result.splits["train"].tokens

    with pytest.raises(StepDefinitionError, match=r"give splits= or config=, not both"):
        tokenize_step("tokenized/both", data, tok, splits={"train": ["fr/*"]}, config="fr")


def write_chat_configs(out: str) -> None:
    for config, seed in (("en", 1), ("fr", 2)):
        path = Path(out) / config / "train.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations(3 + seed, seed)))


def test_chat_tokenize_takes_config_too(tokenizer_dir, prefix):
    data = Step(name="raw/chat-configs", fn=write_chat_configs, hash_attrs={"v": 1})
    tok = existing_tokenizer_step("tokenizers/t", tokenizer_dir)
    for step in (data, tok):
        materialize_step(step, settings=FAST)
    with pytest.raises(DatasetError, match=r"chat_tokenize_step\(…, config='en'\)"):
        materialize_step(chat_tokenize_step("tokenized/chat-configs", data, tok), settings=FAST)
    chosen = chat_tokenize_step("tokenized/chat-configs", data, tok, config="fr")
    assert chosen.hash_attrs["config"] == "fr" and "config" not in chat_tokenize_step("c", data, tok).hash_attrs
    materialize_step(chosen, settings=FAST)
    assert load_result(chosen, TokenizedCache).splits["train"].documents == 5


# --- empty documents: dropped and counted in every format ----------------------------------------------

KEPT = ["alpha beta", "gamma", "delta epsilon zeta"]


def jsonl_dataset(root: Path) -> tuple[dict, int]:
    texts = ["alpha beta", "", "gamma", "   ", "\n\t", "delta epsilon zeta", "\u3000"]
    lines = [json.dumps({"text": t}) for t in texts]
    lines.insert(3, "  ")  # a blank line: no document at all, so not counted
    (root / "a.jsonl").write_text("\n".join(lines) + "\n")
    return {"train": ["a.jsonl"]}, 4


def parquet_dataset(root: Path) -> tuple[dict, int]:
    write_parquet(root / "a.parquet", ["", "alpha beta", " ", "gamma", "", "delta epsilon zeta"])
    return {"train": ["a.parquet"]}, 3


def text_lines_dataset(root: Path) -> tuple[dict, int]:
    # Blank lines separate documents (none is one); a line of other whitespace is an empty document.
    (root / "a.txt").write_text("alpha beta\n\n   \ngamma\n\u00a0\u3000\ndelta epsilon zeta\n", encoding="utf-8")
    return {"train": ["a.txt"]}, 1


def text_file_dataset(root: Path) -> tuple[dict, int]:
    for name, text in [("1.txt", "alpha beta"), ("2.txt", ""), ("3.txt", " \n\n"), ("4.txt", "gamma"),
                       ("5.txt", "delta epsilon zeta"), ("6.txt", "\t")]:
        (root / name).write_text(text)
    return {"train": ["*.txt"]}, 3


@pytest.mark.parametrize("text_format, make", [("jsonl", jsonl_dataset), ("parquet", parquet_dataset),
                                               ("text-lines", text_lines_dataset), ("text-file", text_file_dataset)])
def test_empty_documents_are_dropped_and_counted_in_every_format(tokenizer_dir, tmp_path, text_format, make):
    root = tmp_path / "data"
    root.mkdir()
    splits, empty = make(root)
    result = tokenize(str(tmp_path / "cache"), str(root), tokenizer_dir, splits=splits, text_format=text_format)
    assert result.splits["train"].documents == len(KEPT)
    assert result.splits["train"].empty_documents_dropped == empty
    assert cache_rows(str(tmp_path / "cache" / "train")) == framed(tokenizer_dir, KEPT)  # no [BOS, EOS] row
    # a re-run finds the finished cache, counts included
    again = tokenize(str(tmp_path / "cache"), str(root), tokenizer_dir, splits=splits, text_format=text_format)
    assert again.splits == result.splits


def test_a_pretokenized_copy_keeps_the_count(tokenizer_dir, tmp_path):
    from marin_assets.pipeline.tokens.pretokenized import download_pretokenized_cache

    root = tmp_path / "data"
    root.mkdir()
    splits, empty = jsonl_dataset(root)
    made = tokenize(str(tmp_path / "made"), str(root), tokenizer_dir, splits=splits)
    copied = download_pretokenized_cache(str(tmp_path / "copied"), str(tmp_path / "made"), tokenizer_dir)
    assert copied.splits["train"] == made.splits["train"] and made.splits["train"].empty_documents_dropped == empty


def test_a_split_of_empty_documents_has_no_documents(tokenizer_dir, tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": ""}\n{"text": " "}\n')
    with pytest.raises(DatasetError, match=r"split 'train' of .* has no documents \(1 files; 2 empty documents"
                                           r" dropped\)"):
        tokenize(str(tmp_path / "cache"), str(tmp_path), tokenizer_dir, splits={"train": ["a.jsonl"]})


def test_records_made_before_the_count_still_load():
    old = {"documents": 5, "tokens": 40, "files": 1}
    assert from_jsonable(old, SplitStats) == SplitStats(5, 40, 1, empty_documents_dropped=0)


def interleaved(count: int) -> list[str]:
    """Documents with an empty one (of some kind) after every second."""
    return [("", " ", "\n\n")[i % 3] if i % 3 == 2 else f"document {i} " + "word " * (i % 5) for i in range(count)]


@pytest.mark.parametrize("name", ["a.jsonl", "b.parquet"])
def test_a_resumed_file_skips_exactly_what_it_read_and_keeps_the_count(tokenizer_dir, tmp_path, monkeypatch, name):
    texts = interleaved(60)
    file = tmp_path / name
    if name.endswith(".jsonl"):
        file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    else:
        write_parquet(file, texts, row_group_size=7)
    cache = str(tmp_path / "cache")
    monkeypatch.setattr(cache_writer, "BATCH_CHARACTERS", 1)  # a batch per document: many commits
    monkeypatch.setattr(cache_writer, "COMPACT_BATCH_CHARACTERS", 1)
    commits, real_commit = [], cache_writer._commit

    def crash_on_the_fifth(*args, **kwargs):
        commits.append(1)
        if len(commits) == 5:
            raise RuntimeError("killed mid-file")
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(cache_writer, "_commit", crash_on_the_fifth)
    with pytest.raises(RuntimeError, match="killed mid-file"):
        cache_writer.tokenize_files([str(file)], cache, tokenizer_dir, rows_per_commit=3)
    ledger = lc.load_ledger(cache)
    assert not ledger.is_finished and ledger.total_num_rows == 9  # three commits of three rows
    dropped = {k: n for k, n in ledger.field_counts.items() if k.startswith(cache_writer.EMPTY_DROPPED + "/")}
    assert sum(dropped.values()) == 4  # and the empty documents among them
    committed = [t for t in texts if t.strip()][:9]
    assert ledger.field_counts["input_ids"] == sum(map(len, framed(tokenizer_dir, committed)))  # and their tokens
    monkeypatch.setattr(cache_writer, "_commit", real_commit)
    resumed = cache_writer.tokenize_files([str(file)], cache, tokenizer_dir, rows_per_commit=3)
    kept = [t for t in texts if t.strip()]
    assert resumed == (len(kept), sum(map(len, framed(tokenizer_dir, kept))), len(texts) - len(kept))
    assert cache_rows(cache) == framed(tokenizer_dir, kept)


def test_fanned_out_files_make_one_sharded_cache_with_their_counts(tokenizer_dir, tmp_path, local_ray):
    for i in range(3):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"{i}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                              for t in interleaved(10 + i)))
    serial = tokenize(str(tmp_path / "serial"), str(tmp_path / "data"), tokenizer_dir, splits={"train": ["*"]})
    fanned = tokenize(str(tmp_path / "fanned"), str(tmp_path / "data"), tokenizer_dir, splits={"train": ["*"]},
                      workers=2)
    empty = sum(1 for n in (10, 11, 12) for t in interleaved(n) if not t.strip())
    assert fanned.splits == serial.splits and serial.splits["train"].empty_documents_dropped == empty == 10
    assert cache_rows(str(tmp_path / "fanned" / "train")) == cache_rows(str(tmp_path / "serial" / "train"))
    # One sharded ledger over the three sub-caches, in the split's folder: no array was copied.
    train = tmp_path / "fanned" / "train"
    ledger = lc.load_ledger(str(train))
    assert ledger.layout == "sharded" and ledger.finished_shards == ["00000", "00001", "00002"]
    assert sorted(p.name for p in train.iterdir() if p.is_dir()) == ["00000", "00001", "00002"]
    assert ledger.field_counts["input_ids"] == serial.splits["train"].tokens
    assert ledger.field_counts == {k: sum(c.get(k, 0) for c in ledger.field_counts_by_shard.values())
                                   for k in ledger.field_counts}  # as Levanter checks on load
    dropped = [k for k in ledger.field_counts if k.startswith(cache_writer.EMPTY_DROPPED + "/")]
    assert len(dropped) == 3 and all(k.split("/", 1)[1].startswith(("00000-", "00001-", "00002-")) for k in dropped)
    assert not (tmp_path / "fanned" / ".parts").exists()  # the claims went with the fan-out


# --- s3:// refused before anything is computed -----------------------------------------------------------
