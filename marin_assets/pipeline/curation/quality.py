"""Quality classifier: a fastText model trained on documents labeled good and bad, and the filter that
keeps the documents it scores highest.

Training reads two normalized datasets (positives, negatives), holds out a deterministic fraction of
each by document-id hash for validation, writes fastText's one-example-per-line files and trains on
one thread with a fixed seed, so the same data and parameters give the same model.

The filter scores every document once (the positive label's probability, batched through
`model.predict`), keeps the score as a `quality_score` column, and removes documents below a
threshold: a given one, or — for `top_fraction` — the (1 - top_fraction) quantile of all scores,
found without sorting the corpus: each shard's scoring task writes its scores (`_work/scores/*.npy`)
and a DDSketch of their log-odds, the driver merges the sketches, and the rewrite reads the stored
scores back. Log-odds, because a sketch's accuracy is relative to the value: probabilities crowd
near 1, where a 1% relative error on p would lump together everything above 0.99.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import io
import math
import multiprocessing
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import xxhash
from fsspec.implementations.local import LocalFileSystem

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.shards import (
    CurationError,
    Shard,
    list_shards,
    read_shard,
    work_path,
)
from marin_assets.pipeline.curation.stage import (
    FORMAT,
    CurationResult,
    Verdicts,
    curation_step,
    filter_shards,
    run_phase,
)

TRAIN_STAGE = "train_quality_classifier"
FILTER_STAGE = "quality_filter"
MODEL_FILE = "model.bin"
TRAIN_FILE = "train.txt"
VALIDATION_FILE = "validation.txt"
LABEL_PREFIX = "__quality__"
"""fastText's label prefix here; a document holding it has it broken up (`_neutral`), so no text is a label."""
POSITIVE = LABEL_PREFIX + "good"
NEGATIVE = LABEL_PREFIX + "bad"
REASON = "quality below threshold"
SCORE_COLUMN = "quality_score"
RELATIVE_ACCURACY = 0.005
"""Of the sketched log-odds: the threshold for `top_fraction` is within 0.5% of the exact quantile's."""
EPSILON = 1e-7
"""Probabilities are clipped to [EPSILON, 1 - EPSILON] before their log-odds are taken."""
PREDICT_BATCH = 4096


# --- training ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ValidationMetrics:
    """The classifier on its held-out documents, a document called good when P(good) >= 0.5."""

    positives: int
    """Held-out good documents."""
    negatives: int
    """Held-out bad documents."""
    true_positives: int
    false_positives: int
    true_negatives: int
    false_negatives: int
    precision: float
    """Of the documents called good, the share that are good (1.0 when none is called good)."""
    recall: float
    """Of the good documents, the share called good."""
    accuracy: float
    f1: float


@dataclass(frozen=True)
class QualityClassifier:
    """A trained fastText quality classifier and how it did on held-out documents."""

    path: str
    model_path: str
    """`{path}/model.bin`: what `quality_filter` loads."""
    train_positives: int
    train_negatives: int
    validation: ValidationMetrics | None
    """None when `validation_fraction` is 0."""
    labels: dict[str, str] = field(default_factory=lambda: {"positive": POSITIVE, "negative": NEGATIVE})
    parameters: dict[str, Any] = field(default_factory=dict)
    """What the model was trained with (epochs, learning rate, …)."""


def _neutral(text: str) -> str:
    """One line of fastText input: newlines become spaces, and the label prefix cannot occur."""
    return text.replace("\n", " ").replace(LABEL_PREFIX, "__ quality__")


def _read_texts(stage: str, what: str, dataset_path: str) -> tuple[list[str], list[str]]:
    """(ids, texts) of every document of a normalized dataset; an empty one is an error naming `what`."""
    ids: list[str] = []
    texts: list[str] = []
    for shard in list_shards(stage, dataset_path):
        table = read_shard(stage, shard.path, ["id", "text"])
        ids += table.column("id").to_pylist()
        texts += table.column("text").to_pylist()
    if not texts:
        raise CurationError(f"{stage}: the {what} at {dataset_path} hold no documents; a classifier needs both"
                            " positives and negatives")
    return ids, texts


