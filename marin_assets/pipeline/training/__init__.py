"""Training methods on one runner (`runner`): pretraining (`pretrain`), SFT, DPO (with the reference model's
log-probs as a step of their own) and RL from verifiable rewards; where a run's first weights come from
(`sources`: random, a Hugging Face model, a Levanter checkpoint), Hub models and their conversion, exports,
the specs (`specs`), run costs, tracking and IsoFLOP ladders. `run` holds `TrainStep` and `TrainResult`, the
types evaluations and reports find a training run by, whatever method trained it.

It reads the wings below it: tokens (the caches a run trains on), data (Hub downloads, dataset files) and,
for a model's training text, curation's overlap types; and the protocol (`marin_assets.core`).

Users build these steps from the front door, `marin_assets.steps` (its `train` group; IsoFLOP sweeps are in
its `sweep` group); the module paths here are not part of the API and may change (docs/stability.md).
"""
