"""Validation suites: a pinned download of held-out sets, tokenized per tokenizer, scored by any run.

Real text: the licence texts every Debian-based Linux ships (`/usr/share/common-licenses`) and
pydoc's topics, served as a dataset repository by the project's hub emulator at a commit.
"""

import gzip
import json
import math
from pathlib import Path

import pytest

from marin_assets import StepDefinitionError, load_result, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.step import walk
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.data.download import Download, DownloadError
from marin_assets.pipeline.data.python_docs import pydoc_topics
from marin_assets.pipeline.evals.loss import EvalResult, loss_eval_step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.tokens.validation_suite import (
    hf_validation_suite,
    unmatched_globs,
    url_validation_suite,
)
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.hub_server import HubRepo, release_hub, serve_hub, use_hub

REPO = "eval-org/held-out"
TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
SHORT = TrainerSpec(num_train_steps=6, train_batch_size=4, checkpoint_every=6, steps_per_eval=3, max_eval_batches=2)
SETS = {"licenses": ["licenses/val/*.jsonl.gz"], "pydoc": ["pydoc/val/*.jsonl.gz"]}


def jsonl_gz(texts) -> bytes:
    return gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode(), mtime=0)


def suite_files() -> dict[str, bytes]:
    licenses = sorted(p for p in Path("/usr/share/common-licenses").iterdir() if p.is_file())
    texts = [p.read_text(errors="replace") for p in licenses][:8]
    topics = [d.text for d in pydoc_topics()][:40]
    assert len(texts) >= 4 and len(topics) >= 20, "real text is there"
    return {"README.md": b"# held-out sets\n",
            "licenses/val/part-0.jsonl.gz": jsonl_gz(texts[:4]), "licenses/val/part-1.jsonl.gz": jsonl_gz(texts[4:]),
            "pydoc/val/part-0.jsonl.gz": jsonl_gz(topics),
            "pydoc/train/ignored.jsonl.gz": jsonl_gz(["not part of the suite"])}


@pytest.fixture(scope="module")
def hub():
    repo = HubRepo(REPO, suite_files())
    with serve_hub(repo) as server, pytest.MonkeyPatch.context() as mp:
        use_hub(mp, server.url)
        yield repo, server
    release_hub()


def test_a_suite_scores_a_training_run_and_an_evaluation_on_every_set(hub, prefix):
    repo, server = hub
    pinned = repo.head
    suite = hf_validation_suite("heldout", REPO, pinned, SETS)
    corpus = corpus_step("raw/stories-vs", train_documents=300, validation_documents=20, seed=3, shards=1)
    tokenizer = bpe_tokenizer_step("tokenizers/stories-vs", corpus, vocab_size=300)
    stories = tokenize_step("tokenized/stories-vs", corpus, tokenizer)
    validation = suite.tokenized(tokenizer)
    assert sorted(validation) == ["heldout-licenses", "heldout-pydoc"]
    train = train_step("checkpoints/vs", {"stories": stories}, TINY, OptimizerSpec(learning_rate=1e-2), SHORT,
                       validation=validation)
    evaluation = loss_eval_step("evals/vs", train, validation, max_eval_batches=2)
    for step in walk([evaluation]):
        materialize_step(step, prefix=prefix)

    # Only the sets' files, at the pinned commit; a later commit to the repository changes nothing.
    download = load_result(suite.download, Download)
    assert download.revision == pinned
    assert sorted(f.path for f in download.files) == ["licenses/val/part-0.jsonl.gz", "licenses/val/part-1.jsonl.gz",
                                                      "pydoc/val/part-0.jsonl.gz"]
    for key, step in validation.items():
        cache = load_result(step, TokenizedCache)
        assert list(cache.splits) == ["validation"] and cache.splits["validation"].tokens > TINY.seq_len, key
    assert load_result(validation["heldout-licenses"], TokenizedCache).splits["validation"].documents == 8

    trained = load_result(train, TrainResult)
    assert set(trained.eval_losses) == {"stories", "heldout-licenses", "heldout-pydoc"}
    assert all(math.isfinite(v) for v in trained.eval_losses.values())
    # The run never trained on the suite: stories' held-out split is easier than licence texts.
    assert trained.eval_losses["stories"] < trained.eval_losses["heldout-licenses"]
    scored = load_result(evaluation, EvalResult)
    assert set(scored.per_dataset) == {"heldout-licenses", "heldout-pydoc"}
    assert all(math.isfinite(scored.per_dataset[k]["bpb"]) for k in scored.per_dataset)

    # One download serves every tokenizer; each tokenizer makes its own caches.
    other = bpe_tokenizer_step("tokenizers/stories-vs-512", corpus, vocab_size=512)
    again = suite.tokenized(other)
    assert {s.deps[0].name_with_hash for s in again.values()} == {suite.download.name_with_hash}
    assert {s.hash for s in again.values()}.isdisjoint({s.hash for s in validation.values()})


