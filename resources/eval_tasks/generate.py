"""Regenerate the shipped evaluation tasks' data from Python's own documentation (run from the repository root:
`python resources/eval_tasks/generate.py`). The files are shipped, not generated at run time: a task's identity is
its files' content, and these must not change with the Python that reads them.

Sentences come from the documents the demo corpus holds out for validation (`python_docs.is_validation`: whole
packages and pydoc topics), so the demo model never trained on them:
- `pydocs_next_sentence` (multiple choice): a sentence, and four candidate next sentences — the true one and the
  true next sentences of three other passages;
- `pydocs_last_word` (loglikelihood): a sentence without its last word, and that word.

`arith_word_problems` (generate_until, GSM8K's format) takes its test problems from the held-out split of
`marin_assets.pipeline.data.word_problems` (seed 0) and its few-shot examples from the training split, beyond the
problems `word_problems_step` writes as training text by default.
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from pathlib import Path

from marin_assets.pipeline.data.python_docs import is_validation, python_documents
from marin_assets.pipeline.data.word_problems import word_problems

HERE = Path(__file__).resolve().parent
SENTENCE = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
FEWSHOT, TEST = 16, 100


def sentences(text: str) -> list[str]:
    """The plain-prose sentences of a document's paragraphs (no code, no lists, no markup)."""
    out: list[str] = []
    for paragraph in text.split("\n\n"):
        if any(line.startswith((" ", ">>>", "-", "*", "+")) for line in paragraph.splitlines()):
            continue
        flat = " ".join(paragraph.split())
        out.extend(s for s in SENTENCE.split(flat)
                   if 30 <= len(s) <= 160 and re.fullmatch(r"[A-Za-z0-9 ,;:'()\-.?!]+", s) and s[-1] in ".!?")
    return out


def write(folder: Path, name: str, rows: list[dict]) -> None:
    with open(folder / name, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    documents, _ = python_documents(sysconfig.get_paths()["stdlib"], min_chars=40)
    held_out = [d for d in documents if is_validation(d.group, 10.0)]
    rng = random.Random(17)
    pairs, last_words = [], []
    for d in held_out:
        found = sentences(d.text)
        pairs += [(d.source, a, b) for a, b in zip(found, found[1:], strict=False)]
        last_words += [(d.source, s) for s in found if re.fullmatch(r".* [a-z]{3,}\.", s)]
    rng.shuffle(pairs)
    rng.shuffle(last_words)

    chosen = pairs[:FEWSHOT + TEST]
    rows = []
    for i, (source, context, true_next) in enumerate(chosen):
        others = [b for s, _, b in rng.sample(pairs, 12) if s != source and b != true_next][:3]
        choices = others + [true_next]
        rng.shuffle(choices)
        rows.append({"id": i, "source": source, "context": context, "choices": choices,
                     "label": choices.index(true_next)})
    folder = HERE / "pydocs_next_sentence"
    write(folder, "fewshot.jsonl", rows[:FEWSHOT])
    write(folder, "test.jsonl", rows[FEWSHOT:])

    rows = []
    for i, (source, sentence) in enumerate(last_words[:FEWSHOT + TEST]):
        context, word = sentence[:-1].rsplit(" ", 1)
        rows.append({"id": i, "source": source, "context": context, "word": word})
    folder = HERE / "pydocs_last_word"
    write(folder, "fewshot.jsonl", rows[:FEWSHOT])
    write(folder, "test.jsonl", rows[FEWSHOT:])
    word_problem_task()


def word_problem_task() -> None:
    """`arith_word_problems`: 100 held-out problems to answer, 8 training problems as few-shot examples."""
    held_out, train = word_problems("held_out", seed=0), word_problems("train", seed=0)
    folder = HERE / "arith_word_problems"
    write(folder, "fewshot.jsonl", [{"id": i, "question": p.question, "answer": p.answer}
                                    for i, p in enumerate(train[-8:])])
    write(folder, "test.jsonl", [{"id": i, "question": p.question, "answer": p.answer}
                                 for i, p in enumerate(held_out[:TEST])])


if __name__ == "__main__":
    main()
