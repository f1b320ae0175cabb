"""The curation filter seam: every stage that decides per row (heuristics, quality, exact and fuzzy dedup,
decontamination, and a new filter written as docs/extending-curation-filter.md says) driven through the same
assertions on the planted corpus — verdicts align with rows and every removal has a reason, the decision
pickles for Ray tasks, identity is stable and changes with a setting, and the generic step (`filter_step`)
keeps exactly the kept rows and records what it removed per reason."""

from __future__ import annotations

import collections
import functools
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from marin_assets import Step, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.identity import canonical_json
from marin_assets.core.record import load_result, read_record
from marin_assets.pipeline.curation.decontaminate import Decontaminate, EvalSet
from marin_assets.pipeline.curation.exact_dedup import ExactDedup
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step
from marin_assets.pipeline.curation.fuzzy_dedup import FuzzyDedup
from marin_assets.pipeline.curation.heuristics import HeuristicFilter, HeuristicRules
from marin_assets.pipeline.curation.normalize import normalize
from marin_assets.pipeline.curation.quality import QualityFilter
from marin_assets.pipeline.curation.quality_classifier import train_quality_classifier
from marin_assets.pipeline.curation.shards import Shard, list_shards, read_shard
from marin_assets.pipeline.curation.stage import CurationResult
from tests.support.helpers import FAST


@dataclass(frozen=True)
class MinLength(CurationFilter):
    """Removes documents shorter than `chars` characters: a new filter is this much (the recipe's example)."""

    chars: int = 300
    name = "min_length"

    def identity(self) -> dict[str, Any]:
        return {"chars": self.chars}

    def decide(self, table: pa.Table, shard: Shard) -> Verdicts:
        lengths = pc.utf8_length(table.column("text")).to_pylist()
        return Verdicts(["too short" if n < self.chars else None for n in lengths])


def _eval_sets(planted) -> tuple[EvalSet, ...]:
    return tuple(EvalSet(name, planted.step, (f"evalsets/{name}.jsonl",)) for name in planted.truth.eval_sets)


CASES: dict[str, Callable[[SimpleNamespace], tuple[CurationFilter, CurationFilter]]] = {
    # each: (the filter, the same filter with one setting that changes what it keeps changed)
    "heuristics": lambda r: (HeuristicFilter(), HeuristicFilter(HeuristicRules(gopher_stop_words=None))),
    "quality": lambda r: (QualityFilter(r.classifier, threshold=0.5), QualityFilter(r.classifier, threshold=0.6)),
    "exact_dedup": lambda r: (ExactDedup(), ExactDedup(paragraphs=True)),
    "fuzzy_dedup": lambda r: (FuzzyDedup(), FuzzyDedup(threshold=0.9)),
    "fuzzy_dedup_char": lambda r: (FuzzyDedup(shingles="char"), FuzzyDedup(shingles="char", align=False)),
    "decontaminate": lambda r: (Decontaminate(_eval_sets(r.planted)), Decontaminate(_eval_sets(r.planted), ngram=8)),
    "min_length": lambda r: (MinLength(), MinLength(chars=200)),
}


@pytest.fixture(scope="module")
def resources(planted, tmp_path_factory):
    """What the filters read besides the dataset: a quality classifier trained on the planted labeled data."""
    root = tmp_path_factory.mktemp("filters")
    for label in ("positive", "negative"):
        normalize(str(root / label), f"{planted.raw}/labeled/{label}", target_shard_bytes=100_000)
    classifier = train_quality_classifier(str(root / "classifier"), str(root / "positive"), str(root / "negative"),
                                          buckets=20_000)
    return SimpleNamespace(planted=planted, classifier=classifier.path, root=root)


