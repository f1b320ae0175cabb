"""fuzzy_dedup: remove near-duplicate documents (MinHash LSH), every removal verified on the text.

Marin's recipe: MinHash over word n-grams (286 permutations in 26 bands of 11 rows) proposes
candidate pairs, and a pair counts only once the two documents' actual n-gram Jaccard similarity
reaches `threshold`: LSH buckets chained without that check once collapsed a whole source to 2
documents (marin#6854). A document is removed only for a verified pair with an *earlier* document
that is kept, so every removed document has a kept near-twin and a chain of small edits never
takes its far end with it.

Copies with character noise (typos, OCR errors) keep few word 5-grams: `shingles="char"` signs
character 7-grams of the punctuation-normalised text instead (`shingles`; defaults `CHAR_DEFAULTS`:
240 permutations in 60 bands of 4 rows, threshold 0.4), and a pair counts only if, besides Jaccard, the two
texts are the same document once aligned word by word (`align`, `same_document.compare`): a copy's differences
are edited words, moved passages and material before or after it; a page of the same template differs by its
own words inside the shared text, which n-gram overlap cannot see (a 3 %-noise copy keeps a Jaccard of 0.57–0.73,
two help pages of one tool reach 0.81). `window` keeps the earlier check, every window of 100 n-grams of each
document mostly (>= threshold) found in the other (`fuzzy_verify.window_containment`): it misses copies with
a header and footer or cut short. `normalize_punctuation` is the char path's default and an option of the word
path (the word default reads the text as before).

A document is `(shard ordinal, row)` packed in a uint64 (ordinals in `list_shards` order: key
order is split, shard index, row). Phases (`stage.run_phase`: resumable per item, fanned out),
each item's outcome at `_work/{phase}/{key}.json` beside its data; the first five are the filter's
`prepare`, the sixth its verdicts:

1. `bands`, per shard, and 2. `candidates`, per hash bucket: MinHash, LSH bands, the pairs sharing
   a band (`fuzzy_candidates`);
3. `sets`, per shard, 4. `verified`, per shard, and 5. `clusters`, once: each candidate pair's exact
   n-gram Jaccard, and the documents to remove with cluster statistics and an audit sample
   (`fuzzy_verify`);
6. `shards`: every shard rewritten without its removed rows (reason `near-duplicate`).

Memory is bounded by a shard, not the corpus, besides what is inherent (a bucket's band records in phase 2,
the candidate and verified pairs): Arrow allocates from a pool that returns freed memory
(`shards.returning_memory`, switched by `filters.run_filter` since `returns_memory` is set), and malloc's free
memory is handed back after every item (`_handing_back`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation import same_document
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step, run_filter
from marin_assets.pipeline.curation.fuzzy_candidates import (
    PAIRWISE_GROUP,
    STAGE,
    band_shard,
    candidates_path,
    load_array,
    pair_bucket,
    unique_pairs,
)
from marin_assets.pipeline.curation.fuzzy_verify import SAMPLE, cluster, gather_sets, verification_plan, verify_shard
from marin_assets.pipeline.curation.shards import (
    CurationError,
    Shard,
    hand_back_memory,
    work_path,
)
from marin_assets.pipeline.curation.shingles import CHAR_NGRAMS, NORMALIZATION, UNITS, Shingling
from marin_assets.pipeline.curation.stage import CurationResult, run_phase

__all__ = ["ALGORITHM", "CHAR_DEFAULTS", "REASON", "SAMPLE", "STAGE", "WORD_DEFAULTS", "FuzzyDedup",
           "FuzzyDedupResult", "RemovedPair", "fuzzy_dedup", "fuzzy_dedup_step"]

REASON = "near-duplicate"
ALGORITHM = {"ngrams": "ngrams.ngram_hashes-v1", "signature": "rensa.RMinHash", "band": "polynomial-splitmix64",
             "candidates": f"pairwise-up-to-{PAIRWISE_GROUP}-else-first", "verify": "ngram-set-jaccard",
             "keep": "earliest-kept-verified-twin"}
"""What decides the output besides the numbers: enters the step's identity (with rensa's algorithm version)."""
CHAR_ALGORITHM = {"ngrams": "shingles.char_ngram_hashes-v1",
                  "verify": "ngram-set-jaccard+window-containment-both-ways"}
"""What the char path (or a window) changes in `ALGORITHM`."""
ALIGN_VERIFY = f"ngram-set-jaccard+{same_document.ALGORITHM}"
"""`ALGORITHM["verify"]` when the texts are aligned (`align`): `same_document.compare`, its `LIMITS`."""
WORD_DEFAULTS = {"ngram": 5, "num_perm": 286, "bands": 26, "threshold": 0.8, "normalize_punctuation": False,
                 "window": 0, "align": False}
"""The word path's settings left unset: Marin's word 5-gram recipe, the text read as it is, no windows."""
CHAR_DEFAULTS = {"ngram": 7, "num_perm": 240, "bands": 60, "threshold": 0.4, "normalize_punctuation": True,
                 "window": 0, "align": True}
"""The char path's: 7-grams (5-grams of distinct English text share too many by chance for the window check),
bands of 4 rows (a pair at Jaccard 0.5 is a candidate with probability 0.98, at 0.2 with 0.09: 5 % of the
characters changed leaves a Jaccard of about 0.5), threshold 0.4 on Jaccard and on every window of 100
characters both ways (measured on the standard library's documentation: copies with 1 to 5 % of their
characters changed pass, documents sharing Python's licence, or only phrasing, stay below 0.3)."""


@dataclass(frozen=True)
class RemovedPair:
    """One removed document and the kept document it duplicates, for a person to audit."""

    removed_id: str
    """Content id of the removed document (equal to `kept_id` for an exact copy)."""
    removed_source: str
    """Where the removed document came from (`file:line`)."""
    kept_id: str
    """Content id of the earlier, kept document it is verified similar to."""
    kept_source: str
    """Where the kept document came from."""
    jaccard: float
    """Exact Jaccard similarity of the two documents' n-gram sets (>= the threshold)."""
    removed_snippet: str
    """The start of the removed text, whitespace collapsed (at most `SNIPPET` characters)."""
    kept_snippet: str
    """The start of the kept text, likewise: the two side by side show what the edit was."""
    evidence: dict[str, float] = dataclasses.field(default_factory=dict)
    """With `align`: how the two texts differ (`same_document.Comparison`: the shorter's words identical, edited,
    moved, differing; the longer's added inside; the length ratio)."""


@record_type("fuzzy_dedup_result")
@dataclass(frozen=True)
class FuzzyDedupResult(CurationResult):
    """A curation result with what MinHash proposed, what the text confirmed, and the clusters."""

    candidate_pairs: int
    """Distinct pairs sharing at least one band: what LSH proposed."""
    verified_pairs: int
    """Candidate pairs whose exact n-gram Jaccard reached the threshold: the only pairs acted on."""
    clusters: int
    """Connected components of verified pairs with 2 or more documents."""
    largest_cluster: int
    """Documents in the largest cluster (0 when none): a huge one deserves a look."""
    cluster_sizes: dict[str, int]
    """Cluster size (as text) → how many clusters have it."""
    removed_sample: list[RemovedPair]
    """Up to `SAMPLE` removed documents with their kept twin: the least similar half and a spread half."""


def _parameter_problem(shingles: str, ngram: int, num_perm: int, bands: int, threshold: float, buckets: int,
                       window: int) -> str | None:
    if shingles not in UNITS:
        return f"shingles must be one of {', '.join(map(repr, UNITS))}, got {shingles!r}"
    low, high = CHAR_NGRAMS
    if shingles == "char" and not low <= ngram <= high:
        return (f"a character n-gram must be {low} to {high} characters, got {ngram} (below {low} every text shares"
                f" most of its n-grams with every other; above {high} one typo hides a sentence of them)")
    if ngram < 1:
        return f"ngram must be at least 1, got {ngram}"
    if window < 0:
        return f"window must be 0 (no window check) or a number of n-grams, got {window}"
    if bands < 1 or num_perm < bands or num_perm % bands:
        return f"num_perm {num_perm} must be a positive multiple of bands {bands} (each band takes num_perm/bands rows)"
    if not 0 < threshold <= 1:
        return f"threshold must be in (0, 1], got {threshold}"
    if buckets < 1:
        return f"buckets must be at least 1, got {buckets}"
    return None


@dataclass(frozen=True)
class Clustered:
    """What phases 1 to 5 (`FuzzyDedup.prepare`) found."""

    output_path: str
    removed: dict[str, int]
    """Per shard key: how many of its rows go (shards with none are absent)."""
    candidate_pairs: int
    outcome: dict[str, Any]
    """Phase 5's outcome: verified pairs, cluster statistics, the audit sample."""


@dataclass(frozen=True)
class FuzzyDedup(CurationFilter):
    """Removes each document verified similar (n-gram Jaccard >= `threshold`, and with a `window` every window
    contained both ways) to an earlier kept one. Settings left None take `shingles`' defaults
    (`WORD_DEFAULTS`, `CHAR_DEFAULTS`)."""

    ngram: int | None = None
    """Words or characters per n-gram."""
    num_perm: int | None = None
    bands: int | None = None
    threshold: float | None = None
    seed: int = 1
    buckets: int = 16
    """How the band hashes are split for the global grouping: changes how the work is split, not the output."""
    shingles: str = "word"
    """`word` or `char` n-grams (`shingles`)."""
    normalize_punctuation: bool | None = None
    """Lower-case and turn every non-letter, non-digit into one space first (`shingles.normalize_punctuation`)."""
    window: int | None = None
    """N-grams per window of `fuzzy_verify.window_containment` (0: no window check)."""
    align: bool | None = None
    """Confirm each pair by aligning the two texts word by word (`same_document.compare`): a copy, not a page
    of the same template. The char path's default."""
    clustered: Clustered | None = None
    """Set by `prepare`: which rows go."""
    name = STAGE
    returns_memory = True  # bands, sets and verification pass over every shard (`CurationFilter.returns_memory`)

    def __post_init__(self) -> None:
        defaults = CHAR_DEFAULTS if self.shingles == "char" else WORD_DEFAULTS
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    @property
    def shingling(self) -> Shingling:
        """How a document becomes its n-gram hashes."""
        assert self.ngram is not None and self.normalize_punctuation is not None
        return Shingling(self.shingles, self.ngram, self.normalize_punctuation)

    def identity(self) -> dict[str, Any]:
        import rensa

        algorithm = {**ALGORITHM, "signature": f"{ALGORITHM['signature']}-v{rensa.RMinHash.ALGORITHM_VERSION}"}
        found: dict[str, Any] = {"ngram": self.ngram, "num_perm": self.num_perm, "bands": self.bands,
                                 "threshold": self.threshold, "seed": self.seed, "algorithm": algorithm}
        # the word path's defaults add nothing, so its identity stays what it was before these options
        if self.shingles != "word":
            found["shingles"] = self.shingles
            algorithm["ngrams"] = CHAR_ALGORITHM["ngrams"]
        if self.normalize_punctuation:
            found["normalize_punctuation"] = True
            algorithm["normalize"] = NORMALIZATION
        elif self.shingles != "word":
            found["normalize_punctuation"] = False
        if self.window:
            found["window"] = self.window
            algorithm["verify"] = CHAR_ALGORITHM["verify"]
        if self.align:
            found["align"] = True
            algorithm["verify"] = ALIGN_VERIFY if not self.window else f"{CHAR_ALGORITHM['verify']}+{ALIGN_VERIFY}"
        return found

    def problem(self) -> str | None:
        """What is wrong with its parameters, or None."""
        assert self.ngram is not None and self.num_perm is not None and self.bands is not None
        assert self.threshold is not None and self.window is not None
        return _parameter_problem(self.shingles, self.ngram, self.num_perm, self.bands, self.threshold, self.buckets,
                                  self.window)

    def prepare(self, output_path: str, shards: Sequence[Shard], workers: int) -> FuzzyDedup:
        """Phases 1 to 5: candidate pairs from MinHash bands, verified on the text, clustered (on the returning
        pool: `run_filter` switches it for a filter that `returns_memory`)."""
        keys = [s.key for s in shards]
        buckets = self.buckets
        num_perm, bands, threshold, window = self.num_perm, self.bands, self.threshold, self.window
        assert num_perm is not None and bands is not None and threshold is not None and window is not None  # post_init
        banded = run_phase(output_path, "bands", list(enumerate(shards)),
                           _handing_back(band_shard, output_path, self.shingling, num_perm, bands, self.seed, buckets),
                           key_of=lambda item: item[1].key, workers=workers,
                           name=f"{STAGE} bands of {len(shards)} shards")
        counts = np.array([o["bucket_records"] for o in banded], dtype=np.int64).reshape(len(shards), buckets)
        starts = np.cumsum(counts, axis=1) - counts
        per_bucket = [(b, [(keys[i], int(starts[i, b]), int(counts[i, b])) for i in np.flatnonzero(counts[:, b])])
                      for b in range(buckets)]
        run_phase(output_path, "candidates", per_bucket, _handing_back(pair_bucket, output_path),
                  key_of=lambda item: f"bucket-{item[0]:05d}", workers=workers, name=f"{STAGE} {buckets} buckets")
        pairs = unique_pairs(*np.concatenate([load_array(output_path, candidates_path(output_path, b))
                                              for b in range(buckets)]).T)
        gather, verify = verification_plan(pairs)
        run_phase(output_path, "sets", gather,
                  _handing_back(gather_sets, output_path, shards, self.shingling, bool(self.window), bool(self.align)),
                  key_of=lambda item: keys[item[0]], workers=workers,
                  name=f"{STAGE} n-gram sets of {len(gather)} shards")
        run_phase(output_path, "verified", verify,
                  _handing_back(verify_shard, output_path, keys, threshold, window, bool(self.align)),
                  key_of=lambda item: keys[item[0]], workers=workers,
                  name=f"{STAGE} verification of {len(pairs)} pairs")
        clustered = run_phase(output_path, "clusters", ["all"],
                              _handing_back(cluster, output_path, keys, [item[0] for item in verify]),
                              key_of=str, workers=1)[0]
        return dataclasses.replace(self, clustered=Clustered(output_path, clustered["removed"], len(pairs), clustered))

    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        """Phase 6: the shard's rows in its removal list go."""
        if self.clustered is None:
            raise CurationError(f"{STAGE}: the near duplicates are found by prepare(), before any shard is decided")
        hand_back_memory()  # what the previous shard's rewrite left (`_handing_back`)
        expected = self.clustered.removed.get(shard.key, 0)
        path = work_path(self.clustered.output_path, "clusters", f"{shard.key}.npy") if expected else None
        rows = load_array(self.clustered.output_path, path) if path else np.zeros(0, np.int64)
        if len(rows) != expected or (len(rows) and rows.max() >= table.num_rows):
            raise CurationError(f"{STAGE}: removal list {path} holds {len(rows)} rows up to row"
                                f" {int(rows.max()) if len(rows) else -1}, expected {expected} rows of a shard of"
                                f" {table.num_rows}; delete its _work folder to start over")
        removed: list[str | None] = [None] * table.num_rows
        for row in rows.tolist():
            removed[row] = REASON
        return Verdicts(removed)

    def result(self, summary: CurationResult) -> FuzzyDedupResult:
        assert self.clustered is not None
        hand_back_memory()  # what the last shard's rewrite left: the stage ends holding no freed memory
        outcome = self.clustered.outcome
        return FuzzyDedupResult.of(summary, candidate_pairs=self.clustered.candidate_pairs,
                                   verified_pairs=outcome["verified_pairs"], clusters=outcome["clusters"],
                                   largest_cluster=outcome["largest_cluster"], cluster_sizes=outcome["cluster_sizes"],
                                   removed_sample=[RemovedPair(**p) for p in outcome["sample"]])


def _handing_back(fn: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """`functools.partial(fn, *args)` that hands malloc's free memory back after each item (`hand_back_memory`):
    a phase works on one shard (or bucket) after another in one process, and without it what malloc keeps
    between them grew with the corpus."""
    return functools.partial(_then_hand_back, functools.partial(fn, *args))


def _then_hand_back(work: Callable[[Any], Any], item: Any) -> Any:
    try:
        return work(item)
    finally:
        hand_back_memory()


def fuzzy_dedup(output_path: str, dataset_path: str, ngram: int | None = None, num_perm: int | None = None,
                bands: int | None = None, threshold: float | None = None, seed: int = 1, buckets: int = 16,
                workers: int = 1, shingles: str = "word", normalize_punctuation: bool | None = None,
                window: int | None = None, align: bool | None = None) -> FuzzyDedupResult:
    """Remove the near-duplicates of a normalized dataset: MinHash LSH over word (or, `shingles="char"`,
    character) `ngram`s proposes pairs, their exact n-gram Jaccard (>= `threshold`; with a `window`, every
    window contained both ways too; with `align`, the two texts aligned word by word: `same_document`) confirms
    them, and each document with a confirmed pair to an earlier kept
    one goes. Settings left None take the shingles' defaults (`WORD_DEFAULTS`, `CHAR_DEFAULTS`). `buckets`:
    how the band hashes are split for the global grouping."""
    chosen = FuzzyDedup(ngram, num_perm, bands, threshold, seed, buckets, shingles, normalize_punctuation, window,
                        align)
    problem = chosen.problem()
    if problem:
        raise ValueError(f"{STAGE}: {problem}")
    result = run_filter(output_path, dataset_path, chosen, workers)
    assert isinstance(result, FuzzyDedupResult)
    return result


def fuzzy_dedup_step(name: str, dataset: Step, ngram: int | None = None, num_perm: int | None = None,
                     bands: int | None = None, threshold: float | None = None, seed: int = 1, buckets: int = 16,
                     workers: int = 1, max_removed_fraction: float = 0.5, shingles: str = "word",
                     normalize_punctuation: bool | None = None, window: int | None = None,
                     align: bool | None = None) -> Step:
    """`dataset` (normalized shards) without its near-duplicates (`fuzzy_dedup`); `buckets` and `workers` only
    change how.

    Identity: `ngram`, `num_perm`, `bands`, `threshold`, `seed`, the MinHash version, and `shingles`,
    `normalize_punctuation`, `window` and `align` when not the word defaults (and `dataset`); not `buckets`,
    `workers` nor `max_removed_fraction`.
    """
    chosen = FuzzyDedup(ngram, num_perm, bands, threshold, seed, buckets, shingles, normalize_punctuation, window,
                        align)
    problem = chosen.problem()
    if problem:
        raise StepDefinitionError(f"fuzzy_dedup step {name!r}: {problem}")
    return filter_step(name, dataset, chosen, workers=workers, max_removed_fraction=max_removed_fraction,
                       description=made_by(fuzzy_dedup))
