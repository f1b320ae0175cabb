"""Tokenizers and token caches: a byte-level BPE trained on a raw dataset or an existing tokenizer adopted
(`tokenizer`), Levanter caches tokenized from raw text (`tokenize`, its record `TokenizedCache`), chat and
preference caches, pretokenized caches copied from elsewhere, and validation suites; `levanter_cache` is the
one place that touches Levanter's cache API.

It reads the data wing below it (dataset readers, downloads, chat messages), the protocol
(`marin_assets.core`) and `marin_assets.execution` (tokenize fans files out over Ray); never curation: a
curated output is read as any dataset is.

Users build these steps from the front door, `marin_assets.steps` (its `data` group); the module paths here
are not part of the API and may change (docs/stability.md).
"""
