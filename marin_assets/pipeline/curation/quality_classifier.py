"""The quality classifier: a fastText model trained on documents labeled good and bad.

Training reads two normalized datasets (positives, negatives), holds out a deterministic fraction of
each by document-id hash for validation, writes fastText's one-example-per-line files and trains on
one thread with a fixed seed, so the same data and parameters give the same model. A document's score
is the positive label's probability (`positive_probability`); the quality filter (`quality`) keeps the
documents scored highest.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import random
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import xxhash
from fsspec.implementations.local import LocalFileSystem

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.estimate import bytes_read_estimate
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Resources, Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.shards import CurationError, list_shards, read_shard
from marin_assets.pipeline.curation.stage import FORMAT

TRAIN_STAGE = "train_quality_classifier"
MODEL_FILE = "model.bin"
TRAIN_FILE = "train.txt"
VALIDATION_FILE = "validation.txt"
LABEL_PREFIX = "__quality__"
"""fastText's label prefix here; a document holding it has it broken up (`neutral`), so no text is a label."""
POSITIVE = LABEL_PREFIX + "good"
NEGATIVE = LABEL_PREFIX + "bad"
PREDICT_BATCH = 4096


def neutral(text: str) -> str:
    """One line of fastText input: newlines become spaces, and the label prefix cannot occur."""
    return text.replace("\n", " ").replace(LABEL_PREFIX, "__ quality__")


def positive_probability(model: Any, texts: Sequence[str]) -> np.ndarray:
    """P(good) of each text, in batches, as float32 in [0, 1]."""
    out = np.empty(len(texts), dtype=np.float32)
    for begin in range(0, len(texts), PREDICT_BATCH):
        batch = [neutral(t) for t in texts[begin:begin + PREDICT_BATCH]]
        labels, probabilities = model.predict(batch, k=-1)
        out[begin:begin + len(batch)] = [p[list(ls).index(POSITIVE)] if POSITIVE in ls else 0.0
                                         for ls, p in zip(labels, probabilities, strict=True)]
    return np.clip(out, 0.0, 1.0)


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


@record_type("quality_classifier")
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
    lines = [f"{POSITIVE if positive else NEGATIVE} {neutral(text)}\n"
             for positive in (True, False) for text in examples[positive]]
    random.Random(seed).shuffle(lines)  # fastText reads in order: interleave the classes
    parameters = dict(validation_fraction=validation_fraction, epochs=epochs, learning_rate=learning_rate,
                      word_ngrams=word_ngrams, dim=dim, min_count=min_count, seed=seed, buckets=buckets)
    with _local_folder(output_path) as folder:
        train_file = os.path.join(folder, TRAIN_FILE)
        with open(train_file, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.writelines(lines)
        with open(os.path.join(folder, VALIDATION_FILE), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.writelines(f"{POSITIVE if positive else NEGATIVE} {neutral(text)}\n" for positive, text in validation)
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
        scores = positive_probability(model, [text for _, text in validation])
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
    `min_validation_accuracy` (not identity) is its check's floor.

    Identity: `validation_fraction`, `epochs`, `learning_rate`, `word_ngrams`, `dim`, `min_count`, `seed`,
    `buckets`, fastText's version (and `positives`, `negatives`); not `min_validation_accuracy`.
    """
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
                checks=[validation_accuracy_at_least(min_validation_accuracy)],
                estimate=bytes_read_estimate("fasttext", lambda: [positives, negatives]))
