"""SFT on chat data, for real: conversations (OpenAI and ShareGPT, JSON lines and parquet) answered with
the standard library's docstrings → a Levanter chat cache whose loss weights are exactly the assistant's
tokens → a tiny Llama pretrained on those docstrings, fine-tuned from its export and from its checkpoint →
export and evaluation on the held-out conversations. Bad conversations fail naming file and line or row.

One small pipeline is built once for the module (a 512-id BPE, a one-layer Llama, a few steps each)."""

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from marin_assets import Step, StepDefinitionError, build_definitions, load_result, materialize_step
from marin_assets.core.step import walk
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.evals.loss import EvalResult, evaluate_lm, loss_eval_step
from marin_assets.pipeline.tokens import chat as chat_module
from marin_assets.pipeline.tokens.chat import (
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplateError,
    chat_template_for,
    chat_tokenize_step,
    tokenize_chat_files,
)
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step, load_hf_tokenizer
from marin_assets.pipeline.training.export import ExportResult, export_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.sft.step import sft_step
from marin_assets.pipeline.training.sources import from_checkpoint, from_hf
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.chat import (
    assistant_positions,
    conversations,
    parquet_bytes,
    sharegpt,
    write_chat_dataset,
    write_docs_dataset,
    write_jsonl,
)

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=128)
TRAIN, VALIDATION, SEED = 60, 12, 0
"""Conversations in the chat dataset's splits (`write_chat_dataset`), and their seed."""
SFT_TRAINER = TrainerSpec(num_train_steps=12, train_batch_size=4, checkpoint_every=50, steps_per_eval=50,
                          max_eval_batches=None)
SFT_LR = OptimizerSpec(learning_rate=1e-2, weight_decay=0.0, warmup=0.0, lr_schedule="constant")


