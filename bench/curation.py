"""Curation stages on real text, side by side with their primitives in one run, on the same shards.

Corpus: the standard library's source files (real text every Python has; code, comments and
docstrings), one document per file, with 10% exact copies and 10% near copies (a few words
replaced) planted, normalized into 16 MB shards. Each stage runs in one process (`workers=1`):
its MB/s is per core.

(a) exact dedup MB/s end to end ÷ raw xxh3-128 of the same texts in memory — report; goal >= 100 MB/s;
(b) fuzzy dedup MB/s end to end ÷ rensa's raw MinHash signatures of the same n-gram hashes — report;
    goal >= 10 MB/s (datatrove reports ~0.85 MB/s per task);
(c) decontamination, heuristic filters, quality scoring: MB/s per core — report;
(d) peak RSS of a fuzzy dedup process as the corpus grows 10× — goal: bounded (<= 1.5×).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import rate_ratio, time_ratio
from real_tokenize import stdlib_texts

ROOT = Path(__file__).resolve().parents[1]


def planted_texts(megabytes: int, seed: int = 0) -> list[str]:
    """Stdlib source files (~`megabytes`), plus 10% exact and 10% near copies, shuffled."""
    rng = random.Random(seed)
    texts = stdlib_texts(megabytes << 20)
    copies = rng.sample(texts, len(texts) // 10)
    near = []
    for text in rng.sample(texts, len(texts) // 10):
        words = text.split(" ")
        for i in rng.sample(range(len(words)), min(3, len(words))):
            words[i] = "planted"
        near.append(" ".join(words))
    out = texts + copies + near
    rng.shuffle(out)
    return out


def write_raw(root: str, texts: list[str], shards: int = 8) -> str:
    os.makedirs(os.path.join(root, "train"), exist_ok=True)
    for i in range(shards):
        with open(os.path.join(root, "train", f"shard-{i:03d}.jsonl"), "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[i::shards])
    return root


def normalized(tmp: str, name: str, texts: list[str], shard_bytes: int = 16 << 20) -> tuple[str, int]:
    """Normalized shards of `texts` and their UTF-8 bytes."""
    from marin_assets.pipeline.curation.normalize import normalize

    result = normalize(os.path.join(tmp, name), write_raw(os.path.join(tmp, name + "-raw"), texts),
                       target_shard_bytes=shard_bytes)
    return os.path.join(tmp, name), result.bytes_out


RSS_SCRIPT = """
import json, resource, sys
from marin_assets.pipeline.curation.fuzzy_dedup import fuzzy_dedup
result = fuzzy_dedup(sys.argv[1], sys.argv[2])
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "removed": result.documents_in - result.documents_out}))
"""


def peak_rss(out: str, data: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, out, data], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if proc.returncode:
        raise RuntimeError(f"fuzzy dedup for peak RSS failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _absolute(row: dict, at_least: float) -> dict:
    """A side-by-side row whose goal is on our own MB/s (`ours`), the ratio reported beside it."""
    return {**row, "goal": f"ours >= {at_least:g} MB/s", "met": row["ours"] >= at_least}


def measure(reps: int = 3, megabytes: int = 30) -> list[dict]:
    import numpy as np
    import rensa
    import xxhash

    from marin_assets.pipeline.curation.decontaminate import decontaminate
    from marin_assets.pipeline.curation.exact_dedup import exact_dedup
    from marin_assets.pipeline.curation.fuzzy_dedup import fuzzy_dedup
    from marin_assets.pipeline.curation.heuristics import heuristic_filter
    from marin_assets.pipeline.curation.ngrams import ngram_hashes
    from marin_assets.pipeline.curation.planted import plant_corpus
    from marin_assets.pipeline.curation.quality import quality_filter, train_quality_classifier
    from marin_assets.pipeline.curation.shards import list_shards

    with tempfile.TemporaryDirectory() as tmp:
        texts = planted_texts(megabytes)
        data, size = normalized(tmp, "data", texts)
        mb = size / 1e6
        encoded = [t.encode() for t in texts]
        shingles, offsets = ngram_hashes(texts, 5)
        uoffsets = offsets.astype(np.uint64)
        rates: dict[str, list[float]] = {k: [] for k in ("exact", "xxh3", "fuzzy", "rensa")}
        removed = {}
        for rep in range(reps):
            for kind in (["exact", "xxh3", "fuzzy", "rensa"] if rep % 2 == 0 else ["rensa", "fuzzy", "xxh3", "exact"]):
                out = os.path.join(tmp, f"{kind}-{rep}")
                if kind == "exact":
                    seconds = _timed(lambda out=out: removed.__setitem__("exact", exact_dedup(out, data)))
                elif kind == "xxh3":
                    seconds = _timed(lambda: [xxhash.xxh3_128_digest(e) for e in encoded])
                elif kind == "fuzzy":
                    seconds = _timed(lambda out=out: removed.__setitem__("fuzzy", fuzzy_dedup(out, data)))
                else:
                    seconds = _timed(lambda: rensa.RMinHash.digest_matrix_from_flat_token_hashes(
                        shingles, uoffsets, 286, 1))
                rates[kind].append(mb / seconds)

        truth = plant_corpus(os.path.join(tmp, "planted"))
        eval_sets = {name: [path] for name, path in truth.eval_sets.items()}
        labeled = {label: normalized(tmp, label, [json.loads(line)["text"] for f in
                                                  sorted(Path(tmp, "planted", "labeled", label, "train").glob("*"))
                                                  for line in _gunzip_lines(f)])[0]
                   for label in ("positive", "negative")}
        model = train_quality_classifier(os.path.join(tmp, "classifier"), labeled["positive"], labeled["negative"])
        others: dict[str, list[float]] = {k: [] for k in ("decontaminate", "heuristics", "quality")}
        for rep in range(reps):
            out = os.path.join(tmp, f"other-{rep}")
            others["decontaminate"].append(mb / _timed(lambda out=out: decontaminate(out + "-decon", data, eval_sets)))
            others["heuristics"].append(mb / _timed(lambda out=out: heuristic_filter(out + "-heur", data)))
            others["quality"].append(mb / _timed(lambda out=out: quality_filter(out + "-quality", data,
                                                                               model.model_path, threshold=0.0)))

        # the same shard size for both: memory may grow with a shard, never with the corpus
        small, _ = normalized(tmp, "small", planted_texts(max(1, megabytes // 10)), 1 << 20)
        big, _ = normalized(tmp, "big", planted_texts(max(1, megabytes // 10) * 10), 1 << 20)
        rss_small = [peak_rss(os.path.join(tmp, f"rss-small-{r}"), small)["peak_mb"] for r in range(2)]
        rss_big = [peak_rss(os.path.join(tmp, f"rss-big-{r}"), big)["peak_mb"] for r in range(2)]
        shards = len(list_shards("bench", data))
    corpus = f"{mb:.0f} MB of stdlib source in {shards} shards, {len(texts):,} documents"
    exact, fuzzy = removed["exact"], removed["fuzzy"]
    rows = [
        _absolute(rate_ratio(f"exact dedup MB/s per core ÷ raw xxh3-128 of the same texts ({corpus};"
                             f" {exact.documents_in - exact.documents_out:,} removed)",
                             rates["exact"], rates["xxh3"], at_least=0.0, unit="MB/s"), 100),
        _absolute(rate_ratio(f"fuzzy dedup MB/s per core ÷ rensa signatures of the same 5-gram hashes (286 perms,"
                             f" 26 bands; {fuzzy.documents_in - fuzzy.documents_out:,} removed)",
                             rates["fuzzy"], rates["rensa"], at_least=0.0, unit="MB/s"), 10),
    ]
    for kind, label in (("decontaminate", "decontamination (13-grams, 2 planted eval sets)"),
                        ("heuristics", "heuristic filters (default rules)"), ("quality", "quality scoring (fastText)")):
        median = statistics.median(others[kind])
        rows.append({"measure": f"{label} MB/s per core ({corpus})", "ratio": 1.0, "spread": [1.0, 1.0],
                     "ours": round(median, 2), "reference": round(median, 2), "unit": "MB/s", "reps": reps,
                     "goal": "report", "met": True, "note": "absolute rate (no reference)"})
    rows.append({**time_ratio(f"fuzzy dedup peak RSS, corpus ×10 ÷ ×1 ({megabytes // 10 or 1} → "
                              f"{(megabytes // 10 or 1) * 10} MB)", rss_big, rss_small, at_most=1.5), "unit": "MB"})
    return rows


def _gunzip_lines(path: Path) -> list[str]:
    import gzip

    with gzip.open(path, "rt") as f:
        return f.readlines()


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    sys.path.insert(0, str(ROOT))
    for result in measure(reps=2 if quick else 3, megabytes=10 if quick else 30):
        print(json.dumps(result))
