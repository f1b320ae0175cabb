"""A trained model served behind OpenAI's API: Levanter's server (`levanter.inference.openai`: completions, chat
completions, streaming, `/v1/models`) on any checkpoint, export, Hub model or conversion — what `marin-assets serve`
starts, and `served(...)` in code.

What it adds to Levanter's server:
- the model is loaded as every evaluation loads it (`token_scorer`: a Levanter checkpoint or a Hugging Face folder),
  and the padding rows of its embedding are never written (`generation.vocab_limited`);
- the engine is sized from the model (its `seq_len`, four times the KV pages the sequences need: `EngineSettings`);
- a text prompt follows the document-start token training put before every document, as the generation step and
  the evaluations frame it, so a served model answers as `generate_step` does; a chat is rendered with the
  tokenizer's template, else `DEFAULT_CHAT_TEMPLATE`;
- a request that cannot fit (prompt and `max_tokens` past the model's positions; Levanter's default `max_tokens` is
  1,024) is answered `400` with the numbers, instead of a truncated or empty completion;
- the server runs in a thread until the `served` block ends (or, from the CLI, until SIGINT/SIGTERM), and stops
  cleanly: its port is free again.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec

from marin_assets.pipeline.evals.kind import Checkpoint

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")


class ServeError(RuntimeError):
    """The server did not start (the port is taken, the model has no paged decode)."""


@dataclass(frozen=True)
class Served:
    """A running server."""

    url: str
    """The OpenAI base URL: `http://host:port/v1` (what `openai.OpenAI(base_url=…)` takes)."""
    model_name: str
    """The model id the server advertises (`/v1/models`) and accepts."""
    seq_len: int


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's choice), so the URL is known before the server starts."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(checkpoint: Checkpoint, *, host: str = "127.0.0.1", port: int = 0, model_name: str = "marin",
           max_seqs: int = 16, who: str = "the served model", start_timeout: float = 600.0) -> Iterator[Served]:
    """`checkpoint` behind Levanter's OpenAI-compatible server on `host:port` (0: a free port) while the block runs."""
    import uvicorn
    from levanter.inference.openai import InferenceServer, InferenceServerConfig

    from marin_assets.pipeline.evals.token_scores import token_scorer
    from marin_assets.pipeline.tokens.chat import DEFAULT_CHAT_TEMPLATE
    from marin_assets.pipeline.training.generation import EngineSettings, GenerationError, vocab_limited

    port = port or free_port(host)
    with token_scorer(checkpoint, who) as scorer:
        tokenizer, seq_len = scorer.tokenizer, checkpoint.model.seq_len
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
        if not (hasattr(scorer.model, "decode") and hasattr(scorer.model, "initial_cache")):
            raise GenerationError(f"{who} ({type(scorer.model).__name__}) has no paged decode in Levanter: it cannot"
                                  " be served; Llama-family models can")
        service = EngineSettings.for_length(seq_len, max_seqs).engine_config()
        config = InferenceServerConfig(service=service, model_name=model_name, host=host, port=port)
        server = InferenceServer.create(config, vocab_limited(scorer.model, len(tokenizer)), tokenizer)
        app = RequestCheck(server.app, tokenizer, seq_len, model_name)
        uv = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        failed: list[BaseException] = []

        def run() -> None:
            try:
                uv.run()
            except BaseException as e:  # noqa: BLE001 - reported to the caller below
                failed.append(e)

        thread = threading.Thread(target=run, name=f"serve-{port}", daemon=True)
        thread.start()
        deadline = time.monotonic() + start_timeout
        while not uv.started:
            if not thread.is_alive() or failed:
                server.shutdown()
                raise ServeError(f"{who}: the server on {host}:{port} did not start"
                                 f" ({failed[0] if failed else 'it exited: is the port taken?'})")
            if time.monotonic() > deadline:
                raise ServeError(f"{who}: the server on {host}:{port} did not start in {start_timeout:.0f} s")
            thread.join(0.05)
        try:
            yield Served(f"http://{host}:{port}/v1", model_name, seq_len)
        finally:
            uv.should_exit = True
            thread.join(60)
            server.shutdown()


