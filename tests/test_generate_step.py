"""The generation step (`evals/completions.py`): completions of texts or a dataset's documents or conversations by
any model an evaluation reads, as parquet — greedy ones equal a numpy float64 forward pass, log-probs the model's
own, seeded ones the same on every run; sampling is identity, the engine's size is not; a conversation's last
assistant turn is its reference, never shown; every checkpoint too; bad prompts are errors naming them."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from marin_assets import load_result, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status
from marin_assets.pipeline.evals.completions import (
    COMPLETIONS_FILE,
    GenerationInputError,
    GenerationResult,
    generate_checkpoints,
    generate_step,
    prompts_from,
)
from marin_assets.pipeline.evals.kind import Checkpoint
from marin_assets.pipeline.training.generation import Sampling
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.looking_inside import looking_inside
from tests.test_generation import greedy_by_numpy

TEXTS = ["The json module", "def main():", "Return the number of", "A list is a", "import os",
         "Raises ValueError if", "This function", "class Path"]


@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    with looking_inside(tmp_path_factory, "export_bpe") as (steps, prefix):
        yield steps, prefix


def rows_of(step: Step) -> list[dict]:
    return pq.read_table(f"{step.output_path}/{COMPLETIONS_FILE}").to_pylist()


def test_greedy_completions_of_an_export_equal_a_numpy_forward_pass_with_the_models_log_probs(inside):
    steps, prefix = inside
    step = generate_step("generations/inside-greedy", steps["train_bpe"], TEXTS, Sampling(max_tokens=16),
                         export=steps["export_bpe"], logprobs=True)
    outcome = materialize_step(step, prefix=prefix)
    result = load_result(step, GenerationResult)
    rows = rows_of(step)
    assert [r["prompt_index"] for r in rows] == list(range(len(TEXTS))) and [r["prompt"] for r in rows] == TEXTS
    assert result.prompts == result.completions == len(TEXTS)
    assert run_check(step.checks[0], outcome.output_path, outcome.record.result).passed
    assert result.completion_tokens == sum(r["completion_tokens"] for r in rows)
    folder = steps["export_bpe"].output_path
    from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer
    tokenizer = load_hf_tokenizer(folder)
    near_ties = 0
    for text, row in zip(TEXTS, rows, strict=True):
        # the prompt follows the document-start token, as every training document did
        prompt = [tokenizer.eos_token_id if tokenizer.bos_token_id is None else tokenizer.bos_token_id,
                  *tokenizer(text, add_special_tokens=False)["input_ids"]]
        assert row["prompt_tokens"] == len(prompt)
        expected, dists = greedy_by_numpy(folder, prompt, len(row["token_ids"]), len(tokenizer))
        assert len(row["logprobs"]) == len(row["token_ids"]) == row["completion_tokens"]
        for t, (got, want, lp) in enumerate(zip(row["token_ids"], expected, dists, strict=True)):
            if got != want:  # float32 against float64: only a near-tie may differ
                assert lp[want] - lp[got] < 1e-4
                near_ties += 1
                break
            assert row["logprobs"][t] == pytest.approx(lp[want], abs=2e-4)
        assert row["completion"] == tokenizer.decode(row["token_ids"], skip_special_tokens=True)
        assert row["finish_reason"] in ("stop", "length")
    assert near_ties <= 1


def test_seeded_sampling_is_identity_and_the_same_on_every_run(inside, tmp_path):
    steps, prefix = inside
    sampling = Sampling(max_tokens=12, temperature=1.0, n=3, seed=5)
    step = generate_step("generations/inside-sampled", steps["train_bpe"], TEXTS, sampling)
    materialize_step(step, prefix=prefix)
    first = rows_of(step)
    assert len(first) == 3 * len(TEXTS) and [r["sample"] for r in first[:3]] == [0, 1, 2]
    assert "logprobs" not in first[0]
    # the engine's size is not identity; the step's function with another size writes the same tokens
    smaller = generate_step("generations/inside-sampled", steps["train_bpe"], TEXTS, sampling, max_seqs=6)
    assert smaller.name_with_hash == step.name_with_hash
    train = load_result(steps["train_bpe"], TrainResult)
    model, tokenizer = train.model_and_tokenizer()
    again = str(tmp_path / "again")
    smaller.eval_kind.evaluate(again, Checkpoint(train.checkpoint_path(), model, tokenizer, train.vocab_size))
    assert pq.read_table(f"{again}/{COMPLETIONS_FILE}").to_pylist() == first
    # every sampling setting is identity
    for other in (Sampling(max_tokens=12, temperature=1.0, n=3, seed=6), Sampling(max_tokens=13, temperature=1.0,
                  n=3, seed=5), Sampling(max_tokens=12, temperature=0.9, n=3, seed=5),
                  Sampling(max_tokens=12, temperature=1.0, n=3, seed=5, top_p=0.9)):
        assert generate_step("generations/inside-sampled", steps["train_bpe"], TEXTS, other).name_with_hash != \
            step.name_with_hash
    assert generate_step("generations/inside-sampled", steps["train_bpe"], TEXTS, sampling,
                         logprobs=True).name_with_hash != step.name_with_hash


def chat_dataset(name: str, conversations: list[dict]) -> Step:
    def write(out: str) -> dict:
        import os
        os.makedirs(f"{out}/validation", exist_ok=True)
        with open(f"{out}/validation/chats.jsonl", "w") as f:
            for c in conversations:
                f.write(json.dumps(c) + "\n")
        return {"conversations": len(conversations)}
    return Step(name=name, fn=write, hash_attrs={"conversations": conversations}, kind="generate")


CHATS = [{"messages": [{"role": "user", "content": "What does the json module do?"},
                       {"role": "assistant", "content": "It reads and writes JSON."}]},
         {"conversations": [{"from": "system", "value": "Answer briefly."},
                            {"from": "human", "value": "What is a list?"}]}]


def test_conversations_are_rendered_with_the_chat_template_and_their_answers_kept_as_references(inside):
    from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE
    from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer

    steps, prefix = inside
    chats = chat_dataset("raw/inside-chats", CHATS)
    step = generate_step("generations/inside-chat", steps["train_bpe"], prompts_from(chats, chat=True),
                         Sampling(max_tokens=8))
    assert chats in step.deps
    materialize_step(chats, prefix=prefix)
    materialize_step(step, prefix=prefix)
    rows = rows_of(step)
    assert [r["reference"] for r in rows] == ["It reads and writes JSON.", None]
    tokenizer = load_hf_tokenizer(steps["export_bpe"].output_path)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "What does the json module do?"}],
                                             chat_template=DEFAULT_CHAT_TEMPLATE, add_generation_prompt=True,
                                             tokenize=False)
    assert rows[0]["prompt"] == rendered and "It reads" not in rows[0]["prompt"]
    assert rows[1]["prompt"].startswith(tokenizer.bos_token or "") and "Answer briefly." in rows[1]["prompt"]


def test_every_checkpoint_generates_as_a_partition(inside):
    steps, prefix = inside
    family = generate_checkpoints("generations/inside-checkpoints", steps["train_bpe"], TEXTS[:2],
                                  Sampling(max_tokens=6))
    step = family.step(2)
    outcome = materialize_step(step, prefix=prefix)
    result = load_result(step, GenerationResult)
    assert result.step == 2 and result.completions == 2 and "step-2" in result.checkpoint
    assert family.row(outcome.record.result)["mean_completion_tokens"] == result.completion_tokens / 2
    assert "tokens_per_second" in family.numbers(outcome.record.result)


def test_bad_prompts_are_errors_naming_them(inside):
    from marin_assets.core.step import StepDefinitionError
    from marin_assets.pipeline.data.readers import DatasetError

    steps, prefix = inside
    with pytest.raises(StepDefinitionError, match="prompt 1 is empty"):
        generate_step("generations/bad", steps["train_bpe"], ["fine", "  "])
    long = generate_step("generations/too-long", steps["train_bpe"], ["word " * 200], Sampling(max_tokens=8))
    with pytest.raises(GenerationInputError, match=r"prompt 0 has \d+ tokens; with max_tokens=8 it passes the"
                                                    r" model's 128 positions"):
        materialize_step(long, prefix=prefix)
    status = read_status(long.output_path)
    assert status is None or status.status is not Status.SUCCESS
    chats = chat_dataset("raw/inside-bad-chats", [{"messages": [{"role": "assistant", "content": "Hello."}]}])
    materialize_step(chats, prefix=prefix)
    step = generate_step("generations/bad-chat", steps["train_bpe"], prompts_from(chats, chat=True))
    with pytest.raises(DatasetError, match=r"chats.jsonl, line 1: the conversation does not end with a user turn"):
        materialize_step(step, prefix=prefix)
    missing = generate_step("generations/no-split", steps["train_bpe"], prompts_from(chats, "test", chat=True))
    with pytest.raises(DatasetError, match="has no 'test' split"):
        materialize_step(missing, prefix=prefix)
