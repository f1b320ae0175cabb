"""Assistant masks from character spans: a token carries loss only if every character it covers is the
assistant's. With a SentencePiece tokenizer (Metaspace, its normalizer turning the header's newline into `▁`)
the answer's first word fuses with the template's newline (`▁Return` covers `\\nReturn`): transformers'
mask takes that token in, so loss would fall on the template's newline; ours leaves it out. With byte-level
BPEs, which split there, both rules give the same masks."""

import json

import numpy as np
import pytest

from marin_assets.pipeline.tokens import chat as chat_module
from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE, chat_tokenize, render_chats, span_masks
from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer, train_tokenizer
from tests.support.chat import conversations, doc_answers, write_docs_dataset
from tests.support.real_tokenizers import cl100k_folder, sentencepiece_folder

CONVERSATIONS = conversations(40, seed=3)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-masks")
    write_docs_dataset(root / "docs")
    texts = [answer for _, answer in doc_answers()] * 3
    return {"sentencepiece": sentencepiece_folder(root / "sp", texts, vocab_size=400),
            "bpe": train_tokenizer(str(root / "bpe"), str(root / "docs"), vocab_size=512).path,
            "cl100k": cl100k_folder(root / "cl100k")}


def transformers_rendering(tokenizer, conversation):
    """transformers' own ids and mask (`apply_chat_template`'s: from the token holding a block's first character)."""
    out = tokenizer.apply_chat_template(conversation, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    return out["input_ids"], out["assistant_masks"]


def spans_and_offsets(tokenizer, conversation):
    from transformers.utils.chat_template_utils import render_jinja_template

    (text,), (spans,) = render_jinja_template(conversations=[conversation], chat_template=DEFAULT_CHAT_TEMPLATE,
                                              return_assistant_tokens_mask=True, **tokenizer.special_tokens_map)
    return text, spans, tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]


def test_span_masks_take_only_tokens_wholly_inside():
    offsets = [(0, 3), (3, 5), (5, 9), (9, 9), (9, 12), (12, 12), (12, 15)]
    assert span_masks(offsets, [(4, 12)]).tolist() == [0, 0, 1, 1, 1, 0, 0]  # (3, 5) straddles the start
    assert span_masks(offsets, [(0, 5), (9, 15)]).tolist() == [1, 1, 0, 1, 1, 1, 1]
    assert span_masks([], [(0, 5)]).tolist() == []


def test_a_sentencepiece_token_across_the_header_carries_no_loss(folders):
    tokenizer = load_hf_tokenizer(folders["sentencepiece"])
    rows = render_chats(tokenizer, DEFAULT_CHAT_TEMPLATE, CONVERSATIONS)
    fused = 0
    for conversation, row in zip(CONVERSATIONS, rows, strict=True):
        ids, theirs = transformers_rendering(tokenizer, conversation)
        assert row["input_ids"].tolist() == ids  # the same ids as apply_chat_template
        text, spans, offsets = spans_and_offsets(tokenizer, conversation)
        ours = row["assistant_masks"].tolist()
        for (start, end), mine, their in zip(offsets, ours, theirs, strict=True):
            inside = any(a <= start and end <= b for a, b in spans)
            assert mine == int(inside), (text[start:end], mine)
            if their and not inside:  # transformers trains on template text here
                assert text[start] == "\n", repr(text[start:end])
                fused += 1
        # every character of every answer is in a masked token, but those of a token fused across a boundary
        # (and those the normalizer drops, which no token covers: the second of two spaces)
        tokens_cover = set().union(*(range(s, e) for s, e in offsets))
        masked_cover = set().union(*(range(s, e) for (s, e), m in zip(offsets, ours, strict=True) if m))
        for a, b in spans:
            missed = [i for i in range(a, b) if i in tokens_cover and i not in masked_cover]
            straddling = [(s, e) for s, e in offsets if s < a < e or s < b < e]
            assert all(any(s <= i < e for s, e in straddling) for i in missed), text[a:b]
        learned = tokenizer.decode([i for i, m in zip(ids, ours, strict=True) if m])
        assert "<|" not in learned and learned.endswith(tokenizer.eos_token)  # no header; the EOS to stop
    assert fused > 5, "the tokenizer never fused the header's newline with an answer: the test shows nothing"


@pytest.mark.parametrize("name", ["bpe", "cl100k"])
def test_byte_level_bpe_masks_are_what_transformers_makes(folders, name):
    tokenizer = load_hf_tokenizer(folders[name])
    for conversation, row in zip(CONVERSATIONS, render_chats(tokenizer, DEFAULT_CHAT_TEMPLATE, CONVERSATIONS),
                                 strict=True):
        ids, theirs = transformers_rendering(tokenizer, conversation)
        assert row["input_ids"].tolist() == ids and row["assistant_masks"].tolist() == theirs


def test_the_chat_cache_holds_the_span_masks(folders, tmp_path):
    from marin_assets.pipeline.tokens import levanter_cache as lc

    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "a.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n"
                                                                 for c in CONVERSATIONS))
    tokenizer_path = folders["sentencepiece"]
    result = chat_tokenize(str(tmp_path / "cache"), str(tmp_path / "data"), tokenizer_path)
    tokenizer = load_hf_tokenizer(tokenizer_path)
    expected = render_chats(tokenizer, DEFAULT_CHAT_TEMPLATE, CONVERSATIONS)
    exemplar = chat_module.chat_exemplar(tokenizer, DEFAULT_CHAT_TEMPLATE)
    store = lc.open_store(exemplar, str(tmp_path / "cache" / "train"), mode="r")
    assert len(store) == len(CONVERSATIONS)
    for i, row in enumerate(expected):
        assert np.array_equal(store[i]["input_ids"], row["input_ids"])
        assert np.array_equal(store[i]["assistant_masks"], row["assistant_masks"])
    assert result.assistant_tokens["train"] == sum(int(r["assistant_masks"].sum()) for r in expected)
    assert lc.load_ledger(str(tmp_path / "cache" / "train")).metadata.preprocessor_metadata["chat_template"] == \
        DEFAULT_CHAT_TEMPLATE  # Levanter's metadata, as ChatLmDatasetFormat reads it
