"""Our training step beside bare Levanter on a GPU: tokens/s and MFU of the same run, side by side.

Run on a machine with an NVIDIA GPU and JAX's CUDA plugin (docs/gpu.md: "Measuring on a borrowed GPU" says how
to carry the wheels such a machine lacks). Both sides train the same model on the same cache in a fresh
interpreter each, alternating, `--reps` times: ours through the step (`train_lm` with `platform="cuda"`, the
lease, the record), bare Levanter through `levanter.main.train_lm.main` on the config our step builds. Reports
wall tokens/s (imports and compilation included), steady tokens/s (Levanter's own throughput metric, median of
the second half of the steps), and MFU: steady tokens/s × training FLOPs per token ÷ the device's peak for the
compute dtype (`pipeline/training/cost.py`: fray's datasheet table, else a measured matmul).

Usage: `python bench/gpu_train.py [--size tiny|small] [--steps N] [--reps N] [--out DIR]`; writes
`gpu_train.json` and `gpu_train.md` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {
    # the CPU bench's model (bench/pipeline_throughput.py), and one a GPU can be measured on
    "tiny": dict(hidden_dim=128, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, seq_len=256),
    "small": dict(hidden_dim=768, intermediate_dim=3072, num_layers=12, num_heads=12, num_kv_heads=12, seq_len=1024),
}
BATCH = {"tiny": 16, "small": 32}

def fresh(script: str, spec: dict, cwd: str) -> tuple[float, str]:
    """Wall seconds of a fresh interpreter running one side's script on the spec's platform, and its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": spec["platform"] if spec["platform"] == "cpu" else f"{spec['platform']},cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], cwd=cwd, env=env, capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"training failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return time.perf_counter() - start, json.loads(proc.stdout.strip().splitlines()[-1])["output"]


def steady_tokens_per_second(output: str) -> float | None:
    """Median of Levanter's `throughput/tokens_per_second` over the second half of the run's logged steps."""
    path = Path(output) / "metrics.jsonl"
    if not path.exists():
        return None
    rows = (json.loads(line) for line in path.read_text().splitlines())
    rates = [row["metrics"]["throughput/tokens_per_second"] for row in rows
             if row.get("event") == "log" and "throughput/tokens_per_second" in row.get("metrics", {})]
    return statistics.median(rates[len(rates) // 2:]) if rates else None


def main() -> None:
    from bench.pipeline_throughput import BARE_TRAIN_SCRIPT, OURS_TRAIN_SCRIPT
    from marin_assets.pipeline.data.corpus import generate_corpus
    from marin_assets.pipeline.tokens.tokenize import tokenize
    from marin_assets.pipeline.tokens.tokenizer import model_vocab_size, train_tokenizer
    from marin_assets.pipeline.training.cost import compute_dtype, device_peak, training_flops_per_token
    from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--platform", default="cuda", help="JAX platform (cpu: a quick check of the script here)")
    args = parser.parse_args()
    model = ModelSpec(**SIZES[args.size])
    trainer = TrainerSpec(num_train_steps=args.steps, train_batch_size=BATCH[args.size], checkpoint_every=args.steps,
                          steps_per_eval=args.steps, max_eval_batches=2, mixed_precision="p=f32,c=bfloat16")
    tokens = args.steps * trainer.train_batch_size * model.seq_len
    results: dict[str, list[dict]] = {"ours": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw")
        documents = 2_000 if args.platform == "cpu" else 20_000
        generate_corpus(raw, train_documents=documents, validation_documents=500, seed=0, shards=4)
        tok = train_tokenizer(os.path.join(tmp, "tok"), raw, vocab_size=1024).path
        cache = tokenize(os.path.join(tmp, "cache"), raw, tok).path
        vocab = model_vocab_size(tok, model.vocab_multiple)
        common = {"tokenizer": tok, "cache": cache, "model": model.__dict__, "trainer": trainer.__dict__,
                  "platform": args.platform}
        for rep in range(args.reps):
            for kind in (("ours", "bare") if rep % 2 == 0 else ("bare", "ours")):
                if kind == "ours":
                    spec = {**common, "name": f"bench/gpu-train-{rep}", "prefix": os.path.join(tmp, "ours")}
                    seconds, output = fresh(OURS_TRAIN_SCRIPT, spec, tmp)
                else:
                    spec = {**common, "out": os.path.join(tmp, f"bare-{rep}"), "vocab": vocab}
                    seconds, output = fresh(BARE_TRAIN_SCRIPT, spec, tmp)
                results[kind].append({"wall_s": seconds, "wall_tokens_per_s": tokens / seconds,
                                      "steady_tokens_per_s": steady_tokens_per_second(output)})
                print(kind, rep, results[kind][-1], flush=True)
        import jax

        peak = device_peak(compute_dtype(trainer.mixed_precision))
        peak_flops = peak.flops_per_device * peak.count
        flops_per_token = training_flops_per_token(model, vocab)
    summary = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "size": args.size,
               "model": model.__dict__, "steps": args.steps, "tokens": tokens, "peak_flops": peak_flops,
               "peak_basis": peak.basis, "flops_per_token": flops_per_token, "runs": results}
    lines = [f"# Training on {summary['device']} (JAX {summary['jax']}): ours beside bare Levanter", "",
             f"{args.size} model, {args.steps} steps × {trainer.train_batch_size} × {model.seq_len} = {tokens:,}"
             f" tokens per run; peak {peak_flops / 1e12:.0f} TFLOP/s ({peak.basis}); {flops_per_token:.3g}"
             " training FLOPs per token.", "",
             "| side | wall tokens/s | steady tokens/s | MFU (steady) |", "| --- | --- | --- | --- |"]
    for kind, runs in results.items():
        wall = statistics.median(r["wall_tokens_per_s"] for r in runs)
        steady = [r["steady_tokens_per_s"] for r in runs if r["steady_tokens_per_s"]]
        rate = statistics.median(steady) if steady else None
        mfu = f"{rate * flops_per_token / peak_flops:.1%}" if rate else "—"
        lines.append(f"| {kind} | {wall:,.0f} | {f'{rate:,.0f}' if rate else '—'} | {mfu} |")
        summary[f"{kind}_wall_tokens_per_s"], summary[f"{kind}_steady_tokens_per_s"] = wall, rate
    summary["ratio_wall"] = summary["ours_wall_tokens_per_s"] / summary["bare_wall_tokens_per_s"]
    lines += ["", f"ours ÷ bare, wall: {summary['ratio_wall']:.3f}"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_train.json").write_text(json.dumps(summary, indent=1))
    (args.out / "gpu_train.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