def _held_out(doc_id: str, seed: int, fraction: float) -> bool:
    """Whether a document is in the validation set: a hash of its id (and the seed), so the split is the
    same on every run and machine, and a document keeps its side as the data grows."""
    return xxhash.xxh64_intdigest(doc_id.encode(), seed=seed) < fraction * 2**64


@contextlib.contextmanager
def _local_folder(output_path: str) -> Iterator[str]:
    """A local folder for fastText (which reads and writes only local files), copied to `output_path`."""
    fs, root = fsspec.core.url_to_fs(output_path)
    if isinstance(fs, LocalFileSystem):
        os.makedirs(root, exist_ok=True)
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="quality-") as folder:
        yield folder
        for name in os.listdir(folder):
            fs.put_file(os.path.join(folder, name), join_path(root, name))


def _metrics(scores: np.ndarray, labels: np.ndarray) -> ValidationMetrics:
    called = scores >= 0.5
    tp, fp = int((called & labels).sum()), int((called & ~labels).sum())
    tn, fn = int((~called & ~labels).sum()), int((~called & labels).sum())
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return ValidationMetrics(int(labels.sum()), int((~labels).sum()), tp, fp, tn, fn, round(precision, 6),
                             round(recall, 6), round((tp + tn) / len(labels), 6), round(f1, 6))


def _train_fasttext(train_file: str, model_file: str, epochs: int, learning_rate: float, word_ngrams: int, dim: int,
                    min_count: int, buckets: int, seed: int) -> None:
    """Train and save a fastText classifier (run in its own process by `train_quality_classifier`)."""
    import fasttext

    try:
        model = fasttext.train_supervised(input=train_file, epoch=epochs, lr=learning_rate, wordNgrams=word_ngrams,
                                          dim=dim, minCount=min_count, bucket=buckets, label=LABEL_PREFIX,
                                          thread=1, seed=seed, verbose=0)
    except RuntimeError as e:  # fastText's "Encountered NaN": the learning rate diverged
        raise CurationError(f"{TRAIN_STAGE}: fastText training failed ({e}) with learning_rate {learning_rate};"
                            " a smaller learning rate trains more stably") from None
    model.save_model(model_file)