def test_identity_follows_the_pinned_commit_and_sets(hub):
    repo, _ = hub
    first = hf_validation_suite("heldout", REPO, repo.head, SETS)
    same = hf_validation_suite("heldout", REPO, repo.head, dict(reversed(list(SETS.items()))))
    assert first.download.hash == same.download.hash
    later = repo.commit({"pydoc/val/part-1.jsonl.gz": jsonl_gz(["one more topic"])}, message="add a part")
    moved = hf_validation_suite("heldout", REPO, later, SETS)
    fewer = hf_validation_suite("heldout", REPO, repo.head, {"pydoc": SETS["pydoc"]})
    assert len({first.download.hash, moved.download.hash, fewer.download.hash}) == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"revision": "main"}, "pin eval-org/held-out to a commit sha, not 'main'"),
    ({"sets": {}}, "has no sets"),
    ({"sets": {"a/b": ["x/*"]}}, "set 'a/b' needs a name without '/'"),
    ({"sets": {"a": []}}, "set 'a' needs a name without '/' and at least one file glob"),
])
def test_a_suite_that_is_not_pinned_or_names_no_files_is_a_definition_error(kwargs, message):
    arguments = {"name": "heldout", "repo_id": REPO, "revision": "a" * 40, "sets": SETS, **kwargs}
    with pytest.raises(StepDefinitionError, match=message.replace("(", r"\(")):
        hf_validation_suite(**arguments)


def test_a_local_suite_and_globs_that_match_nothing(tmp_path, prefix):
    root = tmp_path / "release"
    for path, data in suite_files().items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    sets = {"licenses": ["licenses/val/*"], "pydoc": ["pydoc/val/*"], "typo": ["pydocs/*"]}
    suite = url_validation_suite("local", [f"{root}/*/val/*.jsonl.gz"], sets)
    outcome = materialize_step(suite.download, prefix=prefix)
    files = [f["path"] for f in outcome.record.result["files"]]
    assert "licenses/val/part-1.jsonl.gz" in files and "pydoc/train/ignored.jsonl.gz" not in files
    assert unmatched_globs(suite.sets, files) == {"typo": ["pydocs/*"]}
    (check,) = [c for c in suite.download.checks if c.name == "every_set_has_files"]
    found = run_check(check, outcome.output_path, outcome.record.result)
    assert not found.passed and "{'typo': ['pydocs/*']}" in found.message and check.blocking
    good = url_validation_suite("local", [f"{root}/*/val/*.jsonl.gz"], SETS)
    assert run_check(good.download.checks[-1], outcome.output_path, outcome.record.result).passed

    # Two folders whose files share relative names would overwrite each other: refused before copying.
    clash = url_validation_suite("clash", [str(root / "licenses"), str(root / "pydoc")], sets)
    with pytest.raises(DownloadError, match="would both be copied to 'val/part-0.jsonl.gz'"):
        materialize_step(clash.download, prefix=prefix)
