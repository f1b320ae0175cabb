"""RL environments: where an RL run's prompts come from and how its completions are scored.

As Marin's RL environments (`marin.rl.environments`: addition, sequential digits, number comparison, math): an
environment is a prompt source with a training split and a held-out split, both generated from a seed and
disjoint, and a verifiable reward — a function of the problem and the completion's text, in [0, 1], with 1 meaning
solved. Nothing here is random at run time and nothing imports JAX: an environment is a frozen dataclass whose
fields are its identity (`identity()`, in the RL step's hash_attrs), so the same environment always poses the same
problems, and an RL step over it is cached like any other.

Rewards are strict about what the answer is and lenient about how it is framed: surrounding whitespace never
matters; extra text after the answer, or anything that is not the answer, is not the answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by

SPLITS = ("train", "held_out")
"""An environment's splits: RL samples from `train`; the pass rate is measured on `held_out`."""


@dataclass(frozen=True)
class Problem:
    """One task: the prompt the policy sees (a user turn) and the reference answer (for worked examples)."""

    prompt: str
    answer: str


class Environment(Protocol):
    """A prompt source with a train and a held-out split, and a verifiable reward."""

    name: ClassVar[str]
    """The environment's kind (`addition`, `sequential_digits`), for identity and messages."""

    def problems(self, split: str) -> list[Problem]:
        """Every problem of `split` (`train` or `held_out`), in a fixed order; the splits share none."""
        ...

    def reward(self, problem: Problem, completion: str) -> float:
        """The completion's score in [0, 1]: 1 solves the problem, anything less does not."""
        ...

    def identity(self) -> dict[str, Any]:
        """Every setting that changes the problems or the rewards: what enters an RL step's hash_attrs."""
        ...


def solved(env: Environment, problem: Problem, completion: str) -> bool:
    """Whether `completion` solves `problem`: its reward is 1 (what the pass rate counts)."""
    return env.reward(problem, completion) >= 1.0


def _is_held_out(key: str, seed: int, percent: int) -> bool:
    """Which split a problem belongs to, by a hash of what defines it and the seed (so never both)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def _split_of(keys: list[str], seed: int, percent: int, split: str) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: an environment has {list(SPLITS)}")
    return [k for k in keys if _is_held_out(k, seed, percent) == (split == "held_out")]


@dataclass(frozen=True)
class Addition:
    """Multi-digit addition: `a+b` (each operand up to `digits` digits) → the sum in decimal.

    The reward is a verifier, not a string match: the completion, stripped of surrounding whitespace, must be a
    decimal integer (an optional sign, digits only) equal to the sum — so `046` solves `12+34` and `46 ` does,
    but `46.`, `4 6`, `46 apples` and the empty completion score 0."""

    digits: int = 2
    """Operands are drawn from [0, 10**digits)."""
    seed: int = 0
    """Which problems go to which split, and their order."""
    held_out_percent: int = 10
    """About this share of all operand pairs is held out (never trained on)."""
    max_problems: int = 2000
    """At most this many problems per split (drawn in a seeded order from all pairs)."""
    name: ClassVar[str] = "addition"

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise StepDefinitionError(f"addition: digits must be 1 to 9, got {self.digits}")
        if not 0 < self.held_out_percent < 100:
            raise StepDefinitionError(f"addition: held_out_percent must be 1 to 99, got {self.held_out_percent}")
        if self.max_problems < 1:
            raise StepDefinitionError(f"addition: max_problems must be positive, got {self.max_problems}")

    def problems(self, split: str) -> list[Problem]:
        top = 10**self.digits
        rng = random.Random(f"addition:{self.digits}:{self.seed}")
        enough = 2 * self.max_problems * 100 // self.held_out_percent  # both splits could be full
        if top * top <= 2 * enough:  # small: every pair, shuffled
            pairs = [(a, b) for a in range(top) for b in range(top)]
            rng.shuffle(pairs)
        else:  # large: seeded draws, first occurrence kept (at most half of all pairs: this ends fast)
            seen: dict[tuple[int, int], None] = {}
            while len(seen) < enough:
                seen.setdefault((rng.randrange(top), rng.randrange(top)), None)
            pairs = list(seen)
        keys = _split_of([f"{a}+{b}" for a, b in pairs], self.seed, self.held_out_percent, split)
        return [Problem(k, str(sum(map(int, k.split("+"))))) for k in keys[:self.max_problems]]

    def reward(self, problem: Problem, completion: str) -> float:
        text = completion.strip()
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            return 0.0
        return 1.0 if int(text) == int(problem.answer) else 0.0

    def identity(self) -> dict[str, Any]:
        return {"env": self.name, **asdict(self)}


@dataclass(frozen=True)
class SequentialDigits:
    """Sequential digits: a run of consecutive digits (`4 5 6 7`, counting on from 9 to 0) → the next `length`
    digits (`8 9 0 1`); with more `steps`, runs that count by any of them modulo 10 (step 2: `4 6 8` → `0 2 4 6`),
    so the step must be read from the prompt.

    Marin's sequential-digits task rewards increasing runs; this one is verifiable against one answer, with partial
    credit so that a small model gets a signal before it is right: the completion's whitespace-separated items
    are compared with the answer's digits position by position, and the reward is the matches over
    max(items, length) — so every wrong, missing or extra item costs, surrounding whitespace and the spacing
    between digits do not (`8  9 0 1` solves it, `8901` is one item and scores 0), and only the exact run scores 1."""

    length: int = 4
    """Digits to continue with."""
    min_prompt: int = 2
    max_prompt: int = 5
    """The prompt's run is min_prompt to max_prompt digits long."""
    steps: tuple[int, ...] = (1,)
    """The differences a run may count by (modulo 10); Marin's task counts by one."""
    seed: int = 0
    held_out_percent: int = 25
    name: ClassVar[str] = "sequential_digits"

    def __post_init__(self) -> None:
        if self.length < 1 or not 1 <= self.min_prompt <= self.max_prompt:
            raise StepDefinitionError(f"sequential_digits: need length ≥ 1 and 1 ≤ min_prompt ≤ max_prompt, got"
                                      f" length={self.length}, prompt {self.min_prompt}..{self.max_prompt}")
        if not 0 < self.held_out_percent < 100:
            raise StepDefinitionError(f"sequential_digits: held_out_percent must be 1 to 99, got"
                                      f" {self.held_out_percent}")
        if not self.steps or any(not 1 <= d <= 9 for d in self.steps) or len(set(self.steps)) != len(self.steps):
            raise StepDefinitionError(f"sequential_digits: steps must be distinct differences 1 to 9, got {self.steps}")
        if len(self.steps) > 1 and self.min_prompt < 2:
            raise StepDefinitionError("sequential_digits: with several steps a prompt needs at least two digits to"
                                      f" show its step, got min_prompt={self.min_prompt}")

    def problems(self, split: str) -> list[Problem]:
        runs = [(start, n, d) for d in self.steps for n in range(self.min_prompt, self.max_prompt + 1)
                for start in range(10)]
        random.Random(f"sequential:{self.seed}").shuffle(runs)
        keys = _split_of([f"{s}:{n}:{d}" for s, n, d in runs], self.seed, self.held_out_percent, split)
        made = []
        for key in keys:
            start, n, d = map(int, key.split(":"))
            made.append(Problem(" ".join(str((start + d * i) % 10) for i in range(n)),
                                " ".join(str((start + d * (n + i)) % 10) for i in range(self.length))))
        return made

    def reward(self, problem: Problem, completion: str) -> float:
        expected = problem.answer.split()
        got = completion.split()
        if not got:
            return 0.0
        right = sum(a == b for a, b in zip(got, expected, strict=False))
        return right / max(len(got), len(expected))

    def identity(self) -> dict[str, Any]:
        return {"env": self.name, **asdict(self), "steps": list(self.steps)}


