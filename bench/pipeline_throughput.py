"""The LLM pipeline's throughput against its references, side by side on the same corpus and cores.

(a) tokenize, on the demo-style generated corpus: our tokenize step (lease protocol, a warm Ray
    worker; read gzipped JSON lines, tokenize, write the Levanter cache) with fastokens forced (the default
    tries gigatoken first) and with the fallback forced (`backend="tokenizers"`), against each tokenizer library
    alone on the same texts held in memory in the driver, and against Levanter's own Ray cache
    builder; the five rotate their order every repetition, all warm (one untimed run each first).
    Goals on the same library (asset ÷ fastokens, asset with `tokenizers` ÷ `tokenizers`); the asset ÷
    the other library and ÷ Levanter's builder are reported for information.
(b) train, cold with cold: the train step materialized through `materialize_step` (lease protocol,
    record, summary; the function run in that process) in a fresh interpreter ÷ bare Levanter
    (`bare_levanter.py`: `levanter.main.train_lm.main` on a config written with Levanter's classes, in a
    fresh interpreter that imports none of the project's modules) on the same model, data, optimizer and
    steps — the two configs compared field by field first; tokens/s from each process's wall time,
    imports and compilation included on both sides, the order rotated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bare_levanter
from measure import compare, in_memory_encoders, rotated

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def _corpus(tmp: str, documents: int) -> tuple[str, str]:
    from marin_assets.pipeline.data.corpus import generate_corpus
    from marin_assets.pipeline.tokens.tokenizer import train_tokenizer

    raw = os.path.join(tmp, "raw")
    generate_corpus(raw, train_documents=documents, validation_documents=500, seed=0, shards=4)
    return raw, train_tokenizer(os.path.join(tmp, "tok"), raw, vocab_size=1024).path


def levanter_build(cache_dir: str, raw: str, tokenizer_path: str) -> int:
    """Levanter's own cache builder (`build_or_load_cache`: a zephyr pipeline, here on its local backend) over
    the same files, with the processor our caches record; returns the tokens written."""
    from levanter.data.sharded_datasource import UrlDataSource
    from levanter.store.cache import build_or_load_cache

    from marin_assets.pipeline.data.text_files import expand_files
    from marin_assets.pipeline.tokens import levanter_cache as lc
    from marin_assets.pipeline.tokens.cache_writer import finished_counts

    processor = lc.batch_tokenizer(tokenizer_path, "text")
    tokens = 0
    for split in ("train", "validation"):
        build_or_load_cache(os.path.join(cache_dir, split), UrlDataSource(expand_files(raw, [f"{split}/*"])), processor)
        tokens += finished_counts(os.path.join(cache_dir, split), tokenizer_path).tokens
    return tokens


def await_ray_idle(timeout: float = 15.0) -> None:
    """Wait until every CPU of the Ray cluster is free again: Levanter's builder actors linger
    for a few seconds after a build and would hold the CPUs the next measurement asks for."""
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0):
            return
        time.sleep(0.2)


def measure_tokenize(reps: int = 5, documents: int = 40_000) -> list[dict]:
    """(a) above."""
    import logging

    import ray

    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import Step
    from marin_assets.execution.ray_runner import ray_runner
    from marin_assets.pipeline.data.text_files import expand_files, iter_documents
    from marin_assets.pipeline.tokens.encoders import _fastokens, _reference
    from marin_assets.pipeline.tokens.tokenize import tokenize
    from resources import RayResource

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    resource, log = RayResource(), logging.getLogger("bench")
    settings = LeaseSettings(heartbeat_interval=10, stale_timeout=60, poll_interval=0.2)
    # Keep idle Ray workers: Levanter's builder starts several, and on 2 CPUs Ray would evict the
    # warm worker our step runs on, which then pays its imports again (~3 s) every time.
    os.environ.setdefault("RAY_num_workers_soft_limit", "8")
    with tempfile.TemporaryDirectory() as tmp:
        raw, tok = _corpus(tmp, documents)
        texts = [t for _, _, t in iter_documents(expand_files(raw, ["train/*", "validation/*"]))]
        hf, fast = _reference(tok), _fastokens(tok)
        resource.connect()
        on_ray = ray_runner(resource, log)
        backend: dict[str, str] = {}
        totals: dict[str, int] = {}
        documents: dict[str, int] = {}

        def asset(requested: str) -> Callable[[int], int]:
            def run(rep: int) -> int:
                step = Step(name=f"bench/tokenize-{requested}-{rep}",
                            fn=lambda out: tokenize(out, raw, tok, backend=requested))
                result = materialize_step(step, prefix=os.path.join(tmp, "ours"), settings=settings,
                                          run_fn=on_ray).record.result
                backend[requested] = result["backend"]
                framing = result["framing"] or {}
                per_document = (framing.get("bos_id") is not None) + (framing.get("eos_id") is not None)
                totals[requested] = sum(split["tokens"] for split in result["splits"].values())
                documents[requested] = sum(split["documents"] for split in result["splits"].values())
                return sum(split["tokens"] - per_document * split["documents"] for split in result["splits"].values())
            return run

        def levanter(rep: int) -> int:
            return levanter_build(os.path.join(tmp, f"levanter{rep}"), raw, tok)

        # fastokens forced, to compare with fastokens alone: the default now tries gigatoken first
        kinds = {"ours": asset("fastokens"), "ours_tokenizers": asset("tokenizers"),
                 **in_memory_encoders(texts, hf, fast),
                 "levanter": levanter}
        rates: dict[str, list[float]] = {kind: [] for kind in kinds}
        try:
            counted = {}
            for kind, fn in kinds.items():  # warm: Ray workers, imports, actors
                counted[kind] = fn(-1)
                await_ray_idle()
            levanter_tokens = counted.pop("levanter")
            # Levanter's own BatchTokenizer appends its EOS as the text " <eos>": with a byte-level BPE that is one
            # token more per document (a space) than our framing's EOS id; nothing else may differ.
            if len(set(counted.values())) != 1 or levanter_tokens - totals["fastokens"] not in (
                    0, documents["fastokens"]):
                raise AssertionError(f"token counts differ: {counted}, caches {totals}"
                                     f" ({documents['fastokens']} documents) vs Levanter's {levanter_tokens}")
            if backend != {"fastokens": "fastokens", "tokenizers": "tokenizers"}:
                raise AssertionError(f"the asset did not tokenize with the backends compared: {backend}")
            for rep in range(reps):
                for kind in rotated(list(kinds), rep):
                    start = time.perf_counter()
                    tokens = kinds[kind](rep)
                    rates[kind].append(tokens / (time.perf_counter() - start))
                    await_ray_idle()
        finally:
            resource.shutdown()
            if ray.is_initialized():
                ray.shutdown()
    size = f"{counted['ours'] / 1e6:.1f}M tokens of generated stories, 1k BPE"
    where = "asset on a warm Ray worker, libraries in memory in the driver"
    return [
        compare("tokenize_vs_fastokens", f"tokenize asset (fastokens) ÷ fastokens encode_batch_flat on the same texts"
                f" ({size}; {where})", rates["ours"], rates["fastokens"], "tokens/s", goal=("ratio", ">=", 0.9)),
        compare("tokenize_vs_tokenizers", f"tokenize asset (backend='tokenizers' forced) ÷ HF tokenizers"
                f" encode_batch_fast on the same texts ({size}; {where})", rates["ours_tokenizers"],
                rates["tokenizers"], "tokens/s", goal=("ratio", ">=", 0.9)),
        compare("tokenize_library", f"tokenize asset (fastokens) ÷ HF tokenizers encode_batch_fast ({size}):"
                " a library choice, for information", rates["ours"], rates["tokenizers"], "tokens/s"),
        compare("tokenize_vs_levanter", f"tokenize asset (fastokens) ÷ Levanter's cache builder ({size}):"
                " context, not a goal", rates["ours"], rates["levanter"], "tokens/s",
                note="Levanter's zephyr cache pipeline on its local backend"),
    ]


OURS_TRAIN_SCRIPT = """
import json, sys
spec = json.loads(sys.argv[1])
from marin_assets.core.lease import LeaseSettings
from marin_assets.core.materialize import materialize_step
from marin_assets.core.step import Step
from marin_assets.pipeline.training.pretrain.step import train_lm
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
model, trainer = ModelSpec(**spec["model"]), TrainerSpec(**spec["trainer"])
step = Step(name=spec["name"], fn=lambda out: train_lm(out, spec["tokenizer"], {"stories": spec["cache"]},
                                                        {"stories": 1.0}, model, OptimizerSpec(), trainer,
                                                        platform=spec.get("platform")))
