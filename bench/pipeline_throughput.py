"""The LLM pipeline's throughput against its references, side by side on the same corpus and cores.

(a) tokenize: our `tokenize` (read gzipped JSON lines, tokenize, write and merge the Levanter
    cache) tokens/s ÷ raw `tokenizers` `encode_batch` tokens/s on the same texts held in
    memory — the ceiling.
(b) train: the train step materialized through the lease protocol on a warm embedded Ray ÷
    bare `levanter.main.train_lm.main` on the identical Levanter config in a fresh process;
    tokens/s from wall time including imports and compilation on both sides.
(c) the demo end to end: `make demo`'s `dagster asset materialize` on a fresh instance and prefix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import rate_ratio, time_ratio

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def _corpus(tmp: str, documents: int) -> tuple[str, str]:
    from marin_assets.pipeline.corpus import generate_corpus
    from marin_assets.pipeline.tokenizer import train_tokenizer

    raw = os.path.join(tmp, "raw")
    generate_corpus(raw, train_documents=documents, validation_documents=500, seed=0, shards=4)
    return raw, train_tokenizer(os.path.join(tmp, "tok"), raw, vocab_size=1024).path


def measure_tokenize(reps: int = 5, documents: int = 40_000) -> dict:
    from marin_assets.pipeline.text_files import expand_files, iter_documents
    from marin_assets.pipeline.tokenize import tokenize
    from marin_assets.pipeline.tokenizer import load_hf_tokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    with tempfile.TemporaryDirectory() as tmp:
        raw, tok = _corpus(tmp, documents)
        texts = [t for _, _, t in iter_documents(expand_files(raw, ["train/*", "validation/*"]))]
        fast = load_hf_tokenizer(tok)._tokenizer
        ours, ceiling = [], []
        tokenize(os.path.join(tmp, "warm"), raw, tok)
        for rep in range(reps):
            start = time.perf_counter()
            result = tokenize(os.path.join(tmp, f"c{rep}"), raw, tok)
            tokens = sum(s.tokens for s in result.splits.values())
            ours.append(tokens / (time.perf_counter() - start))
            start = time.perf_counter()
            counted = 0
            for i in range(0, len(texts), 1024):
                counted += sum(len(e.ids) for e in fast.encode_batch(texts[i:i + 1024]))
            ceiling.append(counted / (time.perf_counter() - start))
    return rate_ratio(f"tokenize ÷ raw tokenizers encode_batch ({tokens / 1e6:.1f}M tokens)", ours, ceiling,
                      at_least=0.9, unit="tokens/s")


TRAIN_SCRIPT = """
import json, os, sys, time
start = time.perf_counter()
spec = json.loads(sys.argv[1])
from marin_assets.pipeline.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline import levanter_configs as lc
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

    from marin_assets.core.execute import materialize_step
    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.ray_execution import ray_runner
    from marin_assets.core.step import Step
    from marin_assets.pipeline.specs import ModelSpec, OptimizerSpec, TrainerSpec
    from marin_assets.pipeline.tokenize import tokenize
    from marin_assets.pipeline.tokenizer import load_hf_tokenizer
    from marin_assets.pipeline.train import train_lm
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


DEMO_SELECTION = "*hello/report,*exports/tiny-stories-llama,*evals/tiny-stories-llama"
"""What `make demo` materializes (the Makefile's selection): every unpartitioned asset."""


def measure_demo() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        env = dict(os.environ, DAGSTER_HOME=home, MARIN_PREFIX=os.path.join(tmp, "out"), JAX_PLATFORMS="cpu",
                   HF_HUB_OFFLINE="1")
        start = time.perf_counter()
        subprocess.run([str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-f", "definitions.py",
                        "--select", DEMO_SELECTION], cwd=ROOT, env=env, check=True, capture_output=True)
        seconds = time.perf_counter() - start
    return time_ratio("demo end to end, installed, offline ÷ the 3-minute goal", [seconds], [180.0], at_most=1.0)
