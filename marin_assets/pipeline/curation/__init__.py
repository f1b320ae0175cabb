"""Curation before tokenizing, as in Marin's library: normalize, exact and fuzzy deduplication,
decontamination, quality and heuristic filters, HTML to text.

Every stage reads and writes the normalized format of `shards` (parquet `{split}/part-NNNNN.parquet`
with `id`, `text`, `source`) and returns a `stage.CurationResult` counting documents and bytes in, out
and removed per reason. A stage that decides row by row what to keep is a `filters.CurationFilter`
(heuristics, quality, exact and fuzzy dedup, decontamination), run shard by shard by `filters.run_filter`
(resumable per shard, fanned out over Ray) and made a step by `filters.filter_step`; the stages that make
the format (normalize, HTML to text) use `stage`'s phases directly. The tokenize step reads a curated
output as it reads any dataset.
"""
