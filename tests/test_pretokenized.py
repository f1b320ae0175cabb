"""Pretokenized caches from a plain fsspec URL: served as a tokenize step that training takes, and
verified before SUCCESS — a corrupted ledger, a truncated or missing array file, an unfinished
cache or another tokenizer fails with the file and what is wrong, and leaves no SUCCESS.
(From the Hub: tests/test_hub_upload.py.)"""

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from marin_assets import StepDefinitionError, load_result, materialize_step
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.tokens.pretokenized import pretokenized_step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizeStep, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.pretrain.step import train_step
from tests.support.helpers import output_files


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tokenized cache materialized as a step (with its `.status.json` and `.artifact.json`), its
    tokenizer, and another tokenizer of the same corpus."""
    prefix = str(tmp_path_factory.mktemp("pretokenized") / "outputs")
    corpus = corpus_step("raw/pretok", train_documents=300, validation_documents=30, seed=2, shards=2)
    tokenizer = bpe_tokenizer_step("tokenizers/pretok-bpe", corpus, vocab_size=400)
    other = bpe_tokenizer_step("tokenizers/pretok-other", corpus, vocab_size=300)
    tokenized = tokenize_step("tokenized/pretok-bpe", corpus, tokenizer)
    for step in (corpus, tokenizer, other, tokenized):
        materialize_step(step, prefix=prefix)
    return SimpleNamespace(prefix=prefix, tokenizer=tokenizer, other=other, tokenized=tokenized,
                           cache=tokenized.output_path_under(prefix))


def test_a_cache_from_a_local_url_is_a_tokenize_step_that_training_takes(made):
    copied = pretokenized_step("tokenized/pretok-copy", f"file://{made.cache}", made.tokenizer)
    assert isinstance(copied, TokenizeStep) and copied.tokenizer == made.tokenizer
    # What a crashed earlier attempt (at an older version of the source) left: a short file, a stale one.
    out = Path(copied.output_path_under(made.prefix))
    data = "train/input_ids/data/c/0"
    (out / data).parent.mkdir(parents=True)
    (out / data).write_bytes((Path(made.cache) / data).read_bytes()[:1000])
    (out / "old-split").mkdir()
    (out / "old-split" / "shard_ledger.json").write_text("{}")
    outcome = materialize_step(copied, prefix=made.prefix)
    assert output_files(outcome.output_path) == output_files(made.cache)  # byte for byte
    cache = load_result(outcome.output_path, TokenizedCache)
    original = load_result(made.cache, TokenizedCache)
    assert cache.path == outcome.output_path and cache.tokenizer == made.tokenizer.output_path_under(made.prefix)
    assert (cache.splits, cache.vocab_size, cache.tokenizer_fingerprint, cache.framing) == (
        original.splits, original.vocab_size, original.tokenizer_fingerprint, original.framing)
    # The source's hidden bookkeeping was not copied over this step's own.
    assert read_record(outcome.output_path).name == "tokenized/pretok-copy"
    assert materialize_step(copied, prefix=made.prefix).cached

    # A training component like a tokenize step: mixed with one of the same tokenizer, not of another.
    train_step("checkpoints/pretok-mix", {"copied": copied, "original": made.tokenized})
    foreign = pretokenized_step("tokenized/pretok-foreign", made.cache, made.other)
    with pytest.raises(StepDefinitionError, match="the mixture mixes tokenizers"):
        train_step("checkpoints/pretok-mixed", {"copied": copied, "foreign": foreign})


def _ledger(split: str, change):
    def mutate(src: Path) -> None:
        path = src / split / "shard_ledger.json"
        ledger = json.loads(path.read_text())
        change(ledger)
        path.write_text(json.dumps(ledger))
    return mutate


def _more_rows(ledger: dict) -> None:
    """A ledger that claims 5 more rows, consistently (its shards add up): only the arrays can tell."""
    ledger["total_num_rows"] += 5
    ledger["shard_rows"][next(iter(ledger["shard_rows"]))] += 5


def _truncate(relative: str, drop: int):
    def mutate(src: Path) -> None:
        path = src / relative
        path.write_bytes(path.read_bytes()[:-drop])
    return mutate


def _write(split: str, array: str, index: int, value: int):
    """Overwrite one element of a split's offsets or data in place (the file stays whole and readable)."""
    def mutate(src: Path) -> None:
        import numpy as np

        from marin_assets.pipeline.tokens import levanter_cache as lc

        store = lc.open_store({"input_ids": np.zeros((0,), dtype=np.int32)}, str(src / split), mode="a")
        getattr(store.tree["input_ids"], array)[index].write(value).result()
    return mutate


