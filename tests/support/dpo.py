"""Preference pairs for the DPO tests, from real text (the standard library's docstrings, as the SFT tests' answers
are), and the DPO steps built on the SFT tests' small pipeline (`tests.test_sft.Pipeline`).

A pair asks what a function does; the chosen answer is its docstring's first paragraph, the rejected one the
docstring of a function of another module — a plausible wrong answer, told from the right one by whether it is
about what was asked. The held-out pairs are new pairs: the questions of the training pairs, each with a wrong
answer it never met in training."""

import random
from dataclasses import replace
from pathlib import Path

from marin_assets.core.step import Step
from marin_assets.pipeline.data.preference import preference_data_step
from marin_assets.pipeline.tokens.preference_cache import preference_tokenize_step
from marin_assets.pipeline.training.dpo.step import dpo_step
from marin_assets.pipeline.training.sources import from_hf
from marin_assets.pipeline.training.specs import OptimizerSpec, TrainerSpec
from tests.support.chat import SYSTEM, doc_answers, write_jsonl

TRAIN_PAIRS, HELD_OUT_PAIRS, ASKED, SEED = 96, 24, 48, 3
DPO_TRAINER = TrainerSpec(num_train_steps=16, train_batch_size=8, checkpoint_every=50, steps_per_eval=8,
                          max_eval_batches=None)
DPO_OPTIMIZER = OptimizerSpec(learning_rate=3e-3, weight_decay=0.0, warmup=0.1, lr_schedule="linear",
                              min_lr_ratio=0.0)


def preference_records(train: int, held_out: int, seed: int, asked: int = ASKED) -> dict[str, list[dict]]:
    """`{prompt, chosen, rejected}` rows per split: a question about one of `asked` functions (after a system prompt
    in every other row), its docstring as the chosen answer, the docstring of a function of another module as the
    rejected. Held-out pairs ask about the same functions — as a preference set holds several pairs per prompt —
    each with a wrong answer it is never paired with in training."""
    answers = doc_answers()
    rng = random.Random(seed)
    order = list(range(len(answers)))
    rng.shuffle(order)
    questions = [answers[i] for i in order[:asked]]
    seen: set[tuple[str, str]] = set()
    rows: dict[str, list[dict]] = {"train": [], "validation": []}
    for split, count in (("train", train), ("validation", held_out)):
        for i in range(count):
            name, answer = questions[(i if split == "train" else 2 * i + 1) % asked]
            module = name.split(".")[0]
            _, wrong = rng.choice([a for a in answers if a[0].split(".")[0] != module and (name, a[1]) not in seen])
            seen.add((name, wrong))
            prompt = [{"role": "system", "content": SYSTEM}] if i % 2 else []
            prompt.append({"role": "user", "content": f"What does {name} do?"})
            rows[split].append({"prompt": prompt, "chosen": answer, "rejected": wrong})
    return rows


def write_preference_dataset(root: Path, train: int = TRAIN_PAIRS, held_out: int = HELD_OUT_PAIRS,
                             seed: int = SEED) -> dict[str, int]:
    """The pairs as JSON lines under `root/{train,validation}/pairs.jsonl`; pairs per split."""
    rows = preference_records(train, held_out, seed)
    for split, records in rows.items():
        write_jsonl(root / split / "pairs.jsonl", records)
    return {split: len(records) for split, records in rows.items()}


class DpoSteps:
    """DPO on the SFT tests' pipeline: its tokenizer, the pairs above, from `init` (an export step)."""

    def __init__(self, pipeline, init: Step, seq_len: int = 256):
        self.raw = Step(name="raw/prefs", fn=lambda out: write_preference_dataset(Path(out)),
                        hash_attrs={"train": TRAIN_PAIRS, "validation": HELD_OUT_PAIRS, "asked": ASKED, "seed": SEED,
                                    "design": "same-questions-new-wrong-answers"})
        self.prefs = preference_data_step("prefs/docs", self.raw)
        self.cache = preference_tokenize_step("tokenized/prefs", self.prefs, pipeline.bpe)
        self.model = replace(init.exports.model, seq_len=seq_len)  # Llama: positions are not weights
        self.dpo = dpo_step("checkpoints/dpo", self.cache, from_hf(init), beta=0.1, model=self.model,
                            optimizer=DPO_OPTIMIZER, trainer=DPO_TRAINER)
        self.dpo_sharper = dpo_step("checkpoints/dpo-beta-0.5", self.cache, from_hf(init), beta=0.5, model=self.model,
                                    optimizer=DPO_OPTIMIZER, trainer=DPO_TRAINER)