ENVIRONMENTS: dict[str, type] = {Addition.name: Addition, SequentialDigits.name: SequentialDigits}
"""The environments by name (what a record's identity says)."""


def check_environment(who: str, env: Any) -> None:
    """`env` is an environment with both splits non-empty (a `StepDefinitionError` naming `who` otherwise)."""
    if not all(callable(getattr(env, m, None)) for m in ("problems", "reward", "identity")):
        raise StepDefinitionError(f"{who}: env must be an RL environment (problems, reward, identity), got"
                                  f" {type(env).__name__}")
    for split in SPLITS:
        if not env.problems(split):
            raise StepDefinitionError(f"{who}: the environment {env.identity()} has no {split} problems")


# --- worked examples: the same problems as chat data, for SFT before RL ------------------------------------------

@record_type("rl_worked_examples", old_names=("marin_assets.pipeline.training.rl_envs:WorkedExamples",))
@dataclass(frozen=True)
class WorkedExamples:
    """Chat conversations of an environment's problems with their reference answers, one file per split."""

    conversations: dict[str, int] = field(default_factory=dict)
    """Conversations per split (`train`, `validation`: the environment's train and held-out problems)."""
    path: str = ""


def write_worked_examples(output_path: str, env: Environment, train: int, validation: int) -> WorkedExamples:
    """The first `train` train problems and the first `validation` held-out problems of `env`, as OpenAI-form
    conversations (`{split}/conversations.jsonl`: the prompt as the user turn, the answer as the assistant's) —
    what `chat_tokenize_step` reads. The held-out ones are the RL run's held-out problems: SFT never trains on
    them."""
    from marin_assets.pipeline.data.text_files import local_dir_for

    counts = {}
    with local_dir_for(output_path) as local:
        for split, source, n in (("train", "train", train), ("validation", "held_out", validation)):
            problems = env.problems(source)[:n]
            if len(problems) < n:
                raise ValueError(f"the environment {env.identity()} has {len(problems)} {source} problems,"
                                 f" fewer than the {n} worked examples asked for")
            os.makedirs(os.path.join(local, split), exist_ok=True)
            with open(os.path.join(local, split, "conversations.jsonl"), "w") as f:
                for p in problems:
                    f.write(json.dumps({"messages": [{"role": "user", "content": p.prompt},
                                                     {"role": "assistant", "content": p.answer}]}) + "\n")
            counts[split] = len(problems)
    return WorkedExamples(counts, output_path)


def worked_examples_step(name: str, env: Environment, train: int = 400, validation: int = 64) -> Step:
    """A chat dataset of `env`'s problems with their answers (`train` from its train split, `validation` from its
    held-out one), for `chat_tokenize_step` and `sft_step`.

    Identity: `env`, `train`, `validation`.
    """
    check_environment(f"worked examples {name!r}", env)
    return Step(name=name, fn=lambda out: write_worked_examples(out, env, train, validation),
                hash_attrs={"env": env.identity(), "train": train, "validation": validation, "format": "chat-v1"},
                kind="generate", description=made_by(write_worked_examples))


__all__ = ["ENVIRONMENTS", "Addition", "Environment", "Problem", "SPLITS", "SequentialDigits", "WorkedExamples",
           "check_environment", "solved", "worked_examples_step", "write_worked_examples"]