def _copy(source: str, output_path: str) -> None:
    shutil.copytree(source, output_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_work"))


def _dataset(planted) -> Step:
    return Step(name="curated/planted-copy", fn=functools.partial(_copy, planted.normalized),
                hash_attrs={"from": planted.normalized})


@pytest.fixture(scope="module", params=list(CASES))
def ran(request, resources, tmp_path_factory):
    """One filter two ways: prepared and asked for each shard's verdicts, and run as a step by `filter_step`
    through the protocol (its own output and prefix)."""
    planted = resources.planted
    chosen, _ = CASES[request.param](resources)
    root = tmp_path_factory.mktemp(request.param)
    shards = list_shards("test", planted.normalized)
    prepared = chosen.prepare(str(root / "decided"), shards, 1)
    tables = [read_shard("test", shard.path) for shard in shards]
    verdicts = [prepared.decide(table, shard) for shard, table in zip(shards, tables, strict=True)]

    data = _dataset(planted)
    step = filter_step(f"curated/planted-{request.param}", data, chosen)
    prefix = str(root / "outputs")
    materialize_step(data, prefix=prefix, settings=FAST)
    output = materialize_step(step, prefix=prefix, settings=FAST).output_path
    return SimpleNamespace(name=request.param, chosen=chosen, prepared=prepared, shards=shards, tables=tables,
                           verdicts=verdicts, step=step, output=output)


def test_verdicts_align_with_rows_and_every_removal_has_a_reason(ran):
    removed = kept = 0
    for table, v in zip(ran.tables, ran.verdicts, strict=True):
        rows = table.num_rows
        assert len(v.removed) == rows
        assert all(reason is None or (isinstance(reason, str) and reason) for reason in v.removed)
        assert v.texts is None or len(v.texts) == rows
        assert v.modified is None or (len(v.modified) == rows and all(r is None or r for r in v.modified))
        assert all(len(column) == rows for column in v.columns.values())
        assert all(isinstance(n, int) for n in v.counters.values())
        removed += sum(r is not None or (v.modified is not None and v.modified[i] is not None)
                       for i, r in enumerate(v.removed))  # a document removed or cut
        kept += sum(r is None for r in v.removed)
    assert removed and kept, f"{ran.name}: the planted corpus has something to remove and much to keep"


def test_the_prepared_decision_pickles_for_ray_tasks(ran):
    again = pickle.loads(pickle.dumps(ran.prepared))
    assert again.decide(ran.tables[0], ran.shards[0]).removed == ran.verdicts[0].removed


@pytest.mark.parametrize("case", list(CASES))
def test_identity_is_stable_and_changes_with_a_setting(case, planted):
    resources = SimpleNamespace(planted=planted, classifier="/classifiers/quality")
    data = _dataset(planted)
    chosen, changed = CASES[case](resources)
    again, _ = CASES[case](resources)
    assert canonical_json(chosen.identity()) == canonical_json(again.identity())
    assert canonical_json(chosen.identity()) != canonical_json(changed.identity())
    step = filter_step("curated/filtered", data, chosen)
    assert step.hash == filter_step("curated/filtered", data, again).hash
    assert step.hash == filter_step("curated/filtered", data, again, workers=4, max_removed_fraction=0.9).hash
    assert step.hash != filter_step("curated/filtered", data, changed).hash
    assert step.hash_attrs["stage"] == chosen.name and step.kind == "curate"
    assert list(step.deps) == [data, *chosen.deps()]


def test_the_step_keeps_exactly_the_kept_rows_and_counts_removals_per_reason(ran):
    removed: collections.Counter[str] = collections.Counter()
    modified: collections.Counter[str] = collections.Counter()
    for shard, table, v in zip(ran.shards, ran.tables, ran.verdicts, strict=True):
        texts = v.texts if v.texts is not None else table.column("text").to_pylist()
        expected = [(i, t) for i, t, r in zip(table.column("id").to_pylist(), texts, v.removed, strict=True)
                    if r is None]
        written = pq.read_table(shard.output_under(ran.output), columns=["id", "text"])
        assert list(zip(written.column("id").to_pylist(), written.column("text").to_pylist(), strict=True)) == expected
        removed.update(r for r in v.removed if r is not None)
        modified.update(m for m, r in zip(v.modified or (), v.removed, strict=False) if m is not None and r is None)

    result = load_result(ran.output)  # as the type the filter's `result` makes
    assert type(result) is type(ran.prepared.result(CurationResult.of(result)))
    assert result.stage == ran.chosen.name
    assert result.documents_in == sum(t.num_rows for t in ran.tables)
    assert result.documents_out == result.documents_in - sum(removed.values())
    assert {k: r.documents for k, r in result.removed.items() if r.documents} == dict(removed)
    assert {k: r.modified for k, r in result.removed.items() if r.modified} == dict(modified)
    record = read_record(ran.output)
    assert run_check(ran.step.checks[0], ran.output, record.result).passed