class RequestCheck:
    """ASGI middleware before Levanter's app: completions requests are framed and checked, the rest pass through.

    A text prompt gets the document-start token in front (as training saw every document); a request whose prompt
    and `max_tokens` pass the model's positions, or that names another model, is answered 400 with why."""

    def __init__(self, app: Any, tokenizer: Any, seq_len: int, model_name: str) -> None:
        self.app, self.tokenizer, self.seq_len, self.model_name = app, tokenizer, seq_len, model_name
        from marin_assets.pipeline.evals.token_scores import document_start_id

        start = document_start_id(tokenizer)
        self.document_start = tokenizer.convert_ids_to_tokens(start) if start is not None else ""

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in COMPLETION_PATHS:
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            request = json.loads(body)
            problem = self.problem(scope["path"], request)
        except (ValueError, TypeError, KeyError) as e:
            problem = f"the request body is not a completions request ({e})"
        if problem:
            payload = json.dumps({"error": {"message": problem, "type": "invalid_request_error"}}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": payload})
            return
        body = json.dumps(request).encode()
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        await self.app(scope, replay, send)

    def problem(self, path: str, request: dict) -> str | None:
        """Why the request cannot be answered (None: it can); frames its text prompts in place."""
        if request.get("model") not in (None, self.model_name):
            return f"model {request.get('model')!r} is not served here; this server serves {self.model_name!r}"
        max_tokens = request.get("max_tokens", request.get("max_completion_tokens", 1024))
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return f"max_tokens must be a positive integer, got {max_tokens!r}"
        if path == "/v1/completions":
            prompts = request.get("prompt")
            texts = [prompts] if isinstance(prompts, str) else prompts
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                return "prompt must be a text or a list of texts"
            texts = [self.document_start + t for t in texts]
            request["prompt"] = texts[0] if isinstance(prompts, str) else texts
            lengths = [len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        else:
            messages = request.get("messages")
            if not isinstance(messages, list) or not messages:
                return "messages must be a non-empty list"
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            lengths = [len(ids["input_ids"] if hasattr(ids, "keys") else ids)]
        longest = max(lengths)
        if longest + max_tokens > self.seq_len:
            return (f"the prompt has {longest} tokens and max_tokens is {max_tokens}: together they pass the model's"
                    f" {self.seq_len} positions; ask for at most {max(self.seq_len - longest, 0)} tokens")
        return None


def checkpoint_at(target: str, checkpoint_step: int | None = None) -> Checkpoint:
    """The model at `target`: a Hugging Face model folder (`config.json`), or a step's output whose record names a
    model — a training run (its last checkpoint, or `checkpoint_step`), an export, a Hub model or a conversion."""
    from marin_assets.core.record import RecordNotAvailableError, load_result
    from marin_assets.pipeline.training.export import ExportResult
    from marin_assets.pipeline.training.hf_folder import read_hf_config
    from marin_assets.pipeline.training.hf_model import model_spec_of

    fs, path = fsspec.core.url_to_fs(target)
    if fs.exists(f"{path.rstrip('/')}/config.json"):
        if checkpoint_step is not None:
            raise ServeError(f"{target} is one Hugging Face model, not a run's checkpoints; asked for step"
                             f" {checkpoint_step}")
        return Checkpoint(target, model_spec_of(read_hf_config(target)), target, None)
    try:
        result: Any = load_result(target)
    except (RecordNotAvailableError, FileNotFoundError) as e:
        raise ServeError(f"{target} is neither a Hugging Face model folder (no config.json) nor a materialized"
                         f" step's output ({e})") from None
    if isinstance(result, ExportResult):
        return checkpoint_at(result.path, checkpoint_step)
    if not hasattr(result, "model_and_tokenizer"):
        raise ServeError(f"{target} holds a {type(result).__name__}, not a model: serve a training run, an export,"
                         " a Hub model or a conversion")
    model, tokenizer = result.model_and_tokenizer()
    return Checkpoint(result.checkpoint_path(checkpoint_step), model, tokenizer, result.vocab_size)
