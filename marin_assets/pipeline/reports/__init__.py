"""Reports across runs, the top wing: learning-rate × model sweeps (`sweep`), the scaling-law analysis of an
IsoFLOP ladder and the compute-optimal run it predicts, experiment summaries, run costs, speedrun
leaderboards, and the train–test overlap matrix.

It reads every wing below it: evals (scores), training (records, costs, runs to compare), tokens, curation
(overlap n-grams) and data; and the protocol (`marin_assets.core`).

Users build these steps from the front door, `marin_assets.steps` (its `sweep` group; the overlap report is
in its `evaluation` group); the module paths here are not part of the API and may change
(docs/stability.md).
"""
