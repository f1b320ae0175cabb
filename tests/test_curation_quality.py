"""The fastText quality classifier, trained on the planted labeled data, and the quality filter: accuracy on
held-out documents, planted junk removed and documentation kept, top_fraction through merged sketches, the same
output fanned out or after a kill, bad input, and the protocol."""

import functools
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from marin_assets import Step, StepDefinitionError, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.pipeline.curation.normalize import normalize
from marin_assets.pipeline.curation.quality import (
    MODEL_FILE,
    POSITIVE,
    REASON,
    RELATIVE_ACCURACY,
    SCORE_COLUMN,
    TRAIN_FILE,
    QualityClassifier,
    QualityFilterResult,
    log_odds,
    quality_classifier_step,
    quality_filter,
    quality_filter_step,
    score_texts,
    train_quality_classifier,
)
from marin_assets.pipeline.curation.shards import CurationError, list_shards, write_shard
from tests.support.curation import documents, kill_when
from tests.support.helpers import FAST, subprocess_env

BUCKETS = 20_000
"""Hashed n-gram rows: a 9 MB model, plenty for 240 labeled documents."""


@pytest.fixture(scope="module")
def labeled(planted, tmp_path_factory):
    """The planted labeled data, normalized, and a classifier trained on it."""
    root = tmp_path_factory.mktemp("quality")
    positives, negatives = str(root / "positives"), str(root / "negatives")
    normalize(positives, f"{planted.raw}/labeled/positive", target_shard_bytes=100_000)
    normalize(negatives, f"{planted.raw}/labeled/negative", target_shard_bytes=100_000)
    classifier = train_quality_classifier(str(root / "classifier"), positives, negatives, buckets=BUCKETS)
    print(f"\nclassifier: {classifier.train_positives} + {classifier.train_negatives} training documents,"
          f" validation {classifier.validation}")
    return positives, negatives, classifier, root


@pytest.fixture(scope="module")
def top70(planted, labeled):
    """The planted corpus filtered to its best 70%."""
    _, _, classifier, root = labeled
    out = str(root / "top70")
    return out, quality_filter(out, planted.normalized, classifier.path, top_fraction=0.7)


def test_the_classifier_tells_documentation_from_junk_on_held_out_documents(labeled):
    positives, negatives, classifier, _ = labeled
    metrics = classifier.validation
    assert metrics is not None and metrics.positives >= 5 and metrics.negatives >= 5
    assert classifier.train_positives + metrics.positives == len(documents(positives))
    assert classifier.train_negatives + metrics.negatives == len(documents(negatives))
    assert metrics.accuracy >= 0.85 and metrics.recall >= 0.85 and metrics.precision >= 0.8, metrics
    assert metrics.true_positives + metrics.false_negatives == metrics.positives
    lines = (Path(classifier.path) / TRAIN_FILE).read_text().split("\n")[:-1]
    assert len(lines) == classifier.train_positives + classifier.train_negatives  # one example a line
    assert all(line.startswith(("__quality__good ", "__quality__bad ")) for line in lines)
    assert Path(classifier.model_path).stat().st_size > 0 and classifier.model_path.endswith(MODEL_FILE)


def test_training_is_deterministic(labeled, planted, tmp_path):
    positives, negatives, classifier, _ = labeled
    again = train_quality_classifier(str(tmp_path / "again"), positives, negatives, buckets=BUCKETS)
    texts = [row["text"] for row in documents(planted.normalized)]
    first, second = score_texts(texts, classifier.path), score_texts(texts, again.path)
    assert np.array_equal(first, second) and len(np.unique(first)) > 100
    assert again.validation == classifier.validation
    other = train_quality_classifier(str(tmp_path / "other"), positives, negatives, buckets=BUCKETS, seed=1)
    assert not np.array_equal(score_texts(texts, other.path), first)  # the seed matters: it is not ignored


