"""The LLM pipeline's throughput against its references, side by side on the same corpus and cores.

(a) tokenize: our `tokenize` (read gzipped JSON lines, tokenize, write and merge the Levanter
    cache) tokens/s ÷ raw `tokenizers` `encode_batch` tokens/s on the same texts held in
    memory — the ceiling.
(b) train: the train step materialized through the lease protocol on a warm embedded Ray ÷
    bare `levanter.main.train_lm.main` on the identical Levanter config in a fresh process;
    tokens/s from wall time including imports and compilation on both sides.
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

from measure import rate_ratio

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def _corpus(tmp: str, documents: int) -> tuple[str, str]:
    from marin_assets.pipeline.data.corpus import generate_corpus
    from marin_assets.pipeline.tokens.tokenizer import train_tokenizer

    raw = os.path.join(tmp, "raw")
    generate_corpus(raw, train_documents=documents, validation_documents=500, seed=0, shards=4)
    return raw, train_tokenizer(os.path.join(tmp, "tok"), raw, vocab_size=1024).path


def levanter_build(cache_dir: str, raw: str, tokenizer_path: str) -> int:
    """Levanter's own cache builder (`build_or_load_cache` on its Ray actors) over the same files;
    returns the tokens written. One shard group: its default of 128 deadlocks on 2 CPUs."""
    import ray
    from levanter.data.text import UrlSingleDatasetLMConfig
    from levanter.store.cache import CacheOptions

    from marin_assets.pipeline.data.text_files import expand_files
    from marin_assets.pipeline.tokens.cache_writer import finished_counts

    config = UrlSingleDatasetLMConfig(train_urls=expand_files(raw, ["train/*"]),
                                      validation_urls=expand_files(raw, ["validation/*"]), cache_dir=cache_dir,
                                      tokenizer=tokenizer_path, cache_options=CacheOptions(num_shard_groups=1))
    tokens = 0
    for split in ("train", "validation"):
        cache = config.build_or_load_cache(split, monitors=False)
        cache.await_finished(None, await_cleanup=True)
        if cache._builder is not None:  # its manager actor would hold a share of a CPU until the driver exits
            ray.kill(cache._builder)
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
    """Our tokenize step (lease protocol, warm Ray worker, Levanter cache out) against the raw
    Rust tokenizer on texts in memory, and against Levanter's own Ray cache builder; the order
    of the three rotates every repetition."""
    import logging

    import ray

    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import Step
    from marin_assets.execution.ray_runner import ray_runner
    from marin_assets.pipeline.data.text_files import expand_files, iter_documents
    from marin_assets.pipeline.tokens.tokenize import tokenize
    from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer
    from resources import RayResource

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    resource, log = RayResource(), logging.getLogger("bench")
    settings = LeaseSettings(heartbeat_interval=10, stale_timeout=60, poll_interval=0.2)
    rates: dict[str, list[float]] = {"ours": [], "encode_batch": [], "encode_batch_fast": [], "levanter": []}
    # Keep idle Ray workers: Levanter's builder starts several, and on 2 CPUs Ray would evict
    # the warm worker our step runs on, which then pays its imports again (~3 s) every time.
    os.environ.setdefault("RAY_num_workers_soft_limit", "8")
    with tempfile.TemporaryDirectory() as tmp:
        raw, tok = _corpus(tmp, documents)
        texts = [t for _, _, t in iter_documents(expand_files(raw, ["train/*", "validation/*"]))]
        fast = load_hf_tokenizer(tok)._tokenizer
        resource.connect()
        on_ray = ray_runner(resource, log)

        def ours(rep: int) -> int:
            step = Step(name=f"bench/tokenize-{rep}", fn=lambda out: tokenize(out, raw, tok))
            outcome = materialize_step(step, prefix=os.path.join(tmp, "ours"), settings=settings, run_fn=on_ray)
            return sum(split["tokens"] for split in outcome.record.result["splits"].values())

        def raw_encode(method: str) -> Callable[[int], int]:
            encode = getattr(fast, method)
            return lambda rep: sum(len(e.ids) for i in range(0, len(texts), 1024) for e in encode(texts[i:i + 1024]))

        def levanter(rep: int) -> int:
            return levanter_build(os.path.join(tmp, f"levanter{rep}"), raw, tok)

        kinds = {"ours": ours, "encode_batch": raw_encode("encode_batch"),
                 "encode_batch_fast": raw_encode("encode_batch_fast"), "levanter": levanter}
        try:
            counted = {}
            for kind, fn in kinds.items():  # warm: Ray workers, imports, actors
                counted[kind] = fn(-1)
                await_ray_idle()
            assert counted["ours"] == counted["levanter"], f"caches differ: {counted}"
            for rep in range(reps):
                order = list(kinds)[rep % len(kinds):] + list(kinds)[:rep % len(kinds)]
                for kind in order:
                    start = time.perf_counter()
                    tokens = kinds[kind](rep)
                    rates[kind].append(tokens / (time.perf_counter() - start))
                    await_ray_idle()
        finally:
            resource.shutdown()
            if ray.is_initialized():
                ray.shutdown()
    size = f"{counted['ours'] / 1e6:.1f}M tokens"
    return [rate_ratio(f"tokenize asset ÷ raw tokenizers encode_batch ({size})", rates["ours"], rates["encode_batch"],
                       at_least=0.9, unit="tokens/s"),
            rate_ratio(f"tokenize asset ÷ raw tokenizers encode_batch_fast ({size})", rates["ours"],
                       rates["encode_batch_fast"], at_least=0.9, unit="tokens/s"),
            rate_ratio(f"tokenize asset ÷ Levanter's Ray cache builder ({size})", rates["ours"], rates["levanter"],
                       at_least=1.0, unit="tokens/s", strictly=True)]


TRAIN_SCRIPT = """
import json, os, sys, time
start = time.perf_counter()
spec = json.loads(sys.argv[1])
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training import levanter_configs as lc
from levanter.main import train_lm
out = spec["out"]
model, trainer = ModelSpec(**spec["model"]), TrainerSpec(**spec["trainer"])
ref = lc.write_reference_config(model, spec["vocab"], os.path.join(out, "reference"))
config = train_lm.TrainLmConfig(
    data=lc.data_config(spec["tokenizer"], {"stories": spec["cache"]}, {"stories": 1.0}),
    model=lc.model_config(model, ref, spec["tokenizer"]),
    trainer=lc.trainer_config(trainer, "bare", out, "bench.bare", os.path.join(out, "checkpoints")),
    optimizer=lc.optimizer_config(OptimizerSpec()), hf_save_path=os.path.join(out, "hf"), hf_save_steps=10**9)
