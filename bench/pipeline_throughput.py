"""The LLM pipeline's throughput against its references, side by side on the same corpus and cores.

(a) tokenize, on the demo-style generated corpus: our tokenize step (lease protocol, a warm Ray
    worker; read gzipped JSON lines, tokenize, write the Levanter cache) with its default backend
    (fastokens) and with the fallback forced (`backend="tokenizers"`), against each tokenizer library
    alone on the same texts held in memory in the driver, and against Levanter's own Ray cache
    builder; the five rotate their order every repetition, all warm (one untimed run each first).
    Goals on the same library (asset ÷ fastokens, asset with `tokenizers` ÷ `tokenizers`); the asset ÷
    the other library and ÷ Levanter's builder are reported for information.
(b) train, cold with cold: the train step materialized through `materialize_step` (lease protocol,
    record, summary; the function run in that process) in a fresh interpreter ÷ bare
    `levanter.main.train_lm.main` on the identical Levanter config in a fresh interpreter; tokens/s
    from each process's wall time, imports and compilation included on both sides, the order rotated.
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

        kinds = {"ours": asset("auto"), "ours_tokenizers": asset("tokenizers"), **in_memory_encoders(texts, hf, fast),
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
            if len(set(counted.values())) != 1 or levanter_tokens - totals["auto"] not in (0, documents["auto"]):
                raise AssertionError(f"token counts differ: {counted}, caches {totals} ({documents['auto']} documents)"
                                     f" vs Levanter's {levanter_tokens}")
            if backend != {"auto": "fastokens", "tokenizers": "tokenizers"}:
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
from marin_assets.pipeline.training.pretrain import train_lm
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

BARE_TRAIN_SCRIPT = """
import json, os, sys, tempfile
spec = json.loads(sys.argv[1])
from marin_assets.pipeline.training.levanter_model import write_reference_config
from marin_assets.pipeline.training.levanter_trainer import JsonlMetrics
from marin_assets.pipeline.training.pretrain import LmTraining
from marin_assets.pipeline.training.runner import RunPlaces
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from levanter.main import train_lm
model, trainer = ModelSpec(**spec["model"]), TrainerSpec(**spec["trainer"])
out = os.path.abspath(spec["out"])
run_id = os.path.basename(out)
with tempfile.TemporaryDirectory() as scratch:
    places = RunPlaces(output_path=out, run_id=run_id, local_dir=out, scratch=scratch,
                       checkpoints=os.path.join(out, "checkpoints"), hf_save_path=os.path.join(out, "hf"),
                       reference=write_reference_config(model, spec["vocab"], os.path.join(out, "reference")),
                       metrics_logger=f"marin.metrics.{run_id}", resuming=False, platform=spec.get("platform"))
    method = LmTraining(spec["tokenizer"], {"stories": spec["cache"]}, {"stories": 1.0}, model, OptimizerSpec(),
                        trainer, spec["vocab"])
    with JsonlMetrics(places.metrics_logger, os.path.join(out, "metrics.jsonl")):  # as the runner keeps them
        train_lm.main(method.config(places))
print(json.dumps({"steps": trainer.num_train_steps, "output": out}))
"""
"""Bare Levanter: `levanter.main.train_lm.main` on the config our step builds for the same run (the same
builder, `LmTraining.config`, so the two configs are identical), nothing else."""


def _fresh_process(script: str, spec: dict, cwd: str) -> float:
    """Wall seconds of a fresh interpreter running `script` (no JAX compilation cache: both sides cold)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], cwd=cwd, env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"training process failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    if done.get("cached") or done["steps"] != spec["trainer"]["num_train_steps"]:
        raise RuntimeError(f"the training process did not train {spec['trainer']['num_train_steps']} steps: {done}")
    return seconds


def measure_train(reps: int = 4, steps: int = 100, documents: int = 20_000) -> dict:
    """(b) above. An even number of repetitions puts each side first as often as second (A B, B A, …): the ratio,
    ~1 % from its goal, is then not decided by which side ran first, and 4 is two such pairs, not one."""
    from marin_assets.pipeline.tokens.tokenize import tokenize
    from marin_assets.pipeline.tokens.tokenizer import model_vocab_size
    from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec

    model = ModelSpec(hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, seq_len=256)
    trainer = TrainerSpec(num_train_steps=steps, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                          max_eval_batches=4)
    tokens = steps * trainer.train_batch_size * model.seq_len
    seconds: dict[str, list[float]] = {"ours": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        raw, tok = _corpus(tmp, documents)
        cache = tokenize(os.path.join(tmp, "cache"), raw, tok).path
        common = {"tokenizer": tok, "cache": cache, "model": model.__dict__, "trainer": trainer.__dict__}
        for rep in range(reps):
            for kind in rotated(["ours", "bare"], rep):
                if kind == "ours":
                    spec = {**common, "name": f"bench/train-{rep}", "prefix": os.path.join(tmp, "ours")}
                    seconds["ours"].append(_fresh_process(OURS_TRAIN_SCRIPT, spec, tmp))
                else:
                    spec = {**common, "out": os.path.join(tmp, f"bare-{rep}"),
                            "vocab": model_vocab_size(tok, model.vocab_multiple)}
                    seconds["bare"].append(_fresh_process(BARE_TRAIN_SCRIPT, spec, tmp))
    return compare("train_vs_levanter", f"train ÷ bare Levanter train_lm, cold with cold: each a fresh interpreter"
                   f" ({steps} steps, {tokens:,} tokens; wall incl. imports and compilation)",
                   [tokens / s for s in seconds["ours"]], [tokens / s for s in seconds["bare"]], "tokens/s",
                   goal=("ratio", ">=", 0.97))