def test_filtering_removes_planted_junk_and_keeps_documentation(labeled, planted, tmp_path):
    _, _, classifier, _ = labeled
    out = str(tmp_path / "filtered")
    quality_filter(str(tmp_path / "warm"), planted.normalized, classifier.path, threshold=0.5)  # load, import
    started = time.process_time()
    result = quality_filter(out, planted.normalized, classifier.path, threshold=0.5)
    seconds = time.process_time() - started
    rows = documents(out, ("id", "text", SCORE_COLUMN))
    kept = {row["id"] for row in rows}
    junk, base = planted.truth.low_quality, planted.truth.base_ids
    recall = sum(i not in kept for i in junk) / len(junk)
    base_kept = sum(i in kept for i in base) / len(base)
    print(f"\nquality_filter at 0.5: removed {recall:.1%} of planted junk, kept {base_kept:.1%} of real documents;"
          f" {result.bytes_in / 1e6 / seconds:.1f} MB/s per core end to end")
    assert recall >= 0.9 and base_kept >= 0.95
    assert all(0.5 <= row[SCORE_COLUMN] <= 1 for row in rows)
    assert set(result.removed) == {REASON} and result.removed[REASON].documents == result.documents_in - len(rows)
    assert result.threshold == 0.5 and result.top_fraction is None and result.cut is None
    assert 0 <= result.quantiles["p10"] <= result.quantiles["p50"] <= result.quantiles["p90"] <= 1
    texts = [row["text"] for row in documents(planted.normalized)]
    started = time.process_time()
    score_texts(texts, classifier.path)
    seconds = time.process_time() - started
    print(f"scoring alone: {sum(len(t.encode()) for t in texts) / 1e6 / seconds:.1f} MB/s per core")


def test_top_fraction_keeps_close_to_that_share_from_merged_sketches(top70, planted):
    out, result = top70
    shards = list_shards("test", planted.normalized)
    assert len(shards) > 3  # the quantile really is merged from several shards' sketches
    scores = np.concatenate([np.load(Path(out) / "_work" / "scores" / f"{s.key}.npy") for s in shards])
    values = np.sort(log_odds(scores))
    exact = values[math.floor(0.3 * (len(values) - 1))]
    assert abs(result.cut - exact) <= RELATIVE_ACCURACY * abs(exact) + 1e-12  # the sketch's guarantee
    kept = len(documents(out, ("id",)))
    assert kept == int((log_odds(scores) >= result.cut).sum())  # the rewrite applied exactly that cut
    near = int((np.abs(values - exact) <= RELATIVE_ACCURACY * abs(exact)).sum())  # ties and the sketch's slack
    print(f"\ntop 70%: kept {kept} of {len(scores)} ({kept / len(scores):.1%}); {near} scores within the sketch's"
          f" accuracy of the exact quantile")
    assert abs(kept - 0.7 * len(scores)) <= near + 1
    assert abs(kept / len(scores) - 0.7) <= 0.05
    assert result.documents_out == kept and result.top_fraction == 0.7
    assert math.isclose(result.threshold, 1 / (1 + math.exp(-result.cut)))


def test_top_fraction_one_keeps_everything(top70, planted, labeled, tmp_path):
    _, _, classifier, _ = labeled
    result = quality_filter(str(tmp_path / "all"), planted.normalized, classifier.path, top_fraction=1.0)
    assert result.documents_out == result.documents_in and not result.removed and result.cut is None


def test_two_workers_give_the_same_output(top70, planted, labeled, local_ray, tmp_path):
    out, result = top70
    _, _, classifier, _ = labeled
    fanned = quality_filter(str(tmp_path / "fanned"), planted.normalized, classifier.path, top_fraction=0.7,
                            workers=2)
    assert documents(str(tmp_path / "fanned"), ("id", "text", SCORE_COLUMN)) == documents(out, ("id", "text",
                                                                                                SCORE_COLUMN))
    assert fanned.removed == result.removed and fanned.cut == result.cut and fanned.quantiles == result.quantiles


def test_resume_after_a_killed_worker(top70, planted, labeled, tmp_path):
    reference, result = top70
    _, _, classifier, _ = labeled
    out = str(tmp_path / "resumed")
    code = (f"from marin_assets.pipeline.curation.quality import quality_filter\n"
            f"quality_filter({out!r}, {planted.normalized!r}, {classifier.path!r}, top_fraction=0.7)\n")
    kill_when([sys.executable, "-c", code], f"{out}/_work/scores/train-00000.json", env=subprocess_env())
    work = Path(out) / "_work"
    # finished work: a done marker (.json) and the scores it vouches for; a shard's scores written just before the
    # kill, its marker not yet, are unfinished and rightly done again
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*")
              if p.suffix == ".json" or (p.suffix == ".npy" and p.with_suffix(".json").exists())}
    shards = list_shards("test", planted.normalized)
    assert before and len(list((work / "shards").glob("*.json"))) < len(shards)  # killed part-way
    resumed = quality_filter(out, planted.normalized, classifier.path, top_fraction=0.7)
    assert documents(out, ("id", "text", SCORE_COLUMN)) == documents(reference, ("id", "text", SCORE_COLUMN))
    assert resumed.removed == result.removed and resumed.cut == result.cut
    redone = [p.relative_to(work) for p, mtime in before.items() if p.stat().st_mtime_ns != mtime]
    assert not redone  # finished work is not redone


