"""Arithmetic word problems in GSM8K's format, generated from a seed: a generative task whose answers can be checked.

Each problem is one addition or subtraction told as a story ("Ava has 7 pencils. She buys 5 more pencils. How many
pencils does Ava have now?") with GSM8K's answer form: the working with a calculator annotation, then `#### ` and
the number (`Ava has 7 + 5 = <<7+5=12>>12 pencils now.\\n#### 12`). Problems are split by a hash of their question
(and the seed), so the held-out split shares no problem with the training split however many of either are drawn.

The shipped lm-eval task `arith_word_problems` (`resources/eval_tasks`, written by its `generate.py` from here) takes
its test problems from the held-out split; `word_problems_step` writes training text from the training split, as
documents `Question: …\\nAnswer: …` — the task's own prompt and target — for a model to learn the task from.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass

from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.data.corpus import write_jsonl_shards

NAMES = (("Ava", "She"), ("Ben", "He"), ("Chloe", "She"), ("Dan", "He"), ("Ella", "She"), ("Finn", "He"),
         ("Grace", "She"), ("Hugo", "He"), ("Iris", "She"), ("Jack", "He"), ("Kate", "She"), ("Liam", "He"))
ITEMS = ("apples", "pencils", "stamps", "marbles", "books", "cookies", "shells", "cards", "coins", "stickers")
GAIN = ("{pronoun} buys {b} more {items}.", "A friend gives {pronoun_obj} {b} more {items}.",
        "{pronoun} finds {b} more {items}.")
LOSS = ("{pronoun} gives away {b} {items}.", "{pronoun} loses {b} {items}.", "{pronoun} sells {b} of the {items}.")
SPLITS = ("train", "held_out")
MAX_OPERAND = 9
"""Operands 1 … 9: the sums a small model can learn from a few thousand problems."""


@dataclass(frozen=True)
class WordProblem:
    """One problem: GSM8K's `question` and `answer` fields, and the answer's number."""

    question: str
    answer: str
    value: int

    def text(self) -> str:
        """The problem as a training document: the task's prompt, then its target."""
        return f"Question: {self.question}\nAnswer: {self.answer}"


def _problem(name: str, pronoun: str, items: str, a: int, b: int, story: str, gain: bool) -> WordProblem:
    value = a + b if gain else a - b
    sign = "+" if gain else "-"
    told = story.format(pronoun=pronoun, pronoun_obj="her" if pronoun == "She" else "him", b=b, items=items)
    question = f"{name} has {a} {items}. {told} How many {items} does {name} have now?"
    answer = f"{name} has {a} {sign} {b} = <<{a}{sign}{b}={value}>>{value} {items} now.\n#### {value}"
    return WordProblem(question, answer, value)


def _split_of(problem: WordProblem, seed: int, held_out_percent: float) -> str:
    digest = hashlib.sha256(f"{seed}:{problem.question}".encode()).digest()
    return "held_out" if int.from_bytes(digest[:8], "big") % 10_000 < held_out_percent * 100 else "train"


def word_problems(split: str, seed: int = 0, held_out_percent: float = 25.0) -> list[WordProblem]:
    """Every problem of `split` (`train` or `held_out`), in an order shuffled by `seed`: the same list on every
    machine. Operands run from 1 to `MAX_OPERAND`; a subtraction never goes below zero."""
    if split not in SPLITS:
        raise ValueError(f"word problems have splits {', '.join(SPLITS)}, not {split!r}")
    out = []
    for (name, pronoun), items, a, b in itertools.product(NAMES, ITEMS, range(1, MAX_OPERAND + 1),
                                                          range(1, MAX_OPERAND + 1)):
        story_index = (a * 7 + b * 3 + len(name)) % 6  # varied, yet fixed by the problem
        gain = story_index < 3 or b > a
        story = GAIN[story_index % 3] if gain else LOSS[story_index % 3]
        problem = _problem(name, pronoun, items, a, b, story, gain)
        if _split_of(problem, seed, held_out_percent) == split:
            out.append(problem)
    random.Random(seed).shuffle(out)
    return out


@record_type("word_problems")
@dataclass(frozen=True)
class WordProblems:
    """A word-problem corpus: training text for the task."""

    seed: int
    train_documents: int
    validation_documents: int
    files: list[str]


def write_word_problems(output_path: str, seed: int = 0, train: int = 4000, validation: int = 200) -> WordProblems:
    """`train` problems of the training split as documents (`train/`), and the next `validation` of the same split
    (`validation/`): the held-out split stays unseen, for the task."""
    problems = word_problems("train", seed)
    if train + validation > len(problems):
        raise ValueError(f"{train} + {validation} problems asked; the training split of seed {seed} has"
                         f" {len(problems)}")
    files, _ = write_jsonl_shards(output_path, "train", [{"text": p.text()} for p in problems[:train]], 1)
    more, _ = write_jsonl_shards(output_path, "validation",
                                 [{"text": p.text()} for p in problems[train:train + validation]], 1)
    return WordProblems(seed, train, validation, files + more)


def word_problems_step(name: str, seed: int = 0, train: int = 4000, validation: int = 200) -> Step:
    """Arithmetic word problems (GSM8K's format) of the training split as a text dataset.

    Identity: `seed`, `train`, `validation` and the generator's version.
    """
    if train < 1 or validation < 0:
        raise StepDefinitionError(f"step {name!r}: train must be positive and validation not negative")
    return Step(name=name, fn=lambda out: write_word_problems(out, seed, train, validation),
                hash_attrs={"seed": seed, "train": train, "validation": validation, "format": "word-problems-v1"},
                kind="generate", description=made_by(write_word_problems))
