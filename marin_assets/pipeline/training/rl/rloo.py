"""RLOO advantages: each completion's reward against the mean reward of the other completions of its prompt.

REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024; Marin's RL loss): with k samples per prompt, the
baseline of sample i is the mean of the other k − 1 rewards, which does not depend on sample i, so the gradient
stays unbiased while the variance falls; a prompt whose samples all score the same gives every sample advantage 0
(nothing to learn from it). Plain numpy: the advantages are computed on the host, between sampling and the update.
"""

from __future__ import annotations

import numpy as np


def rloo_advantages(rewards: np.ndarray) -> np.ndarray:
    """Advantages of a `[prompts, k]` array of rewards (k ≥ 2 samples per prompt): r_i − mean_{j≠i} r_j, which is
    k/(k−1) × (r_i − mean_j r_j). A `ValueError` for fewer than two samples per prompt (no one to leave out)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] < 2:
        raise ValueError(f"RLOO needs rewards shaped [prompts, k] with k ≥ 2 samples per prompt, got {r.shape}")
    k = r.shape[1]
    others = (r.sum(axis=1, keepdims=True) - r) / (k - 1)
    return (r - others).astype(np.float32)


__all__ = ["rloo_advantages"]
