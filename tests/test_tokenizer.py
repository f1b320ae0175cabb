"""Corpus generation and tokenizer steps, for real on tiny inputs."""

import gzip
import json
import os

import pytest

from marin_assets.pipeline.data.corpus import generate_corpus
from marin_assets.pipeline.data.text_files import DatasetError
from marin_assets.pipeline.tokens.tokenizer import (
    TokenizerError,
    adopt_tokenizer,
    load_hf_tokenizer,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("corpus") / "raw")
    return out, generate_corpus(out, train_documents=600, validation_documents=50, seed=3, shards=2)


def read_texts(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["text"] for line in f]


def test_corpus_is_deterministic_and_validation_is_held_out(corpus, tmp_path):
    out, files = corpus
    assert files.train_files == ["train/shard-00000.jsonl.gz", "train/shard-00001.jsonl.gz"]
    again = str(tmp_path / "again")
    generate_corpus(again, train_documents=600, validation_documents=50, seed=3, shards=2)
    for rel in files.train_files + files.validation_files:
        assert open(os.path.join(out, rel), "rb").read() == open(os.path.join(again, rel), "rb").read()
    train = set(sum((read_texts(os.path.join(out, f)) for f in files.train_files), []))
    validation = read_texts(os.path.join(out, files.validation_files[0]))
    assert len(validation) == 50 and len(train) > 500
    assert len(set(validation) & train) < 5  # different seeds: (nearly) no overlap


def test_trained_tokenizer_loads_offline_and_roundtrips(corpus, tmp_path):
    out, _ = corpus
    info = train_tokenizer(str(tmp_path / "tok"), out, vocab_size=400)
    assert info.documents == 600 and 256 < info.vocab_size <= 400
    tok = load_hf_tokenizer(info.path)
    text = "Once upon a time, there was a little fox named Zoe."
    ids = tok(text)["input_ids"]
    assert ids[0] == ids[-1] == tok.eos_token_id  # the tokenizer itself frames documents with EOS
    assert tok.decode(ids, skip_special_tokens=True) == text and len(ids) < len(text) / 2
    assert tok.eos_token == "<|endoftext|>" and "token_type_ids" not in tok(text)
    from levanter.compat.hf_checkpoints import load_tokenizer

    assert load_tokenizer(info.path).vocab_size == tok.vocab_size


def test_vocab_too_small_and_bad_data_are_clear_errors(corpus, tmp_path):
    out, _ = corpus
    with pytest.raises(TokenizerError, match="vocab_size 100 is too small"):
        train_tokenizer(str(tmp_path / "a"), out, vocab_size=100)
    bad = tmp_path / "bad" / "train"
    bad.mkdir(parents=True)
    (bad / "x.jsonl").write_text('{"text": "fine"}\n{"text": "broken\n')
    with pytest.raises(DatasetError, match=r"x.jsonl, line 2: malformed JSON"):
        train_tokenizer(str(tmp_path / "b"), str(tmp_path / "bad"), vocab_size=300)
    (bad / "x.jsonl").write_text('{"content": "no text field"}\n')
    with pytest.raises(DatasetError, match=r"x.jsonl, line 1: no 'text' field"):
        train_tokenizer(str(tmp_path / "c"), str(tmp_path / "bad"), vocab_size=300)
    with pytest.raises(DatasetError, match="no files match"):
        train_tokenizer(str(tmp_path / "d"), str(tmp_path / "empty"), vocab_size=300)


def test_adopting_a_folder_copies_it_and_a_broken_one_fails(corpus, tmp_path):
    out, _ = corpus
    trained = train_tokenizer(str(tmp_path / "tok"), out, vocab_size=400)
    adopted = adopt_tokenizer(str(tmp_path / "adopted"), trained.path)
    assert adopted.vocab_size == trained.vocab_size and os.path.exists(tmp_path / "adopted" / "tokenizer.json")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="does not load"):
        adopt_tokenizer(str(tmp_path / "x"), str(broken))
