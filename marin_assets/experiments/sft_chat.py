"""SFT on chat data: the demo's pretrained Llama fine-tuned to answer questions about Python.

The pretraining is the demo's own (`experiments/python_docs.py`: this Python's documentation → BPE
tokenizer → cache → small Llama → export), reused step for step, so after `make demo` it is a cache
hit. From the same documentation come conversations: a user asks what a function, class or pydoc
topic is, the assistant answers with the first paragraph of its documentation (every other
conversation has a system prompt and a follow-up question). They are tokenized with the default chat
template into a chat cache, the export is fine-tuned on them (loss on the assistant's tokens only),
and the result is exported and evaluated on the held-out conversations — next to the pretrained
model's evaluation on the same split, so the gain is one look at two assets.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator

from marin_assets import Experiment, Step, made_by
from marin_assets.experiments import python_docs
from marin_assets.steps import (
    SFT_OPTIMIZER,
    OptimizerSpec,
    TrainerSpec,
    chat_tokenize_step,
    expand_files,
    export_step,
    from_hf,
    iter_records,
    local_dir_for,
    loss_eval_step,
    sft_step,
)

SYSTEM = "You are a helpful assistant who knows the Python standard library."
TRAINER = TrainerSpec(num_train_steps=60, train_batch_size=16, checkpoint_every=30, steps_per_eval=20,
                      max_eval_batches=4)
MAX_ANSWER_CHARS = 400


def _question(source: str) -> str:
    """`stdlib:json.decoder:JSONDecoder.decode` → `What does json.decoder.JSONDecoder.decode do?`."""
    kind, _, name = source.partition(":")
    if kind == "pydoc":
        return f"Explain the Python topic '{name}'."
    module, _, qualname = name.partition(":")
    return f"What does {module}.{qualname} do?" if qualname else f"What is the {module} module for?"


def _answer(text: str) -> str:
    """The first paragraph as one line, cut at a sentence end within MAX_ANSWER_CHARS where one is."""
    first = " ".join(line.strip() for line in text.split("\n\n", 1)[0].strip().splitlines())
    if len(first) <= MAX_ANSWER_CHARS:
        return first
    cut = first[:MAX_ANSWER_CHARS]
    return cut[:cut.rfind(". ") + 1] if ". " in cut else cut


def _conversations(documents: Iterator[dict]) -> Iterator[dict]:
    """OpenAI-form conversations, one per document, every other with a system prompt and a follow-up."""
    previous = None
    for i, doc in enumerate(documents):
        turns = [{"role": "user", "content": _question(doc["source"])},
                 {"role": "assistant", "content": _answer(doc["text"])}]
        if i % 2 and previous is not None:
            follow_up = _question(previous["source"])
            turns = [{"role": "system", "content": SYSTEM}, *turns,
                     {"role": "user", "content": f"And {follow_up[0].lower()}{follow_up[1:]}"},
                     {"role": "assistant", "content": _answer(previous["text"])}]
        previous = doc
        yield {"messages": turns}


def docs_conversations(output_path: str, docs_path: str) -> dict[str, int]:
    """Questions about the documentation corpus at `docs_path` (records with `text` and `source`), answered
    with its text: `{split}/conversations.jsonl` for each of its splits. Returns conversations per split."""
    counts = {}
    with local_dir_for(output_path) as local:
        for split in ("train", "validation"):
            docs = (r for file in expand_files(docs_path, [f"{split}/*"])
                    for _, records in iter_records(file, ("text", "source")) for r in records)
            os.makedirs(os.path.join(local, split), exist_ok=True)
            with open(os.path.join(local, split, "conversations.jsonl"), "w") as f:
                counts[split] = sum(f.write(json.dumps(c) + "\n") > 0 for c in _conversations(docs))
    return counts


def build(prefix: str = "python-docs", trainer: TrainerSpec = TRAINER,
          optimizer: OptimizerSpec = SFT_OPTIMIZER) -> dict[str, Step]:
    """The demo pipeline under `prefix`, then its chat fine-tuning: `raw/{prefix}-chat` …
    `evals/{prefix}-chat-sft` (and `evals/{prefix}-chat-base`, the pretrained model on the same split)."""
    pretrained = python_docs.build(prefix) if prefix != "python-docs" else python_docs.pipeline
    corpus = pretrained["corpus"]
    chat_data = Step(name=f"raw/{prefix}-chat", fn=lambda out: docs_conversations(out, corpus.output_path),
                     deps=[corpus], kind="generate", description=made_by(docs_conversations),
                     hash_attrs={"system": SYSTEM, "max_answer_chars": MAX_ANSWER_CHARS, "format": "docs-chat-v1"})
    chat = chat_tokenize_step(f"tokenized/{prefix}-chat", chat_data, pretrained["tokenizer"])
    model = dataclasses.replace(python_docs.MODEL, seq_len=256)  # Llama: positions are not weights
    sft = sft_step(f"checkpoints/{prefix}-chat-sft", {"chat": chat}, from_hf(pretrained["export"]), model,
                   optimizer, trainer)
    return {**pretrained, "chat_data": chat_data, "chat": chat, "sft": sft,
            "sft_export": export_step(f"exports/{prefix}-chat-sft", sft),
            "sft_evaluate": loss_eval_step(f"evals/{prefix}-chat-sft", sft, {"chat": chat}),
            "base_evaluate": loss_eval_step(f"evals/{prefix}-chat-base", pretrained["train"], {"chat": chat})}


pipeline = build()
steps = [pipeline["sft_export"], pipeline["sft_evaluate"], pipeline["base_evaluate"]]
experiment = Experiment("python-docs-chat", steps)


def main() -> None:
    """`python -m marin_assets.experiments.sft_chat`: materialize the experiment under the storage prefix, in
    this process (cached steps are reused), and print the chat split's loss before and after SFT."""
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import walk

    for step in walk(steps):
        outcome = materialize_step(step)
        print(f"{step.name}: {'cached' if outcome.cached else 'materialized'} at {outcome.output_path}")
    for key in ("base_evaluate", "sft_evaluate"):
        result = materialize_step(pipeline[key]).record.result
        print(f"{pipeline[key].name}: assistant-token loss {result['loss']:.3f}, {result['bpb']:.3f} bits per byte")


if __name__ == "__main__":
    main()
