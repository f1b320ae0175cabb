"""fuzzy_dedup on the planted corpus: every planted pair that is truly near (5-gram Jaccard at the threshold)
loses one member, far copies and distinct documents stay; a chain of small edits keeps its far ends; the same
output however it is bucketed or fanned out, after a kill, and through the protocol.

The character path (`shingles="char"`) on real text with planted character noise: noisy copies found where
word 5-grams miss them, distinct documents under Python's own licence kept where Jaccard alone removes them,
through Dagster; punctuation normalisation; identities and bad parameters."""

import functools
import gzip
import json
import random
import re
import shutil
import sys
import unicodedata
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from marin_assets import Step, StepDefinitionError, build_definitions, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.pipeline.curation.fuzzy_dedup import (
    ALGORITHM,
    CHAR_DEFAULTS,
    REASON,
    SAMPLE,
    FuzzyDedup,
    FuzzyDedupResult,
    fuzzy_dedup,
    fuzzy_dedup_step,
)
from marin_assets.pipeline.curation.noisy_copies import RATES, add_noise, boilerplate, noisy_corpus, score
from marin_assets.pipeline.curation.normalize import normalize, normalize_step
from marin_assets.pipeline.curation.shards import CurationError, list_shards, write_shard
from marin_assets.pipeline.curation.shingles import char_ngram_hashes, normalize_punctuation
from tests.support.curation import documents, id_counts, kill_when
from tests.support.helpers import FAST, subprocess_env

