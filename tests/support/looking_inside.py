"""Two tiny models with different tokenizers — a byte-level BPE trained by the pipeline and a SentencePiece Unigram
(Llama-style: `▁` word boundaries, `<unk>` for characters it lacks, whitespace runs collapsed by its normalizer) —
trained a few steps on the demo's real text (this Python's documentation), with their exports. Shared by the
log-probs and perplexity-gap tests: every step is content-addressed, so modules building them under one prefix
(`shared_prefix`) train them once per session."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from marin_assets.core.materialize import materialize_step
from marin_assets.core.step import Step, walk
from marin_assets.pipeline.data.python_docs import python_docs_step
from marin_assets.pipeline.data.text_files import expand_files, iter_documents
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step, existing_tokenizer_step
from marin_assets.pipeline.training.export import export_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from tests.support.real_tokenizers import sentencepiece_folder

MODEL = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=128)
"""Documents of the demo's text are often longer than 128 tokens: scoring them needs windows."""
TRAIN_FILES = ("train/shard-00000.*",)
"""Half the corpus's training text: plenty for four steps, half the tokenizing."""
TRAINER = TrainerSpec(num_train_steps=4, train_batch_size=4, checkpoint_every=2, steps_per_eval=2, max_eval_batches=1)


def shared_prefix(tmp_path_factory) -> str:
    """One storage prefix for the whole session (pytest's base temporary folder), whichever module asks first."""
    return str(tmp_path_factory.getbasetemp() / "looking-inside")


def build(prefix: str) -> dict[str, Step]:
    """The steps (corpus materialized first: the SentencePiece tokenizer is trained on its text); none trained."""
    corpus = python_docs_step("raw/inside-docs")
    materialize_step(corpus, prefix=prefix)
    folder = Path(prefix) / "sources" / "sentencepiece"
    if not (folder / "tokenizer.json").exists():
        files = expand_files(corpus.output_path_under(prefix), list(TRAIN_FILES))
        texts = [text for _, _, text in iter_documents(files)][:1000]
        os.makedirs(folder, exist_ok=True)
        sentencepiece_folder(folder, texts, vocab_size=500)
    tokenizers = {"bpe": bpe_tokenizer_step("tokenizers/inside-bpe", corpus, vocab_size=300, files=TRAIN_FILES),
                  "sp": existing_tokenizer_step("tokenizers/inside-sp", str(folder))}
    steps: dict[str, Step] = {"corpus": corpus}
    for kind, tokenizer in tokenizers.items():
        tokenized = tokenize_step(f"tokenized/inside-{kind}", corpus, tokenizer,
                                  splits={"train": list(TRAIN_FILES), "validation": ["validation/*"]})
        train = train_step(f"checkpoints/inside-{kind}", {"docs": tokenized}, MODEL, OptimizerSpec(learning_rate=1e-2),
                           TRAINER)
        steps.update({f"tokenizer_{kind}": tokenizer, f"tokenized_{kind}": tokenized, f"train_{kind}": train,
                      f"export_{kind}": export_step(f"exports/inside-{kind}", train)})
    return steps


@contextlib.contextmanager
def looking_inside(tmp_path_factory, *wanted: str) -> Iterator[tuple[dict[str, Step], str]]:
    """The session's steps (`build`) and prefix, the steps named in `wanted` materialized with what they read, while
    `MARIN_PREFIX` names that prefix (a step's own function reads its inputs there)."""
    import pytest

    prefix = shared_prefix(tmp_path_factory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARIN_PREFIX", prefix)
        steps = build(prefix)
        materialized(prefix, *(steps[name] for name in wanted))
        yield steps, prefix


def materialized(prefix: str, *steps: Step) -> None:
    """`steps` and everything they read, materialized under `prefix` (cache hits for what exists)."""
    for step in walk(list(steps)):
        materialize_step(step, prefix=prefix)


def hf_llama_logits(folder: str, ids) -> np.ndarray:
    """Logits of a Hugging Face Llama folder (`config.json`, `model.safetensors`) for one sequence, computed in numpy
    (float64) as transformers' `LlamaForCausalLM` computes them — RMSNorm, rotary positions (`rotate_half`),
    grouped causal attention, SwiGLU — a forward pass independent of Levanter (transformers' own needs torch)."""
    import json

    from safetensors.numpy import load_file

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
    heads, kv_heads, eps = config["num_attention_heads"], config["num_key_value_heads"], config["rms_norm_eps"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 10000.0))
    ids = np.asarray(ids)
    n = len(ids)

    def norm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(np.arange(n), inv_freq)
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))

    def rotate(x):  # [heads, n, head_dim]
        half = head_dim // 2
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, heads, head_dim).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, kv_heads, head_dim).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, kv_heads, head_dim).transpose(1, 0, 2)
        q, k = rotate(q), rotate(k)
        k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(head_dim) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (scores / scores.sum(-1, keepdims=True)) @ v
        x = x + attended.transpose(1, 0, 2).reshape(n, heads * head_dim) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else w["lm_head.weight"]
    return norm(x, w["model.norm.weight"]) @ head.T


def log_softmax(logits):
    """Natural-log probabilities over the last axis, stably."""
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


DEFAULT_CONTEXT = MODEL.seq_len // 2
"""The context every token gets by default: half the model's length."""


def sliding_log_probs(folder: str, ids, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log-probs and entropies of every token after the first by the numpy forward pass, in Hugging Face's
    sliding-window recipe (written here apart from the project's `windows`): windows of `seq_len` starting every
    `stride` tokens, each scoring the tokens the one before did not reach. Also each token's context: how many tokens
    its window held before it. `stride = seq_len - 1` is Levanter's windows overlapping by one token."""
    ids = np.asarray(ids)
    log_probs, entropies, contexts = [], [], []
    scored_to = 1  # the next token to score (the first has nothing to predict it)
    for begin in range(0, len(ids), stride):
        end = min(begin + seq_len, len(ids))
        if end > scored_to:
            window = ids[begin:end]
            lp = log_softmax(hf_llama_logits(folder, window))
            rows = np.arange(scored_to - begin - 1, end - begin - 1)  # row j predicts the window's token j + 1
            log_probs.append(lp[rows, window[rows + 1]])
            entropies.append(-(np.exp(lp[rows]) * lp[rows]).sum(-1))
            contexts.append(rows + 1)
            scored_to = end
        if end == len(ids):
            break
    if not log_probs:
        return np.zeros(0), np.zeros(0), np.zeros(0, int)
    return np.concatenate(log_probs), np.concatenate(entropies), np.concatenate(contexts)