train_lm.main(config)
print("SECONDS", time.perf_counter() - start)
"""


def measure_train(reps: int = 2, steps: int = 100) -> dict:
    import ray

    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import Step
    from marin_assets.execution.ray_runner import ray_runner
    from marin_assets.pipeline.tokens.tokenize import tokenize
    from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer
    from marin_assets.pipeline.training.pretrain import train_lm
    from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
    from resources import RayResource

    model = ModelSpec(hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, seq_len=256)
    trainer = TrainerSpec(num_train_steps=steps, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                          max_eval_batches=4)
    tokens = steps * trainer.train_batch_size * model.seq_len
    resource = RayResource()
    import logging

    log = logging.getLogger("bench")
    ours, bare = [], []
    with tempfile.TemporaryDirectory() as tmp:
        raw, tok = _corpus(tmp, 20_000)
        cache = tokenize(os.path.join(tmp, "cache"), raw, tok).path
        vocab = len(load_hf_tokenizer(tok))
        resource.connect()
        try:
            for rep in range(reps):
                step = Step(name=f"bench/train-{rep}", fn=lambda out: train_lm(
                    out, tok, {"stories": cache}, {"stories": 1.0}, model, OptimizerSpec(), trainer))
                start = time.perf_counter()
                materialize_step(step, prefix=os.path.join(tmp, "ours"), run_fn=ray_runner(resource, log),
                                 settings=LeaseSettings(heartbeat_interval=10, stale_timeout=60, poll_interval=1))
                ours.append(time.perf_counter() - start)
                spec = {"out": os.path.join(tmp, f"bare{rep}"), "tokenizer": tok, "cache": cache, "vocab": vocab,
                        "model": model.__dict__, "trainer": trainer.__dict__}
                start = time.perf_counter()
                subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, json.dumps(spec)], check=True, cwd=tmp,
                               capture_output=True)
                bare.append(time.perf_counter() - start)
        finally:
            resource.shutdown()
            if ray.is_initialized():
                ray.shutdown()
    return rate_ratio(f"train ÷ bare levanter train_lm ({steps} steps, wall incl. startup)",
                      [tokens / s for s in ours], [tokens / s for s in bare], at_least=0.97, unit="tokens/s")