def test_bad_input(labeled, planted, tmp_path):
    positives, _, classifier, _ = labeled
    empty = str(tmp_path / "empty")
    write_shard(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string()),
                          "source": pa.array([], pa.string())}), f"{empty}/train/part-00000.parquet")
    with pytest.raises(CurationError, match=r"^train_quality_classifier: the negatives at .*empty hold no"
                                            r" documents"):
        train_quality_classifier(str(tmp_path / "c1"), positives, empty)
    with pytest.raises(CurationError, match=r"^train_quality_classifier: the positives at .*empty hold no"
                                            r" documents"):
        train_quality_classifier(str(tmp_path / "c2"), empty, positives)
    with pytest.raises(CurationError, match=r"^quality_filter: no model at .*nowhere/model\.bin"):
        quality_filter(str(tmp_path / "f"), planted.normalized, str(tmp_path / "nowhere"), threshold=0.5)
    with pytest.raises(ValueError, match=r"^quality_filter: give exactly one of threshold"):
        quality_filter(str(tmp_path / "f"), planted.normalized, classifier.path)
    data = Step(name="curated/data", fn=print, override_output_path=planted.normalized)
    model = Step(name="classifiers/quality", fn=print, override_output_path=classifier.path)
    for kwargs in ({}, {"threshold": 0.5, "top_fraction": 0.7}):
        with pytest.raises(StepDefinitionError, match=r"^step 'curated/q': give exactly one of threshold \(keep"
                                                      r" P\(good\) >= threshold\) or top_fraction"):
            quality_filter_step("curated/q", data, model, **kwargs)
    with pytest.raises(StepDefinitionError, match=r"^step 'curated/q': top_fraction must be in \(0, 1\], got 1\.5"):
        quality_filter_step("curated/q", data, model, top_fraction=1.5)
    with pytest.raises(StepDefinitionError, match=r"^step 'curated/q': threshold is a probability in \[0, 1\]"):
        quality_filter_step("curated/q", data, model, threshold=2)


def _copy(source: str, output_path: str) -> None:
    shutil.copytree(source, output_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_work"))


def test_the_steps_through_the_protocol(labeled, planted, prefix, tmp_path):
    positives, negatives, _, _ = labeled
    good = Step(name="curated/labeled-good", fn=functools.partial(_copy, positives), hash_attrs={"from": positives})
    bad = Step(name="curated/labeled-bad", fn=functools.partial(_copy, negatives), hash_attrs={"from": negatives})
    adopted = tmp_path / "adopted"
    _copy(planted.normalized, str(adopted))
    data = Step(name="curated/planted", fn=lambda out: None, override_output_path=str(adopted))
    classifier = quality_classifier_step("classifiers/quality", good, bad, buckets=BUCKETS)
    filtered = quality_filter_step("curated/planted-quality", data, classifier, threshold=0.5)
    assert classifier in filtered.deps and data in filtered.deps
    for step in (good, bad, data, classifier):
        materialize_step(step, prefix=prefix, settings=FAST)
    trained = read_record(classifier.output_path_under(prefix))
    assert trained.hash_attrs["buckets"] == BUCKETS and trained.result["validation"]["accuracy"] >= 0.85
    typed = load_result(classifier.output_path_under(prefix), QualityClassifier)
    assert typed.labels["positive"] == POSITIVE and typed.parameters["epochs"] == 25
    assert run_check(classifier.checks[0], trained.output_path, trained.result).passed
    outcome = materialize_step(filtered, prefix=prefix, settings=FAST)
    record = read_record(outcome.output_path)
    assert record.hash_attrs["threshold"] == 0.5 and record.hash_attrs["top_fraction"] is None
    result = load_result(outcome.output_path, QualityFilterResult)
    assert result.documents_in == planted.normalize_result.documents_out
    assert result.removed[REASON].documents >= 0.9 * len(planted.truth.low_quality)
    assert set(result.quantiles) == {"p10", "p50", "p90"} and result.model_path.endswith(MODEL_FILE)
    check = run_check(filtered.checks[0], outcome.output_path, record.result)
    assert check.passed and f"of {result.documents_in} documents" in check.message
    assert quality_filter_step("curated/planted-quality", data, classifier, threshold=0.6).hash != filtered.hash