BAD = {
    "corrupted_ledger": (_ledger("train", _more_rows), False,
                         r"^PretokenizedCacheError: (?P<out>.+)/train/input_ids/offsets/c/0: holds 300 rows, but"
                         r" (?P=out)/train/shard_ledger\.json says 305$"),
    "malformed_ledger": (lambda src: (src / "validation" / "shard_ledger.json").write_text('{"total_num_rows": 3'),
                         False, r"^PretokenizedCacheError: .+/validation/shard_ledger\.json: not a Levanter ledger"
                                r" \(JSONDecodeError: Expecting ',' delimiter: line 1 column 21 \(char 20\)\)$"),
    "unfinished": (_ledger("train", lambda ledger: ledger.update(is_finished=False)), False,
                   r"^PretokenizedCacheError: .+/train/shard_ledger\.json: the cache is not finished \(is_finished is"
                   r" false after 300 rows\)$"),
    "truncated_array": (_truncate("train/input_ids/data/c/0", 100), False,
                        r"^PretokenizedCacheError: .+/train/input_ids/data/c/0: unreadable: truncated or corrupt"
                        r" \(DATA_LOSS: Error reading shard entry \{0\}/\{\d+\}: Error reading shard index: Digest"
                        r" mismatch, stored digest is 0x[0-9a-f]+ but computed digest is 0x[0-9a-f]+\)$"),
    "missing_array_file": (lambda src: os.remove(src / "validation/input_ids/data/c/0"), False,
                           r"^PretokenizedCacheError: .+/validation/input_ids/data/c/0: missing \(the [\d,]+ token ids"
                           r" of 30 rows are in it\)$"),
    "offsets_out_of_order": (_write("train", "offsets", 11, 3), False,
                             r"^PretokenizedCacheError: .+/train/input_ids/offsets/c/0: row offsets are corrupt: row 10"
                             r" ends before it starts$"),
    "id_outside_vocabulary": (_write("validation", "data", 7, 5000), False,
                              r"^PretokenizedCacheError: .+/validation/input_ids/data: token id 5000 at position 7 is"
                              r" outside the tokenizer's 400 ids$"),
    "wrong_tokenizer": (lambda src: None, True,
                        r"^TokenizerMismatchError: .+/tokenizer_fingerprint\.json: the cache was made with tokenizer"
                        r" .+/tokenizers/pretok-bpe_\w+ \(fingerprint \w+\), not with .+/tokenizers/pretok-other_\w+"
                        r" \(fingerprint \w+\)$"),
    "no_fingerprint": (lambda src: os.remove(src / "tokenizer_fingerprint.json"), False,
                       r"^TokenizerMismatchError: .+/tokenizer_fingerprint\.json: missing, so nothing says which"
                       r" tokenizer made this cache; a cache made by a tokenize step \(and uploaded with it\)"
                       r" has one$"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_cache_fails_clearly_and_never_succeeds(made, tmp_path, case):
    mutate, other_tokenizer, error = BAD[case]
    source = tmp_path / "source"
    shutil.copytree(made.cache, source, ignore=shutil.ignore_patterns(".*"))
    mutate(source)
    step = pretokenized_step(f"tokenized/bad-{case.replace('_', '-')}", str(source),
                             made.other if other_tokenizer else made.tokenizer)
    with pytest.raises(Exception) as failed:
        materialize_step(step, prefix=made.prefix)
    out = step.output_path_under(made.prefix)
    assert re.match(error, f"{type(failed.value).__name__}: {failed.value}"), str(failed.value)
    notes = failed.value.__notes__
    assert notes[-1] == f"(while materializing step {step.name!r} at {out})"
    if case in ("wrong_tokenizer", "no_fingerprint"):  # refused from the source, before anything is copied
        assert len(notes) == 1 and f"{source}/tokenizer_fingerprint.json" in str(failed.value)
        assert not os.path.exists(os.path.join(out, "train"))
    else:  # found in the copy, which says where it came from
        assert notes[0] == f"(the cache was copied from {source})"
    print(f"\n{case}: {type(failed.value).__name__}: {failed.value}")
    assert read_status(out).status is Status.FAILED
    with pytest.raises(RecordNotAvailableError):
        read_record(out)


def test_a_chat_cache_comes_back_as_a_chat_cache_with_its_masks_verified(made, tmp_path):
    """A chat cache (ids and assistant masks) downloaded is a chat cache again: same template, same loss
    tokens, so training reads it in Levanter's chat format; a mask that is not 0/1 is refused."""
    import numpy as np

    from marin_assets.pipeline.tokens import levanter_cache as lc
    from marin_assets.pipeline.tokens.chat import chat_tokenize
    from marin_assets.pipeline.training.levanter_data import cache_format
    from tests.support.chat import write_chat_dataset

    tokenizer = made.tokenizer.output_path_under(made.prefix)
    dataset = write_chat_dataset(tmp_path / "chat", train=12, validation=3, seed=5)
    made_here = chat_tokenize(str(tmp_path / "chat-cache"), dataset, tokenizer)
    copied = pretokenized_step("tokenized/pretok-chat", f"file://{made_here.path}", made.tokenizer)
    cache = materialize_step(copied, prefix=made.prefix).record.result
    assert cache["chat_template"] == made_here.chat_template
    assert cache["assistant_tokens"] == made_here.assistant_tokens and all(made_here.assistant_tokens.values())
    assert type(cache_format(cache["path"])).__name__ == "ChatLmDatasetFormat"

    broken = tmp_path / "broken"
    shutil.copytree(made_here.path, broken)
    store = lc.open_store({"input_ids": np.zeros((0,), np.int32), "assistant_masks": np.zeros((0,), np.int32)},
                          str(broken / "train"), mode="a")
    store.tree["assistant_masks"].data[3].write(7).result()
    bad = pretokenized_step("tokenized/pretok-chat-bad", f"file://{broken}", made.tokenizer)
    with pytest.raises(Exception, match=r"train/assistant_masks/data: value 7 at position 3 is not a 0/1 assistant"):
        materialize_step(bad, prefix=made.prefix)
    assert read_status(bad.output_path_under(made.prefix)).status is Status.FAILED


def test_a_sharded_cache_is_verified_sub_cache_by_sub_cache(made, tmp_path):
    """A split tokenized by a fan-out is sub-caches tied by a sharded ledger: downloaded, it counts as the
    serial cache does; an id outside the vocabulary in one sub-cache, or a ledger Levanter would refuse, fails."""
    from marin_assets.pipeline.tokens.tokenize import tokenize

    corpus = made.tokenized.deps[0].output_path_under(made.prefix)
    tokenizer = made.tokenizer.output_path_under(made.prefix)
    sharded = tokenize(str(tmp_path / "sharded"), corpus, tokenizer, workers=2)  # in process: no Ray here
    assert json.loads((tmp_path / "sharded" / "train" / "shard_ledger.json").read_text())["layout"] == "sharded"
    copied = pretokenized_step("tokenized/pretok-sharded", f"file://{sharded.path}", made.tokenizer)
    cache = load_result(materialize_step(copied, prefix=made.prefix).output_path, TokenizedCache)
    assert cache.splits == sharded.splits == load_result(made.cache, TokenizedCache).splits

    broken = tmp_path / "broken-id"
    shutil.copytree(sharded.path, broken)
    _write("train/00001", "data", 7, 5000)(broken)
    bad = pretokenized_step("tokenized/pretok-sharded-bad-id", f"file://{broken}", made.tokenizer)
    with pytest.raises(Exception, match=r"train/00001/input_ids/data: token id 5000 at position 7 is outside"):
        materialize_step(bad, prefix=made.prefix)

    broken = tmp_path / "broken-counts"
    shutil.copytree(sharded.path, broken)
    _ledger("train", lambda ledger: ledger["field_counts"].update(input_ids=ledger["field_counts"]["input_ids"] + 1))(
        broken)
    bad = pretokenized_step("tokenized/pretok-sharded-bad-counts", f"file://{broken}", made.tokenizer)
    with pytest.raises(Exception, match=r"train/shard_ledger\.json: not a valid sharded ledger \(ValueError: Sharded"
                                        r" cache ledger field count mismatch"):
        materialize_step(bad, prefix=made.prefix)
    assert read_status(bad.output_path_under(made.prefix)).status is Status.FAILED
