"""Curation before tokenizing, as in Marin's library: normalize, exact and fuzzy deduplication,
decontamination, quality and heuristic filters, HTML to text.

Every stage reads and writes the normalized format of `shards` (parquet `{split}/part-NNNNN.parquet`
with `id`, `text`, `source`) and returns a `stage.CurationResult` counting documents and bytes in, out
and removed per reason. A stage that decides row by row what to keep is a `filters.CurationFilter`
(heuristics, quality, exact and fuzzy dedup, decontamination), run shard by shard by `filters.run_filter`
(resumable per shard, fanned out over Ray) and made a step by `filters.filter_step`; the stages that make
the format (normalize, HTML to text) use `stage`'s phases directly. The tokenize step reads a curated
output as it reads any dataset.

It reads the data wing below it (dataset readers and files), the protocol (`marin_assets.core`) and
`marin_assets.execution` (shards fanned out over Ray); curation and tokens never import each other.

Users build these steps from the front door, `marin_assets.steps` (its `data` group: the stages, and
`filter_step` with `CurationFilter` for a filter of one's own); the module paths here are not part of the
API and may change (docs/stability.md).
"""
