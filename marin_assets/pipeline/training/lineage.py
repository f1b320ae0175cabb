"""Which text a model was trained on, found through its lineage (the step graph), for train–test overlap.

A model read token caches; a cache is a tokenize step over a dataset step. What the model saw is the text that
was tokenized: the tokenize step's input, after whatever curation made it (a decontaminated dataset, not the
raw download it came from — the stages above it are listed in `derived_from`), the split training reads
(`train`), of every cache the run weighs above zero at some stage. Weights it started from (`init_from`) bring
their own run's data: a checkpoint or an export of a training step in the graph is followed to that step; a
Hugging Face folder, a pretokenized cache or a cache of unknown format has no text here, and is named in
`Lineage.unknown` so that no overlap computed from the rest is read as complete.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from marin_assets.core.step import Step, walk
from marin_assets.pipeline.curation.ngram_overlap import TrainText
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.data.text_files import expand_files
from marin_assets.pipeline.tokens.preference_cache import FORMAT as PREFERENCE_FORMAT
from marin_assets.pipeline.tokens.tokenize import TokenizeStep, splits_to_read
from marin_assets.pipeline.training.sources import InitFrom
from marin_assets.pipeline.training.training_run import TrainStep

TRAIN_SPLIT = "train"
"""The cache split a training run reads (Levanter's mixture: `train`; `validation` is for evaluation)."""
READERS = {"levanter-cache-v2": "text", "levanter-chat-cache-v1": "conversations",
           PREFERENCE_FORMAT: "conversations"}
"""A cache's format (its tokenize step's `format` attribute) → how its dataset's records are read as text."""


@dataclass(frozen=True)
class DatasetText:
    """The text behind one split of a token cache: the dataset its tokenize step read, and how it read it."""

    step: Step
    """The dataset step the tokenize step read (what was tokenized, after any curation)."""
    split: str
    """The cache split (`train` for training data, `validation` for a validation set)."""
    cache_format: str
    """The cache's format (its tokenize step's `format`): says how the dataset is laid out and read."""
    splits: Any = "from-layout"
    """The tokenize step's `splits` attribute: `{split: [glob, …]}`, `from-layout` (its layout's `{split}/…`),
    or a preference cache's `from-data`, names, or `{cache split: data split}`."""
    config: str | None = None
    text_field: str = "text"
    text_format: str = "auto"
    caches: tuple[str, ...] = ()
    """The tokenize steps that read it (names)."""
    trained_by: tuple[str, ...] = ()
    """The training steps that read those caches (names): the model, or the ones its weights came from."""
    derived_from: tuple[str, ...] = ()
    """The steps `step` was made from (curation stages, the raw download), farthest first."""

    @property
    def reader(self) -> str:
        """`text` (a text field) or `conversations` (chat or preference turns): `curation.ngram_overlap.READERS`."""
        return READERS[self.cache_format]

    @property
    def name(self) -> str:
        """Its name in a report: the dataset step's, with the split unless it is `train`."""
        return self.step.name if self.split == TRAIN_SPLIT else f"{self.step.name}:{self.split}"

    def identity(self) -> dict[str, Any]:
        """What decides its text (its step's hash enters through a step's deps)."""
        return {"dataset": self.step.name, "split": self.split, "cache_format": self.cache_format,
                "splits": self.splits, "config": self.config, "text_field": self.text_field,
                "text_format": self.text_format}

    def files(self) -> list[str]:
        """The split's files under the dataset's output (run time: the dataset exists)."""
        root = self.step.output_path
        try:
            if self.cache_format == PREFERENCE_FORMAT:
                return _preference_files(root, self.splits, self.split)
            given = {k: list(v) for k, v in self.splits.items()} if isinstance(self.splits, Mapping) else None
            globs = splits_to_read(root, given, self.config).get(self.split)
            if not globs:
                raise DatasetError(f"{root} has no {self.split!r} split")
            return expand_files(root, globs)
        except DatasetError as e:
            raise DatasetError(f"dataset {self.name!r} (step {self.step.name_with_hash}): {e}") from None

    def text(self) -> TrainText:
        """As `curation.ngram_overlap` reads it (run time: its files resolved)."""
        return TrainText(self.name, tuple(self.files()), self.reader, self.text_field, self.text_format)


def _preference_files(root: str, splits: Any, split: str) -> list[str]:
    """A preference cache split's data files (`preference_data` writes `{split}/shard-NNNNN.jsonl.gz`): its data
    split is itself, unless the cache maps it (`{cache split: data split}`)."""
    data_split = splits.get(split) if isinstance(splits, Mapping) else split
    if data_split is None or (isinstance(splits, list) and split not in splits):
        raise DatasetError(f"the preference cache has no {split!r} split (its splits: {splits})")
    return expand_files(root, [f"{data_split}/*.jsonl.gz"])


@dataclass(frozen=True)
class Lineage:
    """What a model was trained on, as far as the step graph tells."""

    model: str
    """The model's step (name)."""
    datasets: tuple[DatasetText, ...]
    unknown: tuple[str, ...] = ()
    """What it learned from whose text is not in the graph, in words: weights from a folder, a pretokenized cache."""

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.datasets]