THRESHOLD = 0.8
WORD = re.compile(r"[a-z0-9\u0080-\U0010ffff]+")


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """Word 5-grams as `ngrams` defines words (runs of ASCII letters and digits, or of non-ASCII), computed on
    the words themselves, not their hashes: an independent reference for the stage's Jaccard."""
    words = WORD.findall(text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def similarity(a: str, b: str) -> float:
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


@pytest.fixture(scope="module")
def corpus(planted):
    """The planted corpus in input order: texts by id and each id's first position (the stage's key order)."""
    rows = documents(planted.normalized)
    first: dict[str, int] = {}
    for position, row in enumerate(rows):
        first.setdefault(row["id"], position)
    return {"text": {row["id"]: row["text"] for row in rows}, "first": first, "count": len(rows)}


@pytest.fixture(scope="module")
def deduped(planted, tmp_path_factory):
    """Fuzzy dedup of the planted corpus with the defaults, run once for the module: (output path, result)."""
    out = str(tmp_path_factory.mktemp("fuzzy-dedup") / "out")
    return out, fuzzy_dedup(out, planted.normalized)


def near_pairs(planted, corpus, far: bool) -> list[tuple[object, float]]:
    return [(n, similarity(corpus["text"][n.original], corpus["text"][n.copy]))
            for n in planted.truth.near_duplicates if n.far is far]


def test_every_truly_near_planted_pair_loses_one_member(planted, corpus, deduped):
    out, result = deduped
    counts = id_counts(out)
    pairs = near_pairs(planted, corpus, far=False)
    near = [n for n, j in pairs if j >= THRESHOLD]
    missed = [(n.edits, n.words) for n in near if counts[n.original] + counts[n.copy] != 1]
    assert not missed, f"planted pairs at Jaccard >= {THRESHOLD} left whole: {missed}"
    # Every copy with 1 or 2 of its words replaced is that near, and each edit count has a copy that is
    # (`planted.GRAMS_PER_EDIT`); with 4, only documents long enough are (4 edits touch up to 20 5-grams: a
    # document of 90 distinct 5-grams keeps Jaccard 0.64), so some are below.
    assert all(j >= THRESHOLD for n, j in pairs if n.edits <= 2)
    assert {n.edits for n in near} >= {1, 2, 4, 8}
    below = [(n.edits, n.words, round(j, 3)) for n, j in pairs if n.edits <= 4 and j < THRESHOLD]
    print(f"\nrecall at {THRESHOLD}: {len(near)}/{len(near)} truly near pairs; planted pairs with <= 4 edits"
          f" below the threshold (edits, words, Jaccard): {below}")


def test_every_edit_up_to_four_words_is_found_with_a_lower_threshold_and_steeper_bands(planted, corpus, tmp_path):
    out = str(tmp_path / "out")
    result = fuzzy_dedup(out, planted.normalized, threshold=0.55, num_perm=120, bands=30)
    counts = id_counts(out)
    pairs = near_pairs(planted, corpus, far=False)
    assert [n.edits for n, _ in pairs if n.edits <= 4 and counts[n.original] + counts[n.copy] != 1] == []
    for n, _ in near_pairs(planted, corpus, far=True):
        assert counts[n.original] >= 1 and counts[n.copy] == 1, f"far copy ({n.edits} of {n.words} words)"
    members = {doc_id for n, _ in pairs for doc_id in (n.original, n.copy)}
    assert all(counts[doc_id] == 1 for doc_id in id_counts(planted.normalized) if doc_id not in members)
    assert result.verified_pairs <= result.candidate_pairs


def test_far_copies_and_distinct_documents_stay_and_every_removal_is_a_planted_twin(planted, corpus, deduped):
    out, result = deduped
    counts = id_counts(out)
    truth = planted.truth
    for n, j in near_pairs(planted, corpus, far=True):
        assert j < 0.1 and counts[n.original] >= 1 and counts[n.copy] == 1, f"far copy ({n.edits}/{n.words})"
    later_member = set()
    for n, j in near_pairs(planted, corpus, far=False):
        if j >= THRESHOLD:
            later_member.add(max((n.original, n.copy), key=corpus["first"].get))
    for base in truth.base_ids:
        assert counts[base] == (0 if base in later_member else 1), base
    inputs = id_counts(planted.normalized)
    for doc_id, count in inputs.items():
        if doc_id not in later_member:
            assert counts[doc_id] == 1, f"{doc_id} ({count} in the input) is not the later member of a planted pair"
    assert result.removed == {REASON: result.removed[REASON]}
    assert result.removed[REASON].documents == corpus["count"] - sum(counts.values()) == result.documents_in - \
        result.documents_out
    print(f"\nprecision: {sum(counts.values())} kept of {corpus['count']}; removed only later members of planted"
          f" pairs and extra exact copies ({len(later_member)} pairs, {result.removed[REASON].documents} removed)")


def test_exact_duplicates_are_near_duplicates_and_the_clusters_and_sample_are_auditable(planted, corpus, deduped):
    out, result = deduped
    counts = id_counts(out)
    twins = {n.original for n, j in near_pairs(planted, corpus, far=False) if j >= THRESHOLD}
    for doc_id, copies in planted.truth.exact_duplicates.items():
        assert counts[doc_id] == 1 or (counts[doc_id] == 0 and doc_id in twins), (doc_id, copies)
    extra_copies = sum(c - 1 for c in planted.truth.exact_duplicates.values())
    assert result.removed[REASON].documents >= extra_copies
    assert sum(result.cluster_sizes.values()) == result.clusters
    assert max(map(int, result.cluster_sizes)) == result.largest_cluster
    assert result.largest_cluster >= max(planted.truth.exact_duplicates.values())
    in_clusters = sum(int(size) * n for size, n in result.cluster_sizes.items())
    assert in_clusters == result.clusters + result.removed[REASON].documents, "each cluster keeps exactly one here"
    assert result.verified_pairs <= result.candidate_pairs
    assert 0 < len(result.removed_sample) <= SAMPLE
    assert any(p.jaccard == 1.0 and p.removed_id == p.kept_id for p in result.removed_sample)
    kept = id_counts(out)
    for pair in result.removed_sample:
        assert pair.jaccard >= THRESHOLD and kept[pair.kept_id] == 1
        a, b = corpus["text"][pair.kept_id], corpus["text"][pair.removed_id]
        assert abs(similarity(a, b) - pair.jaccard) < 1e-3
        assert " ".join(b.split()).startswith(pair.removed_snippet) and len(pair.removed_snippet) <= 200
        assert pair.removed_source != pair.kept_source
    least = min(p.jaccard for p in result.removed_sample)
    print(f"\nclusters {result.clusters}, sizes {result.cluster_sizes}; candidates {result.candidate_pairs},"
          f" verified {result.verified_pairs}; least similar removal in the sample: {least}")


def test_a_chain_of_small_edits_keeps_documents_and_every_removal_has_a_kept_twin(planted, corpus, tmp_path):
    base = min((corpus["text"][i] for i in planted.truth.base_ids), key=lambda t: (abs(len(t.split(" ")) - 300), t))
    words = base.split(" ")
    assert len(words) > 250
    rng = random.Random(7)
    positions = rng.sample([i for i, w in enumerate(words) if w.strip()], 24)
    chain = [base]
    for step in range(12):  # 2 more words replaced at each link: neighbours ~0.93, the ends far apart
        for i in positions[2 * step:2 * step + 2]:
            words[i] = f"chainword{step}x{i}"
        chain.append(" ".join(words))
    assert all(similarity(a, b) >= 0.85 for a, b in zip(chain, chain[1:], strict=False))
    assert similarity(chain[0], chain[-1]) < 0.6
    raw = tmp_path / "raw" / "train"
    raw.mkdir(parents=True)
    with gzip.open(raw / "part.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in chain)
    normalize(str(tmp_path / "data"), str(tmp_path / "raw"), target_shard_bytes=6_000)
    assert len(list_shards("test", str(tmp_path / "data"))) > 2, "the chain crosses shards"
    result = fuzzy_dedup(str(tmp_path / "out"), str(tmp_path / "data"))
    kept = [row["text"] for row in documents(str(tmp_path / "out"))]
    removed = [t for t in chain if t not in kept]
    assert len(kept) > 1 and removed, f"kept {len(kept)} of {len(chain)}"
    for text in removed:
        assert max(similarity(text, k) for k in kept) >= THRESHOLD
    assert result.largest_cluster == len(chain), "the whole chain is one cluster of verified pairs"
    assert result.documents_out == len(kept)
    print(f"\nchain of {len(chain)}: kept {len(kept)}, removed {len(removed)}; ends at Jaccard"
          f" {similarity(chain[0], chain[-1]):.2f}, cluster of {result.largest_cluster}")


def test_the_output_is_deterministic_and_does_not_depend_on_buckets(planted, deduped, tmp_path):
    out, result = deduped
    again = str(tmp_path / "again")
    assert fuzzy_dedup(again, planted.normalized, buckets=5) == FuzzyDedupResult(**{**result.__dict__, "path": again})
    assert documents(again) == documents(out)
    before = {p: p.stat().st_mtime_ns for p in Path(again, "_work").rglob("*.json")}
    assert fuzzy_dedup(again, planted.normalized, buckets=5).documents_out == result.documents_out
    assert {p: p.stat().st_mtime_ns for p in before} == before, "a rerun reads the finished work"
    explicit = str(tmp_path / "explicit")  # the new options, set to what the word path did before them
    assert fuzzy_dedup(explicit, planted.normalized, shingles="word", normalize_punctuation=False, window=0) == \
        FuzzyDedupResult(**{**result.__dict__, "path": explicit})
    assert documents(explicit) == documents(out)


def test_identity_follows_the_algorithm_not_buckets_or_workers(planted):
    step = fuzzy_dedup_step("curated/fuzzy", planted.step)
    assert fuzzy_dedup_step("curated/fuzzy", planted.step, buckets=64, workers=8).hash == step.hash
    for change in ({"threshold": 0.7}, {"ngram": 3}, {"num_perm": 260}, {"bands": 22}, {"seed": 2}):
        assert fuzzy_dedup_step("curated/fuzzy", planted.step, **change).hash != step.hash, change
    assert step.hash_attrs["algorithm"]["signature"].startswith("rensa.RMinHash-v")
    with pytest.raises(StepDefinitionError, match=r"fuzzy_dedup step 'curated/fuzzy': num_perm 100 must be a"
                                                  r" positive multiple of bands 26"):
        fuzzy_dedup_step("curated/fuzzy", planted.step, num_perm=100)
    with pytest.raises(ValueError, match=r"^fuzzy_dedup: threshold must be in \(0, 1\], got 1.5"):
        fuzzy_dedup("/nowhere", planted.normalized, threshold=1.5)


def test_two_workers_on_ray_give_the_same_output(planted, deduped, local_ray, tmp_path):
    out, result = deduped
    fanned = str(tmp_path / "fanned")
    assert fuzzy_dedup(fanned, planted.normalized, workers=2) == FuzzyDedupResult(**{**result.__dict__,
                                                                                      "path": fanned})
    assert documents(fanned) == documents(out)
    assert list(Path(fanned, "_work", "bands").glob("*.claim")), "the items went through Ray's fan-out claims"


SLOW_VERIFY = """
import time
from marin_assets.pipeline.curation import fuzzy_dedup as fd
verify = fd.verify_shard
def slow(*args):
    outcome = verify(*args)
    time.sleep(0.3)  # a slow worker: the kill lands between verification tasks
    return outcome
fd.verify_shard = slow
fd.fuzzy_dedup({out!r}, {data!r})
"""


def test_a_killed_run_resumes_without_redoing_finished_work(planted, deduped, tmp_path):
    whole, result = deduped
    out = tmp_path / "out"
    work = out / "_work"
    first = sorted(Path(whole, "_work", "verified").glob("*.json"))[0].name
    kill_when([sys.executable, "-c", SLOW_VERIFY.format(out=str(out), data=planted.normalized)],
              str(work / "verified" / first), env=subprocess_env())
    shards = list_shards("test", planted.normalized)
    assert len(list((work / "bands").glob("*.json"))) == len(shards)
    assert len(list((work / "candidates").glob("*.json"))) == 16
    assert not (work / "clusters" / "all.json").exists(), "killed part-way, before clustering"
    finished = {p: p.stat().st_mtime_ns for phase in ("bands", "candidates", "sets", "verified")
                for p in (work / phase).glob("*.json")}
    assert any("sets" in str(p) for p in finished)
    resumed = fuzzy_dedup(str(out), planted.normalized)
    assert {p: p.stat().st_mtime_ns for p in finished} == finished, "finished outcomes were not redone"
    assert documents(str(out)) == documents(whole)
    assert resumed == FuzzyDedupResult(**{**result.__dict__, "path": str(out)})


def test_bad_input_names_the_stage_and_the_file(planted, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(planted.normalized, data, ignore=shutil.ignore_patterns("_work"))
    corrupt = list_shards("test", str(data))[2].path
    Path(corrupt).write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CurationError, match=rf"^fuzzy_dedup: shard {re.escape(corrupt)} is unreadable: "):
        fuzzy_dedup(str(tmp_path / "out"), str(data))
    with pytest.raises(CurationError, match=r"^fuzzy_dedup: .*/raw holds no normalized shards"):
        fuzzy_dedup(str(tmp_path / "out2"), planted.raw)
    sourceless = tmp_path / "sourceless" / "train" / "part-00000.parquet"
    write_shard(pa.table({"id": ["a"], "text": ["some words to hash here"]}), str(sourceless))
    with pytest.raises(CurationError, match=rf"^fuzzy_dedup: shard {re.escape(str(sourceless))} .*\bsource\b"):
        fuzzy_dedup(str(tmp_path / "out3"), str(tmp_path / "sourceless"))


def _copy_dataset(source: str, output_path: str) -> None:
    shutil.copytree(source, output_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_work"))


def test_the_step_through_the_protocol_records_its_clusters_and_passes_its_check(planted, deduped, prefix):
    _, result = deduped
    data = Step(name="curated/planted-copy", fn=functools.partial(_copy_dataset, planted.normalized),
                hash_attrs={"from": planted.normalized})
    step = fuzzy_dedup_step("curated/planted-fuzzy-dedup", data, buckets=4)
    materialize_step(data, prefix=prefix, settings=FAST)
    outcome = materialize_step(step, prefix=prefix, settings=FAST)
    record = read_record(outcome.output_path)
    assert record.result["removed"][REASON]["documents"] == result.removed[REASON].documents
    for field in ("candidate_pairs", "verified_pairs", "clusters", "largest_cluster", "cluster_sizes"):
        assert record.result[field] == getattr(result, field), field
    typed = load_result(outcome.output_path, FuzzyDedupResult)
    assert typed.removed_sample == result.removed_sample and typed.removed_sample[0].kept_source.startswith("train/")
    check = run_check(step.checks[0], outcome.output_path, record.result)
    assert check.passed and f"of {record.result['documents_in']} documents" in check.message
    assert not run_check(fuzzy_dedup_step("curated/planted-fuzzy-dedup", data, max_removed_fraction=0.05).checks[0],
                         outcome.output_path, record.result).passed


# --- the character path: noisy copies, boilerplate, punctuation ---

NOISY_COPIES = 40
"""Base documents copied with character noise (the rates of `noisy_copies.RATES` in turn), and as many other
base documents headed by Python's licence or its PSF section: a small corpus, fast on both paths."""


@pytest.fixture(scope="module")
def noisy(planted, corpus):
    """Real documentation (the planted corpus's distinct base documents) with noisy copies and boilerplate."""
    texts = [corpus["text"][doc_id] for doc_id in planted.truth.base_ids[:2 * NOISY_COPIES]]
    return noisy_corpus(texts, NOISY_COPIES, NOISY_COPIES, seed=3)


def _write_raw(texts: list[str], output_path: str) -> None:
    folder = Path(output_path, "train")
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "part-00000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in texts)


@pytest.mark.parametrize(("text", "expected"), [
    ("“Don’t” — he said…", "don t he said"),
    ("Don't -- he said...", "don t he said"),
    ("l’état\u00a0de l‘art", "l état de l art"),  # curly apostrophes, a non-breaking space
    ("naïve café – pages 2–3 «cited»", "naïve café pages 2 3 cited"),
    ("snake_case\tand\n\nlines", "snake case and lines"),
    ("cafe\u0301 x", "cafe\u0301 x"),  # a combining accent belongs to its word
    ("Привет, мир! 你好，世界。", "привет мир 你好 世界"),
    ("© 2024 ™ → ok 😀", "2024 ok"),
    ("  …  ", ""),
    ("nul\x00inside", "nul inside"),
    ("", ""),
])
def test_punctuation_normalisation_folds_quotes_dashes_symbols_and_spaces(text, expected):
    assert normalize_punctuation([text]) == [expected]
    assert normalize_punctuation(["x", text, "y"]) == ["x", expected, "y"], "texts stay apart in a batch"


def test_character_shingles_are_the_distinct_substrings_of_the_normalised_text(noisy):
    text = normalize_punctuation([noisy.texts[0]])[0]
    hashes, offsets = char_ngram_hashes([text, text[10:], "short", "short", ""], 7)
    whole, suffix = (set(hashes[offsets[i]:offsets[i + 1]].tolist()) for i in (0, 1))
    assert len(whole) == len({text[i:i + 7] for i in range(len(text) - 6)}), "one hash per distinct 7-gram"
    assert suffix <= whole and len(whole - suffix) >= 1
    start = offsets[2]
    assert list(offsets[2:]) == [start, start + 1, start + 2, start + 2], "a short text: one hash; an empty one none"
    assert hashes[offsets[2]] == hashes[offsets[3]] and hashes[offsets[2]] not in whole


def test_the_char_path_through_dagster_finds_noisy_copies_and_keeps_documents_sharing_a_licence(
        noisy, tmp_path, prefix, local_ray, dagster_home):
    # the premise: character noise at a few percent leaves word 5-grams far below any useful threshold
    pairs = {(o, c): rate for o, c, rate in noisy.copies}
    originals = dict(zip([o for o, _, _ in noisy.copies], noisy.texts[:NOISY_COPIES], strict=True))
    copies = dict(zip([c for _, c, _ in noisy.copies], noisy.texts[NOISY_COPIES:2 * NOISY_COPIES], strict=True))
    word_jaccard = sorted(similarity(originals[o], copies[c]) for o, c in pairs)
    assert word_jaccard[len(word_jaccard) // 2] < 0.5, word_jaccard

    raw = Step(name="raw/noisy-copies", fn=functools.partial(_write_raw, noisy.texts),
               hash_attrs={"documents": len(noisy.texts), "seed": 3})
    data = normalize_step("curated/noisy-copies", raw, target_shard_bytes=60_000)
    step = fuzzy_dedup_step("curated/noisy-copies-fuzzy-char", data, shingles="char")
    result = build_definitions([step]).resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.get())
    assert result.success
    assert len(list_shards("test", data.output_path)) > 3, "pairs cross shards"
    metadata = {e.asset_key.to_user_string(): e for e in result.get_asset_materialization_events()}[step.name]
    assert [r.data["name"] for r in metadata.materialization.metadata["result.removed"].records] == [REASON]
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert checks[(step.name, "removed_fraction_within")] is True

    kept = id_counts(step.output_path)
    char = score(noisy, kept)
    assert char.recall >= 0.9 and min(char.recall_by_rate.values()) >= 0.8, char
    assert char.false_removals <= 0.01, char
    copy_ids = {c for _, c, _ in noisy.copies}
    assert all(kept[doc_id] == 1 for doc_id in id_counts(data.output_path) if doc_id not in copy_ids), \
        "only noisy copies go: every original and every document under the licence stays"
    recorded = load_result(step.output_path, FuzzyDedupResult)
    assert recorded.removed[REASON].documents == round(char.recall * char.copies)

    # the word path on the same shards: blind to the noise, and Jaccard alone falls for the shared licence
    word = score(noisy, id_counts(fuzzy_dedup(str(tmp_path / "word"), data.output_path).path))
    assert word.recall <= 0.25 and word.false_removals >= 0.2, word
    print(f"\nnoisy copies (rates {list(RATES)}): char recall {char.recall:.3f} {char.recall_by_rate}, false removals"
          f" {char.false_removals:.3f} of {char.distinct}; word recall {word.recall:.3f}, false removals"
          f" {word.false_removals:.3f}; word 5-gram Jaccard of the copies: median"
          f" {word_jaccard[len(word_jaccard) // 2]:.2f}")


def test_the_char_path_on_the_planted_corpus_removes_only_planted_twins(planted, corpus, tmp_path):
    out = str(tmp_path / "out")
    fuzzy_dedup(out, planted.normalized, shingles="char")
    counts = id_counts(out)
    near = [n for n in planted.truth.near_duplicates if not n.far]
    assert [n.edits for n in near if counts[n.original] + counts[n.copy] != 1] == [], \
        "every copy with 1 to 8 words replaced is found (the word path finds those of 1 or 2)"
    for n in planted.truth.near_duplicates:
        if n.far:
            assert counts[n.original] >= 1 and counts[n.copy] == 1, f"far copy ({n.edits} of {n.words} words)"
    members = {doc_id for n in near for doc_id in (n.original, n.copy)}
    for doc_id, count in id_counts(planted.normalized).items():
        if doc_id not in members:
            assert counts[doc_id] == 1, f"{doc_id} ({count} in the input) is not a member of a planted pair"


def test_punctuation_normalisation_lets_the_word_path_see_typographic_variants(planted, corpus, tmp_path):
    def typeset(text: str) -> str:
        return text.replace("'", "’").replace('"', "”").replace("--", "—").replace(" - ", "—")

    bases = [corpus["text"][doc_id] for doc_id in planted.truth.base_ids]
    original = min(bases, key=lambda t: (similarity(t, typeset(t)), t))
    variant = typeset(original)
    assert similarity(original, variant) < THRESHOLD, "curly quotes and dashes glue words together"
    assert normalize_punctuation([original]) == normalize_punctuation([variant])
    others = [t for t in bases if t != original][:6]
    raw = tmp_path / "raw"
    _write_raw([original, *others, variant], str(raw))
    normalize(str(tmp_path / "data"), str(raw))
    default = id_counts(fuzzy_dedup(str(tmp_path / "default"), str(tmp_path / "data")).path)
    folded = id_counts(fuzzy_dedup(str(tmp_path / "folded"), str(tmp_path / "data"), normalize_punctuation=True).path)
    assert sum(default.values()) == 8 and sum(folded.values()) == 7
    assert set(default) - set(folded) == {list(id_counts(str(tmp_path / "data")))[-1]}, "the later variant goes"


def test_the_word_default_keeps_its_identity_and_every_new_option_changes_it(planted):
    default = FuzzyDedup()
    assert set(default.identity()) == {"ngram", "num_perm", "bands", "threshold", "seed", "algorithm"}
    assert {k: v for k, v in default.identity()["algorithm"].items() if k != "signature"} == \
        {k: v for k, v in ALGORITHM.items() if k != "signature"}
    explicit = {"shingles": "word", "normalize_punctuation": False, "window": 0, "align": False, "ngram": 5,
                "num_perm": 286, "bands": 26, "threshold": 0.8}
    assert FuzzyDedup(**explicit).identity() == default.identity()
    char = FuzzyDedup(shingles="char")
    assert char.identity() == FuzzyDedup(shingles="char", **CHAR_DEFAULTS).identity()
    assert char.identity()["algorithm"]["normalize"].endswith(f"unicode-{unicodedata.unidata_version}")
    variants = [{}, {"shingles": "char"}, {"normalize_punctuation": True}, {"window": 20},
                {"shingles": "char", "normalize_punctuation": False}, {"shingles": "char", "ngram": 6},
                {"shingles": "char", "align": False, "window": 100}, {"shingles": "char", "threshold": 0.5},
                {"align": True}, {"shingles": "char", "window": 100}]
    hashes = [fuzzy_dedup_step("curated/fuzzy", planted.step, **kw).hash for kw in variants]
    assert len(set(hashes)) == len(variants)
    assert fuzzy_dedup_step("curated/fuzzy", planted.step, **explicit).hash == hashes[0]


def test_bad_shingle_parameters_are_named(planted):
    for ngram in (2, 33):
        with pytest.raises(StepDefinitionError, match=rf"^fuzzy_dedup step 'curated/fuzzy': a character n-gram must"
                                                      rf" be 3 to 32 characters, got {ngram} \(below 3 every text"):
            fuzzy_dedup_step("curated/fuzzy", planted.step, shingles="char", ngram=ngram)
    with pytest.raises(StepDefinitionError, match=r"shingles must be one of 'word', 'char', got 'bytes'"):
        fuzzy_dedup_step("curated/fuzzy", planted.step, shingles="bytes")
    with pytest.raises(ValueError, match=r"^fuzzy_dedup: window must be 0 \(no window check\) or a number of"):
        fuzzy_dedup("/nowhere", planted.normalized, window=-1)
    assert fuzzy_dedup_step("curated/fuzzy", planted.step, ngram=40).hash_attrs["ngram"] == 40, "words: no limit"


def test_noise_edits_about_its_rate_of_characters(noisy):
    import difflib

    text = noisy.texts[1]
    for rate in RATES:
        copy = add_noise(text, rate, random.Random(0))
        changed = 1 - difflib.SequenceMatcher(None, text, copy, autojunk=False).ratio()
        assert rate / 3 < changed < rate * 3, (rate, changed)
    assert set(boilerplate()) == {"licence", "header"} and len(boilerplate()["licence"]) > 5 * 860
