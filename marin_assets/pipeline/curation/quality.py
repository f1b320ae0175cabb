"""The quality filter: keeps the documents a quality classifier (`quality_classifier`) scores highest.

It scores every document once (the positive label's probability, batched through `model.predict`),
keeps the score as a `quality_score` column, and removes documents below a threshold: a given one, or
— for `top_fraction` — the (1 - top_fraction) quantile of all scores, found without sorting the
corpus: each shard's scoring task (the filter's `prepare`) writes its scores (`_work/scores/*.npy`)
and a DDSketch of their log-odds, the driver merges the sketches, and each shard's verdicts read the
stored scores back. Log-odds, because a sketch's accuracy is relative to the value: probabilities
crowd near 1, where a 1% relative error on p would lump together everything above 0.99.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step, run_filter
from marin_assets.pipeline.curation.quality_classifier import (
    MODEL_FILE,
    NEGATIVE,
    POSITIVE,
    TRAIN_FILE,
    TRAIN_STAGE,
    VALIDATION_FILE,
    QualityClassifier,
    ValidationMetrics,
    positive_probability,
    quality_classifier_step,
    train_quality_classifier,
    validation_accuracy_at_least,
)
from marin_assets.pipeline.curation.shards import CurationError, Shard, read_shard, work_path
from marin_assets.pipeline.curation.stage import CurationResult, run_phase

__all__ = ["FILTER_STAGE", "MODEL_FILE", "NEGATIVE", "POSITIVE", "REASON", "RELATIVE_ACCURACY", "SCORE_COLUMN",
           "TRAIN_FILE", "TRAIN_STAGE", "VALIDATION_FILE", "QualityClassifier", "QualityFilter", "QualityFilterResult",
           "ValidationMetrics", "check_selection", "log_odds", "quality_classifier_step", "quality_filter",
           "quality_filter_step", "score_texts", "train_quality_classifier", "validation_accuracy_at_least"]

FILTER_STAGE = "quality_filter"
REASON = "quality below threshold"
SCORE_COLUMN = "quality_score"
SCORE = "P(good) fastText"
"""What a score is: enters identity."""
RELATIVE_ACCURACY = 0.005
"""Of the sketched log-odds: the threshold for `top_fraction` is within 0.5% of the exact quantile's."""
EPSILON = 1e-7
"""Probabilities are clipped to [EPSILON, 1 - EPSILON] before their log-odds are taken."""


@record_type("quality_filter_result")
@dataclass(frozen=True)
class QualityFilterResult(CurationResult):
    """A quality filter's counts, the threshold it applied and how the scores were spread."""

    threshold: float = 0.0
    """Documents scoring at least this P(good) were kept (for `top_fraction`: the probability at the
    sketched quantile, whose log-odds `cut` is what was compared)."""
    cut: float | None = None
    """For `top_fraction`: the (1 - top_fraction) quantile of the scores' log-odds, from the sketch."""
    top_fraction: float | None = None
    """The share of documents asked for, when the threshold was found from the scores."""
    quantiles: dict[str, float] = field(default_factory=dict)
    """`p10`, `p50`, `p90` of all scores (from the merged sketch, within its relative accuracy)."""
    model_path: str = ""


_MODELS: dict[tuple[str, str], Any] = {}


def _model(model_path: str) -> Any:
    """The fastText model at `model_path` (downloaded first if remote), loaded once per process and version
    of the file."""
    import fasttext

    fs, path = fsspec.core.url_to_fs(model_path)
    if not fs.exists(path):
        raise CurationError(f"{FILTER_STAGE}: no model at {model_path} (train one with train_quality_classifier)")
    key = (model_path, str(fs.checksum(path)))
    if key not in _MODELS:
        if isinstance(fs, LocalFileSystem):
            model = fasttext.load_model(path)
        else:
            with tempfile.TemporaryDirectory(prefix="quality-model-") as folder:
                local = os.path.join(folder, MODEL_FILE)
                fs.get_file(path, local)
                model = fasttext.load_model(local)
        while len(_MODELS) >= 4:
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[key] = model
    return _MODELS[key]