def text_of(cache: Step, split: str) -> DatasetText | str:
    """The text behind `split` of a tokenize step's cache, or why it has none here (in words)."""
    fmt = cache.hash_attrs.get("format")
    sources = [d for d in cache.deps if not (isinstance(cache, TokenizeStep) and d is cache.tokenizer)]
    if not isinstance(cache, TokenizeStep) or fmt not in READERS:
        return f"{cache.name}: a cache of format {fmt!r}, whose text is not known here"
    if not sources:
        return f"{cache.name}: a pretokenized cache, whose text is not in this graph"
    dataset = sources[0]
    attrs = cache.hash_attrs
    return DatasetText(dataset, split, fmt, attrs.get("splits", "from-layout"), attrs.get("config"),
                       attrs.get("text_field", "text"), attrs.get("text_format", "auto"), (cache.name,),
                       derived_from=tuple(s.name for s in walk([dataset])[:-1]))


def trained_caches(train: TrainStep) -> list[Step]:
    """The caches a training step weighs above zero at some stage: all of them when its weights cannot be matched
    to its data (a method without a `weights` attribute) — counting a cache too many is safe here, one too few
    would call a contaminated score clean."""
    weights = train.hash_attrs.get("weights")
    stages = [weights] if isinstance(weights, Mapping) else [w for _, w in weights] if isinstance(weights, list) else []
    names = sorted({k for stage in stages for k in stage})
    if not stages or len(names) != len(train.data):
        return list(train.data)
    weighed = {k for stage in stages for k, w in stage.items() if w > 0}
    return [cache for k, cache in zip(names, train.data, strict=True) if k in weighed]


def training_datasets_of(model: Step) -> Lineage:
    """The datasets whose `train` split a model's training read: through its token caches to the dataset each
    tokenize step read, and through the weights it started from to their training — any depth. `model` is a
    training step, or a step made from one (an export)."""
    found: dict[tuple[str, str], DatasetText] = {}
    unknown: list[str] = []
    todo, seen = [model], set()
    while todo:
        step = todo.pop()
        if step.name_with_hash in seen:
            continue
        seen.add(step.name_with_hash)
        if not isinstance(step, TrainStep):
            runs = [s for s in walk([step]) if isinstance(s, TrainStep)]
            if not runs:
                unknown.append(f"{step.name}: weights whose training is not in this graph")
            todo.extend(runs)
            continue
        for cache in trained_caches(step):
            text = text_of(cache, TRAIN_SPLIT)
            if isinstance(text, str):
                unknown.append(text)
                continue
            key = (text.step.name_with_hash, repr(sorted(text.identity().items())))  # a dataset read twice: once
            known = found.get(key)
            if known is not None:
                text = replace(known, caches=tuple(dict.fromkeys((*known.caches, cache.name))))
            found[key] = replace(text, trained_by=tuple(dict.fromkeys((*text.trained_by, step.name))))
        source = step.init_from
        if isinstance(source, InitFrom):
            if source.source is not None:
                todo.append(source.source)
            else:
                unknown.append(f"weights from {source.folder}: their training data is not in this graph")
        elif source is not None:
            unknown.append(f"{step.name} starts from {source.describe()}: its training data is not in this graph")
    return Lineage(model.name, tuple(found.values()), tuple(dict.fromkeys(unknown)))


__all__ = ["READERS", "TRAIN_SPLIT", "DatasetText", "Lineage", "text_of", "trained_caches", "training_datasets_of"]
