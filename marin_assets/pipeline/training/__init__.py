"""Training methods, a folder each, over shared pieces.

The methods: `pretrain/` (Levanter's `train_lm` on a mixture; IsoFLOP ladders), `sft/` (`train_lm` on chat caches),
`dpo/` (with the reference model's log-probs as a step of their own), `rl/` (RL from verifiable rewards). Each
folder's `step.py` makes the method's step; a method imports the shared pieces and its own folder, never another
method's (SFT alone builds on pretraining's `train_lm`).

The shared pieces: `runner` (runs a method's Levanter entry point: resume, metrics, the record), `training_run`
(`TrainStep` and `TrainResult`, the types evaluations and reports find a run by, whatever method trained it, with one
slot, `method_metrics`, a method fills with what it measures), `train_data` (what a run's data must be),
`sources` (where a run's first weights come from, answered in one place), `hf_folder`, `hf_model` and
`hf_to_levanter` (Hugging Face models and their conversion), `export`, `levanter_trainer`, `levanter_model` and
`levanter_data` (Levanter's configuration), `specs`, `estimates`, `cost`, `tracking`, `checkpoints`, `lineage`.

A new method is a folder here (its `step.py` and what only it needs), a line in the front door's `train` group, and,
if it measures more than the losses, its metrics type in `TrainResult.method_metrics`.

It reads the wings below it: tokens (the caches a run trains on), data (Hub downloads, dataset files) and,
for a model's training text, curation's overlap types; and the protocol (`marin_assets.core`).

Users build these steps from the front door, `marin_assets.steps` (its `train` group; IsoFLOP sweeps are in
its `sweep` group); the module paths here are not part of the API and may change (docs/stability.md).
"""
