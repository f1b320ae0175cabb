"""Serving (`evals/serving.py`, `marin-assets serve`): Levanter's OpenAI-compatible server on a trained model,
answered through the official `openai` client — greedy completions equal the generation step's, chat completions
the engine's on the chat-rendered prompt, streaming the same text in pieces, a request too long for the model a
clear 400 — and stopped cleanly, from code and from the command line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import openai
import pyarrow.parquet as pq
import pytest

from marin_assets import materialize_step
from marin_assets.pipeline.evals.completions import COMPLETIONS_FILE, generate_step
from marin_assets.pipeline.evals.serving import ServeError, checkpoint_at, served
from marin_assets.pipeline.training.generation import Sampling
from resources import ServingResource
from tests.support.helpers import ROOT, subprocess_env, wait_for
from tests.support.looking_inside import looking_inside
from tests.test_generate_step import TEXTS

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    with looking_inside(tmp_path_factory, "export_bpe") as (steps, prefix):
        yield steps, prefix


@pytest.fixture(scope="module")
def server(inside):
    steps, _ = inside
    with served(checkpoint_at(steps["export_bpe"].output_path), model_name="inside") as running:
        yield running, openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=300)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: closed connections may linger
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_greedy_completions_equal_the_generation_steps(inside, server):
    steps, prefix = inside
    running, client = server
    step = generate_step("generations/inside-served", steps["train_bpe"], TEXTS, Sampling(max_tokens=MAX_TOKENS),
                         export=steps["export_bpe"])
    materialize_step(step, prefix=prefix)
    rows = pq.read_table(f"{step.output_path}/{COMPLETIONS_FILE}").to_pylist()
    compared = 0
    for text, row in zip(TEXTS, rows, strict=True):
        answer = client.completions.create(model="inside", prompt=text, max_tokens=MAX_TOKENS, temperature=0)
        choice = answer.choices[0]
        if row["finish_reason"] == "length":  # the step stops at EOS; Levanter's server writes on past it
            assert choice.text == row["completion"], text
            assert answer.usage.completion_tokens == MAX_TOKENS
            compared += 1
        else:
            assert choice.text.startswith(row["completion"]), text
    assert compared >= len(TEXTS) // 2
    assert [m.id for m in client.models.list().data] == ["inside"]


def test_chat_completions_answer_the_chat_rendered_prompt_and_streaming_sends_the_same_text(inside, server):
    from marin_assets.pipeline.evals.token_scores import token_scorer
    from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE
    from marin_assets.pipeline.training.generation import EngineSettings, Generator

    steps, _ = inside
    _, client = server
    messages = [{"role": "user", "content": "What does the json module do?"}]
    answer = client.chat.completions.create(model="inside", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    text = answer.choices[0].message.content
    with token_scorer(checkpoint_at(steps["export_bpe"].output_path), "the export") as scorer:
        tokenizer = scorer.tokenizer
        ids = tokenizer.apply_chat_template(messages, chat_template=DEFAULT_CHAT_TEMPLATE,
                                            add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        generator = Generator(scorer.model, settings=EngineSettings(max_seq_len=128, max_seqs=4),
                              vocab_limit=len(tokenizer), tokenizer=tokenizer)
        [[mine]] = generator.generate([ids], Sampling(max_tokens=MAX_TOKENS))
    assert text == tokenizer.decode(mine.tokens, skip_special_tokens=True)
    pieces = [chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="inside", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True) if chunk.choices]
    assert "".join(pieces) == text and len(pieces) >= 1
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="inside", prompt=TEXTS[0], max_tokens=MAX_TOKENS, temperature=0, stream=True) if c.choices)
    assert streamed == client.completions.create(model="inside", prompt=TEXTS[0], max_tokens=MAX_TOKENS,
                                                 temperature=0).choices[0].text


def test_a_request_the_model_cannot_hold_is_a_clear_400(server):
    _, client = server
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="inside", prompt=TEXTS[0], max_tokens=500, temperature=0)
    assert caught.value.status_code == 400
    assert "max_tokens is 500: together they pass the model's 128 positions; ask for at most" in str(caught.value)
    with pytest.raises(openai.BadRequestError, match="model 'gpt-4' is not served here; this server serves 'inside'"):
        client.completions.create(model="gpt-4", prompt=TEXTS[0], max_tokens=4)
    # the server still answers after refusing
    assert client.completions.create(model="inside", prompt=TEXTS[1], max_tokens=4, temperature=0).choices


def test_the_server_stops_cleanly_and_its_port_is_free_again(inside):
    steps, _ = inside
    with served(checkpoint_at(steps["export_bpe"].output_path)) as running:
        port = int(running.url.rsplit(":", 1)[1].split("/")[0])
        assert not port_is_free(port)
    assert port_is_free(port)
    with pytest.raises(ServeError, match="neither a Hugging Face model folder"):
        checkpoint_at(str(steps["export_bpe"].output_path) + "-missing")


def test_the_command_line_serves_an_asset_path_until_interrupted(inside, tmp_path):
    steps, _ = inside
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "marin_assets.cli", "serve", steps["export_bpe"].output_path,
                                    "--port", str(port)], cwd=ROOT, env=subprocess_env(), stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "serving " in log.read_text() or process.poll() is not None, timeout=600,
                 what="the server's URL line")
        assert process.poll() is None, log.read_text()[-3000:]
        assert f"at http://127.0.0.1:{port}/v1" in log.read_text()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        assert client.completions.create(model="marin", prompt=TEXTS[2], max_tokens=4, temperature=0).choices[0].text
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
        assert log.read_text().rstrip().endswith("stopped") and port_is_free(port)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_an_assets_code_asks_a_model_served_by_the_serving_resource(inside, server):
    """`ServingResource.serve(step)`: a model step's output served while an asset's block runs; its greedy answer is
    the module's server's."""
    import dagster as dg

    steps, _ = inside
    _, client = server
    expected = client.completions.create(model="inside", prompt=TEXTS[3], max_tokens=MAX_TOKENS, temperature=0)

    @dg.asset
    def answer(serving: ServingResource) -> str:
        with serving.serve(steps["export_bpe"]) as running:
            asked = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=300)
            reply = asked.completions.create(model="reviewed", prompt=TEXTS[3], max_tokens=MAX_TOKENS, temperature=0)
            port = int(running.url.rsplit(":", 1)[1].split("/")[0])
        assert port_is_free(port)
        return reply.choices[0].text

    result = dg.materialize([answer], resources={"serving": ServingResource(model_name="reviewed")})
    assert result.success and result.output_for_node("answer") == expected.choices[0].text
