"""Evaluation kinds on one seam (`kind.EvalKind`, run on one checkpoint by `steps.eval_step` or on every
checkpoint as it lands by `steps.CheckpointEvals`): loss and bits per byte, lm-eval harness tasks, per-token
log-probs, the perplexity gap between two models, and the contamination shown beside a score.

It reads the wings below it: training (a run's checkpoints and record, `TrainStep`), tokens (validation
caches, tokenizers), data (dataset files) and curation (n-gram overlap); and the protocol
(`marin_assets.core`).

Users build these steps from the front door, `marin_assets.steps` (its `evaluation` group); the module paths
here are not part of the API and may change (docs/stability.md).
"""