outcome = materialize_step(step, prefix=spec["prefix"],
                           settings=LeaseSettings(heartbeat_interval=10, stale_timeout=60, poll_interval=1))
print(json.dumps({"steps": outcome.record.result["steps"], "cached": outcome.cached, "output": outcome.output_path}))
"""
"""Ours: the train step through the lease protocol, its function run in this process (on `spec["platform"]`:
None is JAX's choice; bench/gpu_train.py passes `cuda`)."""

CONFIG_DIFFERENCES = {
    "data": "ours is Levanter's LmDataConfig subclassed",
    "data.model_vocab_size": "its one more field: a tokenizer view for a rounded-up vocabulary (here the tokenizer's"
                             " own size, checked, so the view changes nothing)",
    "trainer.tracker.logger_name": "the Python logger Levanter's JSON tracker writes to",
    "trainer.checkpointer": "ours is Levanter's CheckpointerConfig subclassed (its fields still compared): after"
                            " SIGTERM it saves and stops (preemption); otherwise it is Levanter's checkpointer",
}
"""Where our config may differ from bare Levanter's, and why that is not a different run."""


def config_differences(ours: Any, bare: Any, path: str = "") -> list[str]:
    """Where two Levanter configs differ: dotted field paths (a class that differs is named at its path, and its
    shared fields still compared)."""
    import dataclasses

    if dataclasses.is_dataclass(ours) and dataclasses.is_dataclass(bare):
        found = [path] if type(ours) is not type(bare) else []
        names = {f.name for f in dataclasses.fields(bare)}
        found += [f"{path}.{f.name}".lstrip(".") for f in dataclasses.fields(ours) if f.name not in names]
        for name in sorted(names & {f.name for f in dataclasses.fields(ours)}):
            found += config_differences(getattr(ours, name), getattr(bare, name), f"{path}.{name}".lstrip("."))
        return found
    if isinstance(ours, dict) and isinstance(bare, dict) and ours.keys() == bare.keys():
        return [d for k in ours for d in config_differences(ours[k], bare[k], f"{path}.{k}".lstrip("."))]
    if isinstance(ours, list | tuple) and isinstance(bare, list | tuple) and len(ours) == len(bare):
        return [d for i, (a, b) in enumerate(zip(ours, bare, strict=True))
                for d in config_differences(a, b, f"{path}[{i}]")]
    return [] if ours == bare else [path]


def check_same_config(tokenizer: str, cache: str, model: Any, trainer: Any, vocab: int, bare_spec: dict) -> None:
    """Our train step's Levanter config and bare Levanter's for the same run (the same output folder and run id)
    differ only where `CONFIG_DIFFERENCES` says; the model's vocabulary is what Levanter makes of the tokenizer."""
    import bare_levanter
    from levanter.tokenizers import load_tokenizer

    from marin_assets.pipeline.training.pretrain.step import LmTraining
    from marin_assets.pipeline.training.runner import RunPlaces
    from marin_assets.pipeline.training.specs import OptimizerSpec

    levanter_vocab = len(load_tokenizer(tokenizer))
    if levanter_vocab != vocab:
        raise RuntimeError(f"the model's vocabulary ({vocab}) is not the tokenizer's ({levanter_vocab}): bare"
                           " Levanter sizes it by the tokenizer alone")
    out = bare_spec["out"]
    places = RunPlaces(output_path=out, run_id=bare_spec["run_id"], local_dir=out, scratch=out,
                       checkpoints=os.path.join(out, "checkpoints"), hf_save_path=os.path.join(out, "hf"),
                       reference=bare_spec["reference"], metrics_logger="marin.metrics.check", resuming=False,
                       platform=None)
    ours = LmTraining(tokenizer, {"stories": cache}, {"stories": 1.0}, model, OptimizerSpec(), trainer,
                      vocab).config(places)
    unexpected = [d for d in config_differences(ours, bare_levanter.config(bare_spec)) if d not in CONFIG_DIFFERENCES]
    if unexpected or ours.data.model_vocab_size != vocab:
        raise RuntimeError(f"our train config and bare Levanter's differ at {unexpected or 'the vocabulary'}")


def _fresh_process(argv: list[str], spec: dict, cwd: str) -> float:
    """Wall seconds of a fresh interpreter running `argv` with the spec (no JAX compilation cache: both sides cold)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv, json.dumps(spec)], cwd=cwd, env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"training process failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    if done.get("cached") or done["steps"] != spec["trainer"]["num_train_steps"]:
        raise RuntimeError(f"the training process did not train {spec['trainer']['num_train_steps']} steps: {done}")
    if done.get("project_modules"):
        raise RuntimeError(f"bare Levanter imported the project's modules: {done['project_modules']}")
    return seconds


def measure_train(reps: int = 4, steps: int = 100, documents: int = 20_000) -> dict:
    """(b) above. An even number of repetitions puts each side first as often as second (A B, B A, …): the ratio,
    ~1 % from its goal, is then not decided by which side ran first, and 4 is two such pairs, not one."""
    from marin_assets.pipeline.tokens.tokenize import tokenize
    from marin_assets.pipeline.tokens.tokenizer import model_vocab_size
    from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec

    # The tokenizer's own vocabulary (no rounding up): bare Levanter sizes the embedding by the tokenizer alone.
    model = ModelSpec(hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, seq_len=256,
                      vocab_multiple=1)
    trainer = TrainerSpec(num_train_steps=steps, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                          max_eval_batches=4)
    tokens = steps * trainer.train_batch_size * model.seq_len
    seconds: dict[str, list[float]] = {"ours": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        raw, tok = _corpus(tmp, documents)
        cache = tokenize(os.path.join(tmp, "cache"), raw, tok).path
        common = {"tokenizer": tok, "cache": cache, "model": model.__dict__, "trainer": trainer.__dict__}
        vocab = model_vocab_size(tok, model.vocab_multiple)
        reference = bare_levanter.reference_config(model.__dict__, vocab, os.path.join(tmp, "reference"))

        def bare_spec(rep: int) -> dict:
            out = os.path.join(tmp, f"bare-{rep}")
            return {**common, "out": out, "run_id": os.path.basename(out), "reference": reference,
                    "optimizer": OptimizerSpec().__dict__}

        check_same_config(tok, cache, model, trainer, vocab, bare_spec(0))
        for rep in range(reps):
            for kind in rotated(["ours", "bare"], rep):
                if kind == "ours":
                    spec = {**common, "name": f"bench/train-{rep}", "prefix": os.path.join(tmp, "ours")}
                    seconds["ours"].append(_fresh_process(["-c", OURS_TRAIN_SCRIPT], spec, tmp))
                else:
                    seconds["bare"].append(_fresh_process([str(BENCH / "bare_levanter.py")], bare_spec(rep), tmp))
    return compare("train_vs_levanter", f"train ÷ bare Levanter train_lm (Levanter's classes only, none of ours),"
                   " same model, data and steps, cold with cold: each a fresh interpreter"
                   f" ({steps} steps, {tokens:,} tokens; wall incl. imports and compilation)",
                   [tokens / s for s in seconds["ours"]], [tokens / s for s in seconds["bare"]], "tokens/s",
                   goal=("ratio", ">=", 0.97))