def score_texts(texts: Sequence[str], model_path: str) -> np.ndarray:
    """P(good) of each text under the classifier at `model_path` (its folder or `model.bin`), float32."""
    if not model_path.endswith(".bin"):
        model_path = join_path(model_path, MODEL_FILE)
    return positive_probability(_model(model_path), texts)


def log_odds(scores: np.ndarray) -> np.ndarray:
    """What is sketched and compared: log(p / (1 - p)), p clipped to [EPSILON, 1 - EPSILON]."""
    p = np.clip(scores.astype(np.float64), EPSILON, 1 - EPSILON)
    return np.log(p) - np.log1p(-p)


def _sketch(values: Sequence[float] = ()) -> Any:
    from ddsketch import DDSketch

    sketch = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
    for v in values:
        sketch.add(v)
    return sketch


def _sketch_to_text(sketch: Any) -> str:
    from ddsketch.pb.proto import DDSketchProto

    return base64.b64encode(DDSketchProto.to_proto(sketch).SerializeToString()).decode()


def _sketch_from_text(text: str) -> Any:
    from ddsketch.pb.ddsketch_pb2 import DDSketch as Proto
    from ddsketch.pb.proto import DDSketchProto

    return DDSketchProto.from_proto(Proto.FromString(base64.b64decode(text)))


def scores_path(output_path: str, shard: Shard) -> str:
    """Where a shard's scores are kept between the scoring and the rewrite phases."""
    return work_path(output_path, "scores", shard.key + ".npy")


def _score_shard(output_path: str, model_path: str, shard: Shard) -> dict[str, Any]:
    """Score one shard: its scores to `_work/scores/{key}.npy`; its count and sketch (JSON)."""
    table = read_shard(FILTER_STAGE, shard.path, ["text"])
    scores = positive_probability(_model(model_path), table.column("text").to_pylist())
    buffer = io.BytesIO()
    np.save(buffer, scores, allow_pickle=False)
    atomic_write(scores_path(output_path, shard), buffer.getvalue())
    return {"documents": len(scores), "sketch": _sketch_to_text(_sketch(log_odds(scores).tolist()))}


def _stored_scores(output_path: str, shard: Shard) -> np.ndarray:
    raw = read_bytes(scores_path(output_path, shard))
    if raw is None:
        raise CurationError(f"{FILTER_STAGE}: the scores of shard {shard.path} are missing from"
                            f" {scores_path(output_path, shard)}")
    return np.load(io.BytesIO(raw), allow_pickle=False)


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def check_selection(threshold: float | None, top_fraction: float | None) -> str | None:
    """Why a (threshold, top_fraction) choice is invalid, or None."""
    if (threshold is None) == (top_fraction is None):
        return "give exactly one of threshold (keep P(good) >= threshold) or top_fraction (keep the best share)"
    if threshold is not None and not 0 <= threshold <= 1:
        return f"threshold is a probability in [0, 1], got {threshold}"
    if top_fraction is not None and not 0 < top_fraction <= 1:
        return f"top_fraction must be in (0, 1], got {top_fraction}"
    return None


@dataclass(frozen=True)
class Scored:
    """What the scoring pass (`QualityFilter.prepare`) found."""

    output_path: str
    """The stage's output: its `_work/scores/` holds each shard's scores."""
    model_path: str
    cut: float
    """Log-odds below which a document is removed, for `top_fraction` (-inf otherwise)."""
    quantiles: dict[str, float]


