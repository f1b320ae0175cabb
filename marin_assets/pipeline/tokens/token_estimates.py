"""Work estimates of tokenize steps: the bytes of the dataset they read, and the tokens those bytes will make.

A tokenizer's time follows the bytes it reads, which are known as soon as the dataset is materialized (the
size of its output folder). Tokens are predicted from bytes at `BYTES_PER_TOKEN` until the step ran; then
its record gives the tokens it wrote."""

from __future__ import annotations

from marin_assets.core.estimate import BYTES, EstimateInputs, Estimator, WorkEstimate
from marin_assets.core.step import Step

BYTES_PER_TOKEN = 4.0
"""Bytes of input per token assumed before a tokenize step ran: about what byte-level BPEs of 32–128 K ids
make of English text (a small vocabulary makes more tokens: the demo's 1,024-id BPE about 2.4 bytes each)."""


def tokenize_estimate(dataset: Step, group: str = "tokenize") -> Estimator:
    """Bytes of `dataset`'s output (read), and tokens predicted from them — or, after the run, recorded."""

    def estimate(inputs: EstimateInputs) -> WorkEstimate:
        size = inputs.upstream_bytes(dataset)
        done = inputs.own_result if isinstance(inputs.own_result, dict) else None
        if done is not None and isinstance(done.get("splits"), dict):
            tokens = float(sum(s.get("tokens", 0) for s in done["splits"].values() if isinstance(s, dict)))
            return WorkEstimate(group, BYTES, None if size is None else float(size), tokens=tokens,
                                bytes=None if size is None else float(size), note="tokens recorded by the run")
        if size is None:
            return WorkEstimate(group, BYTES, None, note=f"{dataset.name} is not materialized: its size is unknown")
        return WorkEstimate(group, BYTES, float(size), tokens=size / BYTES_PER_TOKEN, bytes=float(size),
                            note=f"{size:,} bytes of {dataset.name}; tokens at {BYTES_PER_TOKEN:g} bytes per token")

    return estimate


__all__ = ["BYTES_PER_TOKEN", "tokenize_estimate"]
