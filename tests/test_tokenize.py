"""Tokenize into Levanter caches for real: counts, resume after kill -9, tokenizer mismatch, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from marin_assets.pipeline.data.text_files import DatasetError, expand_files
from marin_assets.pipeline.tokens.tokenize import TokenizerMismatchError, tokenize
from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer, train_tokenizer
from tests.support.helpers import ROOT, corpus_and_tokenizer, subprocess_env


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    raw, tok = corpus_and_tokenizer(root, train_documents=6000, validation_documents=200, seed=5, shards=6)
    other = train_tokenizer(str(root / "other"), raw, vocab_size=300).path
    return raw, tok, other


def read_tokens(cache_dir, tokenizer_path):
    """Every row of a cache as training loads it (Levanter's text format, the tokenizer's own processor)."""
    from levanter.data.text.cache import load_lm_dataset_cache
    from levanter.data.text.formats import TextLmDatasetFormat
    from levanter.tokenizers import load_tokenizer

    cache = load_lm_dataset_cache(cache_dir, TextLmDatasetFormat(), load_tokenizer(tokenizer_path))
    return [row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))]


def training_sequences(cache_dir, tokenizer_path, seq_len=64):
    """What Levanter trains on from a text cache: its token stream cut into `seq_len` windows, and the same
    documents packed into `seq_len` examples (`TokenSeqDataset`, `GreedyPrepackedDataset`)."""
    import asyncio

    from levanter.data.packing import GreedyPrepackedDataset
    from levanter.data.text.cache import load_lm_dataset_cache
    from levanter.data.text.datasets import TokenSeqDataset
    from levanter.data.text.formats import TextLmDatasetFormat
    from levanter.tokenizers import load_tokenizer

    cache = load_lm_dataset_cache(cache_dir, TextLmDatasetFormat(), load_tokenizer(tokenizer_path))
    windows = TokenSeqDataset(cache, seq_len)
    packed = GreedyPrepackedDataset(cache.jagged_array_tree(), seq_len, max_segments_per_example=8,
                                    slice_strategy="left")  # as PackedTokenDataset packs

    async def read():
        seqs = await windows.get_batch(list(range(await windows.async_len())))
        packs = await packed.get_batch(list(range(await packed.async_len())))
        return ([s["input_ids"].tolist() for s in seqs],
                [(p["input_ids"].tolist(), segments["input_ids"].tolist()) for p, segments in packs])

    return asyncio.run(read())


def test_tokenize_counts_match_the_tokenizer(inputs, tmp_path):
    raw, tok, _ = inputs
    result = tokenize(str(tmp_path / "c"), raw, tok)
    assert result.splits["train"].documents == 6000 and result.splits["train"].files == 6
    assert result.splits["validation"].documents == 200
    rows = read_tokens(str(tmp_path / "c" / "validation"), tok)
    hf = load_hf_tokenizer(tok)
    from marin_assets.pipeline.data.text_files import iter_documents

    texts = [t for _, _, t in iter_documents(expand_files(raw, ["validation/*"]))]
    assert len(rows) == 200
    assert [list(r) for r in rows] == [hf(t)["input_ids"] for t in texts]  # every row, as transformers encodes
    assert result.splits["validation"].tokens == sum(len(r) for r in rows)
    assert not os.path.exists(tmp_path / "c" / ".parts")


def test_killed_tokenize_resumes_instead_of_restarting(inputs, tmp_path, monkeypatch):
    raw, tok, _ = inputs
    out = tmp_path / "c"
    worker = str(ROOT / "tests" / "support" / "tokenize_worker.py")
    proc = subprocess.Popen([sys.executable, worker, str(out), raw, tok],
                            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = out / "train" / "shard_ledger.json"

    def finished_files() -> list[str]:
        try:
            return json.loads(ledger.read_text())["finished_shards"]
        except (OSError, ValueError, KeyError):
            return []

    deadline = time.time() + 120
    while len(finished_files()) < 2 and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = finished_files()
    assert len(done_before) >= 2, "the worker never finished two files"
    assert not json.loads(ledger.read_text())["is_finished"]
    assert not (out / "validation" / "shard_ledger.json").exists()

    # The resumed run reads only the files the killed one had not finished, and continues the cache.
    import marin_assets.pipeline.tokens.cache_writer as writer_module

    appended, append = [], writer_module._append_file
    monkeypatch.setattr(writer_module, "_append_file", lambda file, *a, **k: (appended.append(file),
                                                                               append(file, *a, **k))[1])
    result = tokenize(str(out), raw, tok, rows_per_commit=200)  # resume in this process
    files = expand_files(raw, ["train/*"])
    assert [f for f in appended if f in files] == files[len(done_before):]
    assert result.splits["train"].documents == 6000
    clean = tmp_path / "clean"
    tokenize(str(clean), raw, tok)
    resumed_rows, clean_rows = read_tokens(str(out / "train"), tok), read_tokens(str(clean / "train"), tok)
    assert len(resumed_rows) == len(clean_rows) == 6000
    assert all(np.array_equal(a, b) for a, b in zip(resumed_rows, clean_rows, strict=True))


def test_reusing_a_cache_with_another_tokenizer_is_refused(inputs, tmp_path):
    raw, tok, other = inputs
    tokenize(str(tmp_path / "c"), raw, tok)
    with pytest.raises(TokenizerMismatchError, match="was built with tokenizer .*refusing to reuse it"):
        tokenize(str(tmp_path / "c"), raw, other)


def test_bad_input_names_file_and_line(tmp_path, inputs):
    _, tok, _ = inputs
    bad = tmp_path / "bad"
    (bad / "train").mkdir(parents=True)
    (bad / "validation").mkdir()
    (bad / "validation" / "v.jsonl").write_text('{"text": "fine"}\n')
    (bad / "train" / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n{"txt": "three"}\n')
    with pytest.raises(DatasetError, match=r"a.jsonl, line 3: no 'text' field"):
        tokenize(str(tmp_path / "c1"), str(bad), tok)
    (bad / "train" / "a.jsonl").write_text('{"text": "one"}\n{oops\n')
    with pytest.raises(DatasetError, match=r"a.jsonl, line 2: malformed JSON"):
        tokenize(str(tmp_path / "c2"), str(bad), tok)
    (bad / "train" / "a.jsonl").write_text("\n\n")
    with pytest.raises(DatasetError, match="split 'train' .* has no documents"):
        tokenize(str(tmp_path / "c3"), str(bad), tok)


def test_files_fan_out_to_ray_tasks_with_identical_output(inputs, tmp_path, local_ray):
    raw, tok, _ = inputs
    tokenize(str(tmp_path / "serial"), raw, tok, splits={"validation": ["validation/*"], "train": ["train/*"]})
    tokenize(str(tmp_path / "ray"), raw, tok, workers=2)
    a, b = read_tokens(str(tmp_path / "serial" / "train"), tok), read_tokens(str(tmp_path / "ray" / "train"), tok)
    assert len(a) == len(b) == 6000 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    # The fanned-out split is six sub-caches read in place; training sees the serial cache's sequences.
    ledger = json.loads((tmp_path / "ray" / "train" / "shard_ledger.json").read_text())
    assert ledger["layout"] == "sharded" and len(ledger["finished_shards"]) == 6
    assert not (tmp_path / "ray" / "train" / "input_ids").exists()  # nothing was copied into one array
    serial, fanned = (training_sequences(str(tmp_path / name / "train"), tok) for name in ("serial", "ray"))
    assert serial == fanned and len(serial[0]) > 100 and len(serial[1]) > 100


def test_bad_input_through_the_step_names_the_asset_and_leaves_no_success(inputs, tmp_path, prefix):
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.status import Status
    from marin_assets.core.step import Step
    from marin_assets.core.stores import read_status
    from tests.support.helpers import FAST

    _, tok, _ = inputs
    bad = tmp_path / "bad"
    (bad / "train").mkdir(parents=True)
    (bad / "train" / "a.jsonl").write_text('{"text": "one"}\n{"text": 7}\n')
    step = Step(name="tokenized/bad-data", fn=lambda out: tokenize(out, str(bad), tok, splits={"train": ["train/*"]}))
    with pytest.raises(DatasetError) as e:
        materialize_step(step, settings=FAST)
    assert "a.jsonl, line 2: 'text' is int, not text" in str(e.value)
    assert "while materializing step 'tokenized/bad-data'" in "".join(e.value.__notes__)
    assert read_status(step.output_path).status is Status.FAILED
    assert not os.path.exists(os.path.join(step.output_path, ".artifact.json"))