@dataclass(frozen=True)
class QualityFilter(CurationFilter):
    """Removes the documents a fastText quality classifier scores below `threshold`, or outside the
    `top_fraction` best; each kept document gets its `quality_score`."""

    classifier: Step | str
    """A classifier step (`quality_classifier_step`, a dependency of the filter's step), or the folder or
    `model.bin` of a trained classifier."""
    threshold: float | None = None
    top_fraction: float | None = None
    scored: Scored | None = None
    """Set by `prepare`: where the scores are and the cut."""
    name = FILTER_STAGE
    kinds = ("parquet", "fasttext")

    def identity(self) -> dict[str, Any]:
        found = {"threshold": self.threshold, "top_fraction": self.top_fraction,
                 "relative_accuracy": RELATIVE_ACCURACY, "score": SCORE}
        return found if isinstance(self.classifier, Step) else {**found, "classifier": self.model_path()}

    def deps(self) -> Sequence[Step]:
        return [self.classifier] if isinstance(self.classifier, Step) else []

    def model_path(self) -> str:
        """The classifier's `model.bin` (a step's under the current storage prefix)."""
        path = self.classifier.output_path if isinstance(self.classifier, Step) else self.classifier
        return path if path.endswith(".bin") else join_path(path, MODEL_FILE)

    def prepare(self, output_path: str, shards: Sequence[Shard], workers: int) -> QualityFilter:
        """Score every shard (scores kept under `_work/scores`), merge their sketches, find the cut."""
        model_path = self.model_path()
        scored = run_phase(output_path, "scores", shards, functools.partial(_score_shard, output_path, model_path),
                           key_of=lambda s: s.key, workers=workers,
                           name=f"{FILTER_STAGE}: scoring {len(shards)} shards")
        merged = _sketch()
        for outcome in scored:
            if outcome["documents"]:
                merged.merge(_sketch_from_text(outcome["sketch"]))
        cut = -math.inf
        quantiles: dict[str, float] = {}
        if merged.count:
            if self.top_fraction is not None and self.top_fraction < 1:  # 1 keeps all (the minimum is approximate)
                cut = float(merged.get_quantile_value(1 - self.top_fraction))
            quantiles = {f"p{q}": round(_sigmoid(merged.get_quantile_value(q / 100)), 6) for q in (10, 50, 90)}
        return dataclasses.replace(self, classifier=model_path, scored=Scored(output_path, model_path, cut, quantiles))

    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        """Verdicts from the shard's stored scores: below `threshold` (a probability) or, without one, below
        the cut (log-odds) is removed."""
        if self.scored is None:
            raise CurationError(f"{FILTER_STAGE}: the scores are made by prepare(), before any shard is decided")
        scores = _stored_scores(self.scored.output_path, shard)
        if len(scores) != table.num_rows:
            raise CurationError(f"{FILTER_STAGE}: {len(scores)} stored scores for {table.num_rows} rows")
        below = scores < self.threshold if self.threshold is not None else log_odds(scores) < self.scored.cut
        return Verdicts([REASON if b else None for b in below.tolist()], columns={SCORE_COLUMN: scores},
                        counters={"scored": len(scores)})

    def result(self, summary: CurationResult) -> QualityFilterResult:
        assert self.scored is not None
        cut = self.scored.cut
        used = self.threshold if self.threshold is not None else (_sigmoid(cut) if math.isfinite(cut) else 0.0)
        return QualityFilterResult.of(summary, threshold=used,
                                      cut=cut if self.top_fraction is not None and math.isfinite(cut) else None,
                                      top_fraction=self.top_fraction, quantiles=self.scored.quantiles,
                                      model_path=self.scored.model_path)


def quality_filter(output_path: str, dataset_path: str, model_path: str, threshold: float | None = None,
                   top_fraction: float | None = None, workers: int = 1) -> QualityFilterResult:
    """Documents of a normalized dataset that the quality classifier scores at least `threshold`, or the
    `top_fraction` best of them; every kept document gets its `quality_score`."""
    problem = check_selection(threshold, top_fraction)
    if problem:
        raise ValueError(f"{FILTER_STAGE}: {problem}")
    result = run_filter(output_path, dataset_path, QualityFilter(model_path, threshold, top_fraction), workers)
    assert isinstance(result, QualityFilterResult)
    return result


def quality_filter_step(name: str, dataset: Step, classifier: Step, threshold: float | None = None,
                        top_fraction: float | None = None, workers: int = 1,
                        max_removed_fraction: float = 0.5) -> Step:
    """`dataset` without the documents `classifier` scores low (below `threshold`, or outside the
    `top_fraction` best), with each kept document's score.

    Identity: `threshold`, `top_fraction` (and `dataset`, `classifier`); not `workers` nor `max_removed_fraction`.
    """
    problem = check_selection(threshold, top_fraction)
    if problem:
        raise StepDefinitionError(f"step {name!r}: {problem}")
    return filter_step(name, dataset, QualityFilter(classifier, threshold, top_fraction), workers=workers,
                       max_removed_fraction=max_removed_fraction, description=made_by(quality_filter))