def train_quality_classifier(output_path: str, positives_path: str, negatives_path: str,
                             validation_fraction: float = 0.1, epochs: int = 25, learning_rate: float = 0.1,
                             word_ngrams: int = 2, dim: int = 64, min_count: int = 1, seed: int = 0,
                             buckets: int = 200_000) -> QualityClassifier:
    """A fastText classifier of good (positives) and bad (negatives) documents, validated on held-out ones.

    `buckets`: rows for hashed word n-grams; the model holds (buckets + vocabulary) × dim floats, so
    fastText's default 2,000,000 at dim 64 is a 512 MB model — raise it for training sets of many
    millions of words."""
    import fasttext

    if not 0 <= validation_fraction < 1:
        raise ValueError(f"{TRAIN_STAGE}: validation_fraction must be in [0, 1), got {validation_fraction}")
    examples: dict[bool, list[str]] = {True: [], False: []}
    validation: list[tuple[bool, str]] = []
    for positive, what, path in ((True, "positives", positives_path), (False, "negatives", negatives_path)):
        for doc_id, text in zip(*_read_texts(TRAIN_STAGE, what, path), strict=True):
            if _held_out(doc_id, seed, validation_fraction):
                validation.append((positive, text))
            else:
                examples[positive].append(text)
    for positive, what in ((True, "positives"), (False, "negatives")):
        if not examples[positive]:
            raise CurationError(f"{TRAIN_STAGE}: every one of the {what} was held out for validation; lower"
                                f" validation_fraction ({validation_fraction})")
    lines = [f"{POSITIVE if positive else NEGATIVE} {_neutral(text)}\n"
             for positive in (True, False) for text in examples[positive]]
    random.Random(seed).shuffle(lines)  # fastText reads in order: interleave the classes
    parameters = dict(validation_fraction=validation_fraction, epochs=epochs, learning_rate=learning_rate,
                      word_ngrams=word_ngrams, dim=dim, min_count=min_count, seed=seed, buckets=buckets)
    with _local_folder(output_path) as folder:
        train_file = os.path.join(folder, TRAIN_FILE)
        with open(train_file, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.writelines(lines)
        with open(os.path.join(folder, VALIDATION_FILE), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.writelines(f"{POSITIVE if positive else NEGATIVE} {_neutral(text)}\n" for positive, text in validation)
        partial = os.path.join(folder, MODEL_FILE + ".partial")
        # In a fresh process: fastText's training diverged ("Encountered NaN") in a test process whose
        # native libraries had run before, and never alone; a spawned process has a clean state.
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            pool.submit(_train_fasttext, train_file, partial, epochs, learning_rate, word_ngrams, dim, min_count,
                        buckets, seed).result()
        os.replace(partial, os.path.join(folder, MODEL_FILE))
        model = fasttext.load_model(os.path.join(folder, MODEL_FILE))
    metrics = None
    if validation:
        scores = _positive_probability(model, [text for _, text in validation])
        metrics = _metrics(scores, np.array([positive for positive, _ in validation]))
    return QualityClassifier(output_path, join_path(output_path, MODEL_FILE), len(examples[True]),
                             len(examples[False]), metrics, parameters=parameters)


def validation_accuracy_at_least(minimum: float) -> Check:
    """The classifier tells held-out good from bad documents at least this often: a classifier trained
    on mislabeled or mixed-up data fails here instead of silently filtering a corpus at random."""

    def check(output_path: str, result: dict) -> CheckOutcome:
        metrics = result.get("validation")
        if metrics is None:
            return CheckOutcome(False, "no validation set (validation_fraction 0): the classifier is unchecked")
        return CheckOutcome(metrics["accuracy"] >= minimum,
                            f"validation accuracy {metrics['accuracy']:.1%} (at least {minimum:.0%}), precision"
                            f" {metrics['precision']:.1%}, recall {metrics['recall']:.1%} on"
                            f" {metrics['positives'] + metrics['negatives']} held-out documents",
                            {"accuracy": metrics["accuracy"], "f1": metrics["f1"], "minimum": minimum})

    return Check("validation_accuracy_at_least", check,
                 f"The classifier is right on at least {minimum:.0%} of its held-out documents.", blocking=True)


def quality_classifier_step(name: str, positives: Step, negatives: Step, validation_fraction: float = 0.1,
                            epochs: int = 25, learning_rate: float = 0.1, word_ngrams: int = 2, dim: int = 64,
                            min_count: int = 1, seed: int = 0, buckets: int = 200_000,
                            min_validation_accuracy: float = 0.6) -> Step:
    """A fastText quality classifier trained on two normalized datasets (good, bad) as a step;
    `min_validation_accuracy` (not identity) is its check's floor."""
    if not 0 <= validation_fraction < 1:
        raise StepDefinitionError(f"step {name!r}: validation_fraction must be in [0, 1), got {validation_fraction}")
    options: dict[str, Any] = dict(validation_fraction=validation_fraction, epochs=epochs, learning_rate=learning_rate,
                                   word_ngrams=word_ngrams, dim=dim, min_count=min_count, seed=seed, buckets=buckets)
    return Step(name=name, fn=lambda out: train_quality_classifier(out, positives.output_path, negatives.output_path,
                                                                   **options),
                deps=[positives, negatives],
                hash_attrs={"stage": TRAIN_STAGE, **options, "labels": [POSITIVE, NEGATIVE], "fasttext": "0.9.2",
                            "format": FORMAT},
                resources=Resources(cpu=1), kind="train", kinds=["fasttext"],
                description=made_by(train_quality_classifier),
                checks=[validation_accuracy_at_least(min_validation_accuracy)])


# --- scoring and filtering ---------------------------------------------------------------------

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


def _positive_probability(model: Any, texts: Sequence[str]) -> np.ndarray:
    """P(good) of each text, in batches, as float32 in [0, 1]."""
    out = np.empty(len(texts), dtype=np.float32)
    for begin in range(0, len(texts), PREDICT_BATCH):
        batch = [_neutral(t) for t in texts[begin:begin + PREDICT_BATCH]]
        labels, probabilities = model.predict(batch, k=-1)
        out[begin:begin + len(batch)] = [p[list(ls).index(POSITIVE)] if POSITIVE in ls else 0.0
                                         for ls, p in zip(labels, probabilities, strict=True)]
    return np.clip(out, 0.0, 1.0)


def score_texts(texts: Sequence[str], model_path: str) -> np.ndarray:
    """P(good) of each text under the classifier at `model_path` (its folder or `model.bin`), float32."""
    if not model_path.endswith(".bin"):
        model_path = join_path(model_path, MODEL_FILE)
    return _positive_probability(_model(model_path), texts)


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
    scores = _positive_probability(_model(model_path), table.column("text").to_pylist())
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


def _keep_scored(scores: np.ndarray, threshold: float | None, cut: float, table: Any) -> Verdicts:
    """Verdicts from a shard's stored scores: below `threshold` (a probability) or, without one, below
    `cut` (log-odds) is removed."""
    if len(scores) != table.num_rows:
        raise CurationError(f"{FILTER_STAGE}: {len(scores)} stored scores for {table.num_rows} rows")
    below = scores < threshold if threshold is not None else log_odds(scores) < cut
    return Verdicts([REASON if b else None for b in below.tolist()], columns={SCORE_COLUMN: scores},
                    counters={"scored": len(scores)})


def _decider(output_path: str, threshold: float | None, cut: float, shard: Shard) -> Callable[[Any], Verdicts]:
    """A shard's verdicts from its stored scores (scored once, in the first phase)."""
    return functools.partial(_keep_scored, _stored_scores(output_path, shard), threshold, cut)


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


def quality_filter(output_path: str, dataset_path: str, model_path: str, threshold: float | None = None,
                   top_fraction: float | None = None, workers: int = 1) -> QualityFilterResult:
    """Documents of a normalized dataset that the quality classifier scores at least `threshold`, or the
    `top_fraction` best of them; every kept document gets its `quality_score`."""
    problem = check_selection(threshold, top_fraction)
    if problem:
        raise ValueError(f"{FILTER_STAGE}: {problem}")
    if not model_path.endswith(".bin"):
        model_path = join_path(model_path, MODEL_FILE)
    shards = list_shards(FILTER_STAGE, dataset_path)
    scored = run_phase(output_path, "scores", shards, functools.partial(_score_shard, output_path, model_path),
                       key_of=lambda s: s.key, workers=workers, name=f"{FILTER_STAGE}: scoring {len(shards)} shards")
    merged = _sketch()
    for outcome in scored:
        if outcome["documents"]:
            merged.merge(_sketch_from_text(outcome["sketch"]))
    cut = -math.inf
    quantiles: dict[str, float] = {}
    if merged.count:
        if top_fraction is not None and top_fraction < 1:  # 1 keeps all (the sketch's minimum is approximate)
            cut = float(merged.get_quantile_value(1 - top_fraction))
        quantiles = {f"p{q}": round(_sigmoid(merged.get_quantile_value(q / 100)), 6) for q in (10, 50, 90)}
    summary = filter_shards(FILTER_STAGE, output_path, shards, workers=workers,
                            decide_for=functools.partial(_decider, output_path, threshold, cut))
    used = threshold if threshold is not None else (_sigmoid(cut) if math.isfinite(cut) else 0.0)
    return QualityFilterResult(**summary, threshold=used, cut=cut if top_fraction is not None and math.isfinite(cut)
                               else None, top_fraction=top_fraction, quantiles=quantiles, model_path=model_path)


def quality_filter_step(name: str, dataset: Step, classifier: Step, threshold: float | None = None,
                        top_fraction: float | None = None, workers: int = 1,
                        max_removed_fraction: float = 0.5) -> Step:
    """`dataset` without the documents `classifier` scores low (below `threshold`, or outside the
    `top_fraction` best), with each kept document's score."""
    problem = check_selection(threshold, top_fraction)
    if problem:
        raise StepDefinitionError(f"step {name!r}: {problem}")
    return curation_step(
        name, FILTER_STAGE,
        lambda out: quality_filter(out, dataset.output_path, join_path(classifier.output_path, MODEL_FILE), threshold,
                                   top_fraction, workers),
        dataset, {"threshold": threshold, "top_fraction": top_fraction, "relative_accuracy": RELATIVE_ACCURACY,
                  "score": "P(good) fastText"},
        description=made_by(quality_filter), max_removed_fraction=max_removed_fraction, cpu=1,
        more_deps=[classifier], kinds=("parquet", "fasttext"))
