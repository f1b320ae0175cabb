"""Generative evaluations (lm-eval `generate_until`) through the evaluation-kind seam, answered by the generation
engine: on the shipped arithmetic word problems (GSM8K's format), a model trained on the task's training split
scores above one trained on other text; the score equals a direct computation over the logged answers; each score
carries its overlap with the training data; every checkpoint is scored as a partition would be."""

from __future__ import annotations

import json
import re

import pytest

from marin_assets import load_result, materialize_step
from marin_assets.core.step import walk
from marin_assets.pipeline.data.python_docs import python_docs_step
from marin_assets.pipeline.data.word_problems import word_problems, word_problems_step
from marin_assets.pipeline.evals.harness import HarnessResult, harness_checkpoint_evals, harness_eval_step
from marin_assets.pipeline.evals.harness_tasks import shipped_task
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec

MODEL = ModelSpec(hidden_dim=64, intermediate_dim=128, num_layers=2, num_heads=4, num_kv_heads=4, seq_len=128)
TRAINER = TrainerSpec(num_train_steps=300, train_batch_size=16, checkpoint_every=150, steps_per_eval=150,
                      max_eval_batches=2)
OTHER_TRAINER = TrainerSpec(num_train_steps=60, train_batch_size=16, checkpoint_every=60, steps_per_eval=60,
                            max_eval_batches=2)
"""The model not trained on the task: the same shape, on half of Python's documentation."""
OPTIMIZER = OptimizerSpec(learning_rate=3e-3)
TASK = "arith_word_problems"
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two models of one shape and tokenizer: one trained on the word problems' training split, one on Python's
    documentation; each scored on the task's 100 held-out problems, 0-shot."""
    prefix = str(tmp_path_factory.mktemp("generative") / "outputs")
    problems = word_problems_step("raw/wp-problems")
    tokenizer = bpe_tokenizer_step("tokenizers/wp-bpe", problems, vocab_size=300)
    docs = python_docs_step("raw/wp-docs")
    trained = train_step("checkpoints/wp-trained", {"problems": tokenize_step("tokenized/wp-problems", problems,
                                                                              tokenizer)}, MODEL, OPTIMIZER, TRAINER)
    half = {"train": ["train/shard-00000.*"], "validation": ["validation/*"]}
    docs_cache = tokenize_step("tokenized/wp-docs", docs, tokenizer, splits=half)
    other = train_step("checkpoints/wp-other", {"docs": docs_cache}, MODEL, OPTIMIZER, OTHER_TRAINER)
    task = shipped_task(TASK)
    evals = {"trained": harness_eval_step("evals/wp-trained", trained, [task]),
             "other": harness_eval_step("evals/wp-other", other, [task])}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARIN_PREFIX", prefix)
        for step in walk(list(evals.values())):
            materialize_step(step, prefix=prefix)
        yield {"prefix": prefix, "trained": trained, "task": task, "evals": evals,
               "results": {k: load_result(s, HarnessResult) for k, s in evals.items()}}


def logged(step, prefix: str) -> list[dict]:
    with open(f"{step.output_path_under(prefix)}/samples/{TASK}.jsonl") as f:
        return [json.loads(line) for line in f]


def test_a_model_trained_on_the_task_scores_above_one_that_was_not(runs):
    trained, other = (runs["results"][k].tasks[TASK] for k in ("trained", "other"))
    assert trained.output_type == "generate_until" and trained.samples == other.samples == 100
    assert trained.exact_match is not None and other.exact_match is not None
    assert trained.exact_match > other.exact_match, (trained.exact_match_by_filter, other.exact_match_by_filter)
    assert set(trained.exact_match_by_filter) == {"strict-match", "flexible-extract"}
    assert trained.exact_match == trained.exact_match_by_filter["strict-match"]


@pytest.mark.parametrize("which", ["trained", "other"])
def test_the_score_equals_a_direct_computation_over_the_logged_answers(runs, which):
    """Independent of lm-eval's filters: the number after `####` in each raw answer, against the number the problem's
    own generator says (`word_problems`), not the target lm-eval logged."""
    truth = {p.question: p.value for p in word_problems("held_out")}
    rows = [r for r in logged(runs["evals"][which], runs["prefix"]) if r["filter"] == "strict-match"]
    assert len(rows) == 100
    right = 0
    for row in rows:
        (answer,) = row["resps"][0]
        assert "Question:" not in answer and "\n\n" not in answer  # cut at the task's `until` texts
        found = STRICT.search(answer)
        right += bool(found) and found.group(1).strip(".,") == str(truth[row["doc"]["question"]])
    assert runs["results"][which].tasks[TASK].exact_match == pytest.approx(right / len(rows), abs=1e-12)


def test_each_generative_score_carries_its_overlap_with_the_training_data(runs):
    for which, result in runs["results"].items():
        score = result.tasks[TASK]
        assert result.contamination is not None, which
        assert score.contamination is not None and score.contaminated is not None, which
        measured = result.contamination.tasks[TASK]
        assert measured.examples == 100 and score.contamination == measured.fraction
    other = runs["results"]["other"]
    assert other.tasks[TASK].contamination == 0 and other.contamination_status.startswith("clean")


def test_every_checkpoint_is_scored_the_same_way(runs):
    """The per-checkpoint family's partition for the last checkpoint scores what the final step scored."""
    family = harness_checkpoint_evals("evals/wp-checkpoints", runs["trained"], [runs["task"]])
    step = family.step(TRAINER.num_train_steps - 1)
    materialize_step(step, prefix=runs["prefix"])
    result = load_result(step, HarnessResult)
    final = runs["results"]["trained"]
    assert result.step == final.step == TRAINER.num_train_steps - 1
    assert result.tasks[TASK].exact_match_by_filter == final.tasks[TASK].exact_match_by_filter
    assert [r["resps"] for r in logged(step, runs["prefix"])] == [r["resps"] for r in logged(runs["evals"]["trained"],
                                                                                              runs["prefix"])]
    assert family.row(materialize_step(step, prefix=runs["prefix"]).record.result)[f"{TASK}/exact_match"] == \
        result.tasks[TASK].exact_match
