"""The one place that touches Levanter's lm-eval harness internals (marin-levanter 0.2.227; pinned by
`tests/test_private_apis.py`): the private `levanter.eval_harness._LmEvalHarnessWorker` (the jitted scorer
Levanter's public `run_lm_eval_harness` builds but does not expose) under a `LevanterHarnessLM` that scores a
continuation as training sees it, in one process. The public runner cannot serve: it tokenizes without the
document-start token, takes tasks only as `TaskConfig`s (no local data files) and skips `simple_evaluate`.
Checkpoints load through Levanter's public `levanter.model_loading`. Levanter is imported inside functions.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from marin_assets.pipeline.evals.token_scores import document_start_id
from marin_assets.pipeline.tokens.tokenizer import model_vocab_size
from marin_assets.pipeline.training.export import is_hf_model
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec


@functools.cache
def lm_class() -> type:
    """The lm-eval model class (built on first use: Levanter and lm-eval are imported only where it runs)."""
    import jax
    import numpy as np
    from levanter.data.loader import stack_batches
    from levanter.data.packing import PromptCompletion, greedy_pack_prompt_completions
    from levanter.eval_harness import LevanterHarnessLM, get_segment_ids_from_batch
    from levanter.utils.background_iterable import BackgroundIterator
    from lm_eval.api.model import TemplateLM

    class FramedHarnessLM(LevanterHarnessLM):
        """Levanter's lm-eval model, tokenizing as lm-eval's `TemplateLM` does behind the document-start token."""

        def __init__(self, leader: Any):
            super().__init__(leader)
            self.truncated: dict[str, int] = {}
            """Task → requests whose context was cut from the left to fit the model's length."""

        @property
        def prefix_token_id(self) -> int | None:
            """The token training put before every document: BOS, else EOS (which ends the one before)."""
            return document_start_id(self.tokenizer)

        def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
            """Token ids of text alone: never the post-processor's BOS/EOS."""
            ids = self.tokenizer(string, add_special_tokens=False, return_attention_mask=False).input_ids
            return ids[-left_truncate_len:] if left_truncate_len else ids

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            """lm-eval's encoding of each (context, continuation), then `_loglikelihood_tokens`; counts per task
            the requests cut to the model's length in `truncated`."""
            self._cut: list[int] = []
            scored = TemplateLM.loglikelihood(self, requests, disable_tqdm=disable_tqdm)
            for i in self._cut:
                self.truncated[requests[i].task_name] = self.truncated.get(requests[i].task_name, 0) + 1
            return scored

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False):
            """Score tokenized requests, packed several to a sequence (attention stays within each), in batches.

            Each is the document-start token, the context and the continuation, cut from the left to the
            model's length; the continuation's tokens are scored."""
            Pos, prefix = self.EvalPos, self.prefix_token_id
            sequences = []
            for i, (_, context, continuation) in enumerate(requests):
                context = context if context[:1] == [prefix] else [prefix, *context]
                ids = (context + continuation)[-Pos.size:]
                if len(context) + len(continuation) > Pos.size:
                    self._cut.append(i)
                sequences.append(PromptCompletion(ids=ids, prompt_length=max(len(ids) - len(continuation), 1),
                                                  segment_id=i))
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else prefix
            packed = greedy_pack_prompt_completions(Pos, sequences, pad_token=pad,
                                                    max_segments_per_example=self.leader.max_packed_segments)
            logprobs, greedy = np.zeros(len(requests)), np.zeros(len(requests), dtype=bool)
            covered = np.zeros(len(requests), dtype=bool)
            # `stack_batches` yields from inside a one-CPU mesh and device: a thread keeps both out of scoring
            for batch in BackgroundIterator(stack_batches(iter(packed), Pos, self.EvalBatch), max_capacity=64):
                expected = set(get_segment_ids_from_batch(batch, self.leader.max_packed_segments * self.EvalBatch.size))
                ids, lls, correct = (jax.device_get(a.array) for a in self.leader.dispatch_loglikelihood(batch))
                valid = ids != -1
                if set(ids[valid].tolist()) != expected:
                    raise RuntimeError(f"scored segments {sorted(set(ids[valid].tolist()))} are not the batch's"
                                       f" {sorted(expected)}")
                logprobs[ids[valid]], greedy[ids[valid]] = lls[valid], correct[valid]
                covered[ids[valid]] = True
            if not covered.all():
                raise RuntimeError(f"requests {np.where(~covered)[0][:10].tolist()} were not scored")
            return [(float(lp), bool(g)) for lp, g in zip(logprobs, greedy, strict=True)]

        def generate_until(self, requests, disable_tqdm: bool = False):
            """Each request's answer, written by the project's generation engine (`training.generation`: Levanter's
            paged KV cache, every prompt answered, float32) after the document-start token, as `loglikelihood`
            frames a context; cut at the first `until` text, as lm-eval's own models cut it. Requests with the same
            settings go together; a context is cut from the left to leave `max_gen_toks` positions (counted in
            `truncated`). Sampled requests (`do_sample`) use seed `seed` (default 0): deterministic."""
            from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

            from marin_assets.pipeline.training.generation import Sampling, cut_at_stop_texts

            Pos, prefix = self.EvalPos, self.prefix_token_id
            eos_text = self.tokenizer.decode([self.tokenizer.eos_token_id]) if self.tokenizer.eos_token_id is not None \
                else None
            groups: dict[Sampling, list[tuple[int, list[int], list[str]]]] = {}
            for i, request in enumerate(requests):
                context, gen_kwargs = request.args
                kwargs = normalize_gen_kwargs(dict(gen_kwargs), 256)
                until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
                max_tokens = int(kwargs.pop("max_gen_toks"))
                if max_tokens >= Pos.size:
                    raise ValueError(f"task {request.task_name}: max_gen_toks={max_tokens} leaves no room for a prompt"
                                     f" in the model's {Pos.size} positions")
                ids = [prefix, *self.tok_encode(context)]
                if len(ids) > Pos.size - max_tokens:
                    ids = ids[len(ids) - (Pos.size - max_tokens):]
                    self.truncated[request.task_name] = self.truncated.get(request.task_name, 0) + 1
                temperature = float(kwargs.get("temperature") or 0.0) if kwargs.get("do_sample") else 0.0
                sampling = Sampling(max_tokens=max_tokens, temperature=temperature,
                                    top_p=float(kwargs.get("top_p") or 1.0), seed=int(kwargs.get("seed") or 0),
                                    stop=tuple(self._engine_stops(until)))
                groups.setdefault(sampling, []).append((i, ids, until))
            answers = [""] * len(requests)
            for sampling, rows in groups.items():
                done = self.generator.generate([ids for _, ids, _ in rows], sampling)
                for (i, _, until), (completion,) in zip(rows, done, strict=True):
                    answers[i] = cut_at_stop_texts(self.tokenizer, completion, until)[1]
            return answers

        def _engine_stops(self, until: list[str]) -> list[str]:
            """The `until` texts the engine can stop on (those of at most its stop length, EOS aside); the rest
            still end the answer, by the text cut, after the engine wrote `max_gen_toks`."""
            settings = self.generator.settings
            fit = [u for u in until if u and u != self.tokenizer.eos_token
                   and len(self.tokenizer(u, add_special_tokens=False)["input_ids"]) <= settings.max_stop_tokens]
            return fit[:settings.max_stop_seqs - len(self.generator.eos_ids)]

        @functools.cached_property
        def generator(self) -> Any:
            """The engine on the scored model, built on the first generative request."""
            from marin_assets.pipeline.training.generation import EngineSettings, Generator

            return Generator(self.leader.model, settings=EngineSettings.for_length(self.EvalPos.size, 16,
                                                                                  max_stop_seqs=8),
                vocab_limit=len(self.tokenizer), tokenizer=self.tokenizer,
                eos_ids=[self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else [],
                who="the evaluated model")

    return FramedHarnessLM


@contextlib.contextmanager
def harness_model(checkpoint: str, model: ModelSpec, tokenizer_path: str, vocab_size: int | None = None,
                  batch_size: int = 8, platform: str | None = None) -> Iterator[Any]:
    """A Levanter checkpoint (or Hugging Face folder) as an lm-eval model (`lm_eval.api.model.LM`), for
    `lm_eval.simple_evaluate(model=…)`: loglikelihoods of `batch_size` packed sequences of the model's training
    length (`model.seq_len`) at a time.

    `vocab_size`: rows of the model's embedding (None: as a fresh training run sizes it)."""
    from marin_assets.pipeline.training.levanter_trainer import use_platform

    use_platform(platform, f"harness evaluation of {checkpoint}")  # before Levanter starts JAX
    import haliax as hax
    import jax
    from levanter.compat.hf_checkpoints import load_tokenizer
    from levanter.eval_harness import _LmEvalHarnessWorker
    from levanter.model_loading import load_hf_checkpoint, load_levanter_checkpoint
    from levanter.utils.tree_utils import inference_mode

    from marin_assets.pipeline.training.levanter_model import model_config, write_reference_config
    from marin_assets.pipeline.training.levanter_trainer import trainer_config

    is_hf = is_hf_model(checkpoint)
    vocab = vocab_size or model_vocab_size(tokenizer_path, model.vocab_multiple)
    tokenizer = load_tokenizer(tokenizer_path)
    with tempfile.TemporaryDirectory(prefix="marin-harness-") as scratch:
        config = model_config(model, write_reference_config(model, vocab, os.path.join(scratch, "ref")),
                              tokenizer_path)
        trainer = trainer_config(TrainerSpec(num_train_steps=1, train_batch_size=batch_size), "harness", scratch,
                                 "marin.harness", require_accelerator=platform not in (None, "cpu"))
        with trainer.use_device_mesh():
            if is_hf:  # its embedding keeps the folder's own rows; no hub mirror for a local folder
                lm_model = load_hf_checkpoint(config, checkpoint, axis_mapping=trainer.parameter_axis_mapping,
                                              tokenizer=tokenizer, compute_dtype=trainer.mp.compute_dtype,
                                              cache_ttl_days=0)
            else:
                lm_model = load_levanter_checkpoint(config, checkpoint, Vocab=hax.Axis("vocab", vocab),
                                                    axis_mapping=trainer.parameter_axis_mapping,
                                                    key=jax.random.PRNGKey(0))
            lm_model = inference_mode(lm_model, True)
            worker = _LmEvalHarnessWorker(trainer.TrainBatch, lm_model.Pos.resize(model.seq_len), lm_model,
                                          trainer.compute_axis_mapping, tokenizer, trainer.mp, max_packed_segments=64)
            yield lm_class()(worker)


@contextlib.contextmanager
def single_process_bootstrap() -> Iterator[None]:
    """lm-eval bootstraps stderrs in a process pool unless `DISABLE_MULTIPROC` is set: not inside a worker."""
    before = os.environ.get("DISABLE_MULTIPROC")
    os.environ["DISABLE_MULTIPROC"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DISABLE_MULTIPROC", None)
        else:
            os.environ["DISABLE_MULTIPROC"] = before