class Pipeline:
    """The module's steps under one prefix, materialized on demand (each at most once)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.docs = Step(name="raw/docs", fn=lambda out: write_docs_dataset(Path(out)), hash_attrs={"v": 1})
        self.bpe = bpe_tokenizer_step("tokenizers/docs-bpe", self.docs, vocab_size=512)
        self.tokenized = tokenize_step("tokenized/docs", self.docs, self.bpe)
        self.base = train_step("checkpoints/base", {"docs": self.tokenized}, TINY, OptimizerSpec(learning_rate=1e-2),
                               TrainerSpec(num_train_steps=8, train_batch_size=8, checkpoint_every=50,
                                           steps_per_eval=50, max_eval_batches=1))
        self.base_export = export_step("exports/base", self.base)
        self.chat_data = Step(name="raw/chat", fn=lambda out: write_chat_dataset(Path(out), TRAIN, VALIDATION, SEED),
                              hash_attrs={"train": TRAIN, "validation": VALIDATION, "seed": SEED})
        self.chat = chat_tokenize_step("tokenized/chat", self.chat_data, self.bpe)
        longer = replace(TINY, seq_len=256)  # Llama: positions are not weights
        self.sft = sft_step("checkpoints/sft", {"chat": self.chat}, from_hf(self.base_export), longer, SFT_LR,
                            SFT_TRAINER)
        self.sft_from_checkpoint = sft_step("checkpoints/sft-from-checkpoint", {"chat": self.chat},
                                            from_checkpoint(self.base), longer, SFT_LR,
                                            replace(SFT_TRAINER, num_train_steps=2))
        self.sft_export = export_step("exports/sft", self.sft)
        self.base_eval = loss_eval_step("evals/base-chat", self.base, {"chat": self.chat})
        self.sft_eval = loss_eval_step("evals/sft-chat", self.sft, {"chat": self.chat})

    def result(self, step: Step, kind: type):
        """Materialize `step` and what it reads; its typed result."""
        for each in walk([step]):
            materialize_step(each, prefix=self.prefix)
        return load_result(step.output_path_under(self.prefix), kind)

    def path(self, step: Step) -> str:
        return step.output_path_under(self.prefix)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return Pipeline(str(tmp_path_factory.mktemp("sft") / "outputs"))


# --- the chat cache: loss weights are exactly the assistant's tokens --------------------------------

def levanter_chat_examples(pipeline, seq_len: int = 512):
    """Levanter's own datasets over the chat cache, as training (train split) and evaluation (validation)
    read them through our data config: split → the packed examples as numpy (tokens, loss, segment ids)."""
    import haliax as hax
    import jax
    from levanter.data.text.datasets import ChatDataset

    from marin_assets.pipeline.training.levanter_data import data_config

    cache = pipeline.result(pipeline.chat, TokenizedCache)
    config = data_config(pipeline.path(pipeline.bpe), {"chat": cache.path}, {"chat": 1.0})
    Pos = hax.Axis("position", seq_len)
    train = config.train_sets(Pos, key=jax.random.PRNGKey(0), initial_batch_size=4)["chat"]  # what the mixture mixes
    validation = config.validation_sets(Pos)["chat"]  # what evaluation reads: named examples over the same kind
    assert isinstance(train, ChatDataset) and isinstance(validation.dataset, ChatDataset), (train, validation)
    examples = {}
    synced = train.as_sync_dataset()
    examples["train"] = [(np.asarray(ex.tokens), np.asarray(ex.loss_weight), np.asarray(ex.attn_mask.segment_ids[0]))
                         for ex in (synced[i] for i in range(len(synced)))]
    synced = validation.as_sync_dataset()
    examples["validation"] = [(np.asarray(ex.tokens.array), np.asarray(ex.loss_weight.array),
                               np.asarray(ex.attn_mask.segment_ids[0].array))
                              for ex in (synced[i] for i in range(len(synced)))]
    return cache, examples


def test_the_loss_falls_exactly_on_the_assistant_tokens(pipeline):
    cache, examples = levanter_chat_examples(pipeline)
    tokenizer = load_hf_tokenizer(pipeline.path(pipeline.bpe))
    convs = conversations(TRAIN + VALIDATION, SEED)
    expected_convs = {"train": convs[:TRAIN], "validation": convs[TRAIN:]}
    assert cache.chat_template == DEFAULT_CHAT_TEMPLATE
    assert {s: (st.documents, st.files) for s, st in cache.splits.items()} == {"train": (TRAIN, 3),
                                                                               "validation": (VALIDATION, 1)}
    for split, packed in examples.items():
        seen, weighted = [], 0
        for tokens, loss, segments in packed:
            assert not loss[segments < 0].any(), "padding carries no loss"
            weighted += int(loss.sum())
            for segment in np.unique(segments[segments >= 0]):
                where = np.flatnonzero(segments == segment)
                start, end = int(where[0]), int(where[-1]) + 1
                conv = expected_convs[split][len(seen)]  # conversations are packed in the cache's order
                seen.append(conv)
                ids = tokenizer.apply_chat_template(conv, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=True,
                                                    return_dict=False)
                assert tokens[start:end].tolist() == ids  # the whole conversation, untruncated
                # Position i's weight is for predicting token i + 1: the weighted targets must be exactly the
                # assistant tokens found by rendering each prefix — no system or user token, none missed.
                targets = {i + 1 - start for i in range(start, end) if loss[i]}
                assert targets == assistant_positions(tokenizer, DEFAULT_CHAT_TEMPLATE, conv), (split, len(seen))
                answers = "".join(t["content"].strip() + tokenizer.eos_token for t in conv if t["role"] == "assistant")
                assert tokenizer.decode([ids[t] for t in sorted(targets)]) == answers
                assert not any(t["content"].strip() in tokenizer.decode([ids[t] for t in sorted(targets)])
                               for t in conv if t["role"] != "assistant")
        assert seen == expected_convs[split]
        assert weighted == cache.assistant_tokens[split] < cache.splits[split].tokens / 2


def test_both_forms_read_alike_and_the_default_template_is_identity(pipeline, tmp_path, monkeypatch):
    tok = pipeline.path(pipeline.bpe)
    processor = chat_module._chat_processor(load_hf_tokenizer(tok), DEFAULT_CHAT_TEMPLATE)
    convs = conversations(6, seed=5)
    write_jsonl(tmp_path / "openai.jsonl", [{"messages": c} for c in convs])
    (tmp_path / "sharegpt.parquet").write_bytes(parquet_bytes([{"conversations": sharegpt(c)} for c in convs], 2))
    rows = {}
    for name in ("openai.jsonl", "sharegpt.parquet"):
        cache = str(tmp_path / f"cache-{name}")
        assert tokenize_chat_files([str(tmp_path / name)], cache, processor)[0] == 6
        from marin_assets.pipeline.tokens import levanter_cache as lc
        store = lc.open_store(processor.output_exemplar, cache, mode="r")
        rows[name] = [(store[i]["input_ids"].tolist(), store[i]["assistant_masks"].tolist()) for i in range(6)]
    assert rows["openai.jsonl"] == rows["sharegpt.parquet"]

    step = chat_tokenize_step("tokenized/c", pipeline.chat_data, pipeline.bpe)
    assert step.hash_attrs["default_chat_template"] == DEFAULT_CHAT_TEMPLATE
    monkeypatch.setattr(chat_module, "DEFAULT_CHAT_TEMPLATE", DEFAULT_CHAT_TEMPLATE.replace("<|", "<<"))
    assert chat_tokenize_step("tokenized/c", pipeline.chat_data, pipeline.bpe).hash != step.hash
    given = chat_tokenize_step("tokenized/c", pipeline.chat_data, pipeline.bpe, chat_template=DEFAULT_CHAT_TEMPLATE)
    assert given.hash != step.hash and given.hash_attrs["chat_template"] == DEFAULT_CHAT_TEMPLATE


# --- SFT: from an export, from a checkpoint; export and evaluate the result --------------------------

def test_sft_from_a_pretrained_model_makes_the_assistant_loss_fall(pipeline, tmp_path):
    sft = pipeline.result(pipeline.sft, TrainResult)
    assert sft.initialized_from == pipeline.path(pipeline.base_export)
    losses = [loss for _, loss in sft.loss_curve]  # the training loss: the assistant tokens' loss
    assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses
    base_eval = pipeline.result(pipeline.base_eval, EvalResult)
    sft_eval = pipeline.result(pipeline.sft_eval, EvalResult)
    # Held-out conversations, assistant tokens only: the fine-tuned model predicts them far better.
    assert sft_eval.per_dataset["chat"]["loss"] < base_eval.per_dataset["chat"]["loss"] - 0.5, (base_eval, sft_eval)

    exported = pipeline.result(pipeline.sft_export, ExportResult)
    with open(os.path.join(exported.path, "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForCausalLM"]
    cache = pipeline.result(pipeline.chat, TokenizedCache)
    again = evaluate_lm(str(tmp_path / "eval-export"), exported.path, sft.model, sft.tokenizer, {"chat": cache.path},
                        vocab_size=sft.vocab_size)
    assert abs(again.loss - sft_eval.loss) < 1e-3  # the export is the fine-tuned model


def test_sft_from_a_levanter_checkpoint_starts_from_the_same_weights(pipeline):
    from_export = pipeline.result(pipeline.sft, TrainResult)
    from_ckpt = pipeline.result(pipeline.sft_from_checkpoint, TrainResult)
    base = pipeline.result(pipeline.base, TrainResult)
    assert from_ckpt.initialized_from == base.checkpoint_path()
    # Same weights (the base's last checkpoint, exported or not), data order and seed: the same first loss.
    assert abs(from_ckpt.loss_curve[0][1] - from_export.loss_curve[0][1]) < 1e-4


def test_sft_definition_errors(pipeline):
    with pytest.raises(StepDefinitionError, match="none of its components \\['docs'\\] is a chat cache"):
        sft_step("checkpoints/x", {"docs": pipeline.tokenized}, from_hf(pipeline.base_export), TINY)
    with pytest.raises(StepDefinitionError, match="init_from must say where the pretrained weights are"):
        sft_step("checkpoints/x", {"chat": pipeline.chat}, pipeline.base_export, TINY)
    assert sft_step("checkpoints/x", {"chat": pipeline.chat}, from_checkpoint(pipeline.base)).model == TINY
    folder = pipeline.result(pipeline.base_export, ExportResult).path
    with pytest.raises(StepDefinitionError, match="give model= \\(the ModelSpec of the weights in"):
        sft_step("checkpoints/x", {"chat": pipeline.chat}, from_hf(folder))
    with pytest.raises(StepDefinitionError, match="the chat template has no \\{% generation %\\} block"):
        chat_tokenize_step("tokenized/x", pipeline.chat_data, pipeline.bpe, chat_template="{{ messages }}")


# --- bad conversations ------------------------------------------------------------------------------

def test_a_bad_conversation_names_its_row_and_a_fixed_file_resumes(pipeline, tmp_path):
    tok = pipeline.path(pipeline.bpe)
    processor = chat_module._chat_processor(load_hf_tokenizer(tok), DEFAULT_CHAT_TEMPLATE)
    good, later = conversations(5, seed=1), conversations(40, seed=2)
    bad = [{"conversations": sharegpt(c)} for c in later]
    bad[37]["conversations"][1]["from"] = "bot"
    write_jsonl(tmp_path / "data" / "a.jsonl", [{"messages": c} for c in good])
    (tmp_path / "data" / "b.parquet").write_bytes(parquet_bytes(bad, row_group_size=16))
    files = [str(tmp_path / "data" / "a.jsonl"), str(tmp_path / "data" / "b.parquet")]
    cache = str(tmp_path / "cache")
    with pytest.raises(DatasetError, match=r"b\.parquet, row 38: turn 2 has from 'bot', not one of 'system',"
                                           r" 'human', 'gpt'"):
        tokenize_chat_files(files, cache, processor)
    from marin_assets.pipeline.tokens import levanter_cache as lc
    ledger = lc.load_ledger(cache)
    assert (ledger.total_num_rows, len(ledger.finished_shards), ledger.is_finished) == (5, 1, False)

    bad[37]["conversations"][1]["from"] = "gpt"
    (tmp_path / "data" / "b.parquet").write_bytes(parquet_bytes(bad, row_group_size=16))
    resumed = tokenize_chat_files(files, cache, processor)
    fresh = tokenize_chat_files(files, str(tmp_path / "fresh"), processor)
    assert resumed == fresh and resumed[0] == 45
    store, clean = (lc.open_store(processor.output_exemplar, c, mode="r") for c in (cache, str(tmp_path / "fresh")))
    assert all(store[i]["input_ids"].tolist() == clean[i]["input_ids"].tolist() for i in range(45))


def test_a_template_that_marks_no_assistant_token_is_refused(pipeline):
    tokenizer = load_hf_tokenizer(pipeline.path(pipeline.bpe))
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="the tokenizer's own chat template has no \\{% generation %\\}"):
        chat_template_for(tokenizer)
    assert chat_template_for(tokenizer, DEFAULT_CHAT_TEMPLATE) == DEFAULT_CHAT_TEMPLATE


def test_the_experiment_is_the_demo_then_sft():
    from marin_assets.experiments import python_docs, sft_chat

    pipeline = sft_chat.pipeline
    assert pipeline["train"] is python_docs.pipeline["train"]  # pretraining is the demo's, reused
    sft = pipeline["sft"]
    assert sft.init_from.source is python_docs.pipeline["export"] and "sft" in sft.kinds
    assert pipeline["chat"].deps == (pipeline["chat_data"], python_docs.pipeline["tokenizer"])
    assert {s.name for s in walk(sft_chat.steps)} >= {"checkpoints/python-docs-chat-sft", "evals/python-docs-chat-base"}
    specs = {s.key.to_user_string(): s for s in build_definitions(sft_chat.steps).resolve_all_asset_specs()}
    assert {"sft", "train"} <= set(specs["checkpoints/python-docs-chat-sft"].kinds)
