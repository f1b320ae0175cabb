"""Data in and artifacts out, the wing at the bottom of the pipeline: downloads (a Hugging Face dataset at a
pinned revision, files at any fsspec URL), the generated test corpus and the Python documentation corpus,
preference pairs, the Hub upload of a step's output folder, and what every wing above uses to read dataset
files (`readers`: JSON lines, parquet, plain text; `text_files`: globs and splits; `messages`: chat turns).

It reads no other wing, only the protocol below the pipeline (`marin_assets.core`: steps, paths, checks,
estimates, results).

Users build these steps from the front door, `marin_assets.steps` (its `data` group); the module paths here
are not part of the API and may change (docs/stability.md).
"""
