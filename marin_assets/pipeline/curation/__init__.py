"""Curation before tokenizing, as in Marin's library: normalize, exact and fuzzy deduplication,
decontamination, quality and heuristic filters, HTML to text.

Every stage reads and writes the normalized format of `shards` (parquet `{split}/part-NNNNN.parquet`
with `id`, `text`, `source`), runs per shard through `stage.run_shards` (resumable per shard, fanned
out over Ray), and returns a `stage.CurationResult` counting documents and bytes in, out and removed
per reason. The tokenize step reads a curated output as it reads any dataset.
"""
