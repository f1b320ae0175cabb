"""Hub upload in bounded commits, and pretokenized download from the Hub, with the real
`huggingface_hub` client against the project's Hub emulator (tests/support/hub_server.py).

The round trip is a whole pipeline: a tokenize step's cache is uploaded, downloaded again by a
pretokenized step, trained on, exported, and the export uploaded; every download is compared
byte for byte with what was uploaded. An upload cut off by a hub outage resumes without a
duplicate commit, and the token reaches the hub on every write but no record, log or message.
"""

import hashlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from marin_assets import load_result, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.data.download import download_hf
from marin_assets.pipeline.data.hub_upload import (
    BRANCH_HOLDS_FILES,
    HubUpload,
    HubUploadError,
    hub_upload_step,
    upload_to_hub,
)
from marin_assets.pipeline.tokens.pretokenized import pretokenized_step
from marin_assets.pipeline.tokens.tokenize import TokenizedCache, TokenizerMismatchError, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.export import export_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support import hub_upload_worker
from tests.support.helpers import FAST, ROOT, output_files, subprocess_env, wait_for
from tests.support.hub_server import HubRepo, release_hub, serve_hub, use_hub

TOKEN = "hf_uploadSecretQz7Wx3Lk9Vb2Nm4Rt6"
TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
BRIEF = TrainerSpec(num_train_steps=2, train_batch_size=2, checkpoint_every=100, steps_per_eval=100, max_eval_batches=1)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tokenizer and its tokenized cache, materialized as steps: their outputs hold `.status.json`
    and `.artifact.json` beside the data, as every real step output does."""
    prefix = str(tmp_path_factory.mktemp("hub") / "outputs")
    corpus = corpus_step("raw/hub", train_documents=300, validation_documents=30, seed=1, shards=2)
    tokenizer = bpe_tokenizer_step("tokenizers/hub-bpe", corpus, vocab_size=400)
    tokenized = tokenize_step("tokenized/hub-bpe", corpus, tokenizer)
    for step in (corpus, tokenizer, tokenized):
        materialize_step(step, prefix=prefix)
    return SimpleNamespace(prefix=prefix, tokenizer=tokenizer, tokenized=tokenized,
                           cache=tokenized.output_path_under(prefix))


@pytest.fixture
def hub(monkeypatch):
    """The emulator, accepting writes with TOKEN only; huggingface_hub pointed at it with HF_TOKEN=TOKEN."""
    with serve_hub(write_tokens={TOKEN}) as server:
        use_hub(monkeypatch, server.url, token=TOKEN)
        yield server
        assert not server.errors, server.errors[0]
    release_hub()


def lfs_puts(hub) -> list[str]:
    """The sha256 of every LFS object sent, one per PUT."""
    return [r.path.split("/lfs-upload/", 1)[1].split("?", 1)[0] for r in hub.requests if r.method == "PUT"]


def test_a_cache_round_trips_through_the_hub_trains_and_its_export_uploads(made, hub, tmp_path):
    from huggingface_hub import HfApi, snapshot_download

    cache_files = output_files(made.cache)
    upload = hub_upload_step("uploads/hub-cache", made.tokenized, "user/hub-cache", branch="v1", repo_type="dataset",
                             max_commit_files=3)
    outcome = materialize_step(upload, prefix=made.prefix)
    result = load_result(outcome.output_path, HubUpload)

    # ceil(13 files / 3 per commit) commits on top of the new repository's initial commit; none holds more
    # than 3 files, each file is in exactly one, in path order, and no hidden bookkeeping file went up.
    expected = math.ceil(len(cache_files) / 3)
    assert len(cache_files) == 13 and len(result.commits) == expected == 5
    history = [c.commit_id for c in HfApi().list_repo_commits("user/hub-cache", repo_type="dataset", revision="v1")]
    assert history[:-1] == result.commits[::-1] and len(history) == expected + 1
    repo = hub.repos[("dataset", "user/hub-cache")]
    batches = [repo.changed_paths(sha) for sha in result.commits]
    assert all(len(b) <= 3 for b in batches) and sum(batches, []) == sorted(cache_files)
    assert set(repo.files("v1")) == {*cache_files, ".gitattributes"}
    assert result.revision == repo.branches["v1"] and result.files_uploaded == 13 and result.files_skipped == 0
    assert result.bytes_uploaded == sum(len(b) for b in cache_files.values())
    assert all(url.endswith(f"/datasets/user/hub-cache/commit/{sha}") for url, sha in
               zip(result.commit_urls, result.commits, strict=True))
    assert run_check(BRANCH_HOLDS_FILES, outcome.output_path, outcome.record.result).passed

    # A re-run uploads nothing: every file is on the branch with this content.
    commits_before, puts_before = hub.api_commits, len(lfs_puts(hub))
    again = upload_to_hub(str(tmp_path / "again"), made.cache, "user/hub-cache", "v1", "dataset", max_commit_files=3)
    assert (again.commits, again.files_uploaded, again.bytes_uploaded) == ([], 0, 0)
    assert again.files_skipped == 13 and again.revision == result.revision
    assert (hub.api_commits, len(lfs_puts(hub))) == (commits_before, puts_before)

    # Downloaded again, by snapshot_download and by a pretokenized step: byte for byte what was uploaded.
    snapshot = snapshot_download("user/hub-cache", repo_type="dataset", revision="v1", local_dir=tmp_path / "snap")
    assert output_files(snapshot) == cache_files
    copied = pretokenized_step("tokenized/hub-copy", "user/hub-cache", made.tokenizer, revision=result.revision)
    got = materialize_step(copied, prefix=made.prefix)
    assert output_files(got.output_path) == cache_files
    cache = load_result(got.output_path, TokenizedCache)
    original = load_result(made.cache, TokenizedCache)
    assert cache.splits == original.splits and cache.tokenizer_fingerprint == original.tokenizer_fingerprint
    assert cache.backend_reason == f"downloaded from hf://datasets/user/hub-cache@{result.revision}"

    # The downloaded cache is a training component like any other; its export goes up to a model repo.
    train = train_step("checkpoints/hub-llama", {"stories": copied}, TINY, OptimizerSpec(learning_rate=1e-2), BRIEF)
    materialize_step(train, prefix=made.prefix)
    trained = load_result(train.output_path_under(made.prefix), TrainResult)
    assert trained.steps == 2 and all(math.isfinite(loss) for _, loss in trained.loss_curve)
    export = export_step("exports/hub-llama", train)
    exported = output_files(materialize_step(export, prefix=made.prefix).output_path)
    weights = len(exported["model.safetensors"])
    before = [p for p in sorted(exported) if p < "model.safetensors"]
    after = [p for p in sorted(exported) if p > "model.safetensors"]
    assert sum(len(exported[p]) for p in before + after) < weights - 1  # only the weights exceed the byte bound
    model_upload = hub_upload_step("uploads/hub-llama", export, "user/hub-llama", max_commit_files=2,
                                   max_commit_bytes=weights - 1)
    uploaded = load_result(materialize_step(model_upload, prefix=made.prefix).output_path, HubUpload)
    # The weights alone; the small files in pairs on either side of them, in path order: config.json |
    # model.safetensors | tokenizer.json, tokenizer_config.json (transformers 5 writes no special_tokens_map.json).
    assert len(uploaded.commits) == math.ceil(len(before) / 2) + 1 + math.ceil(len(after) / 2) == 3
    model_repo = hub.repos[("model", "user/hub-llama")]
    assert [model_repo.changed_paths(sha) for sha in uploaded.commits][1] == ["model.safetensors"]
    model_dir = snapshot_download("user/hub-llama", local_dir=tmp_path / "model")
    assert output_files(model_dir) == exported


def test_an_interrupted_upload_resumes_without_duplicate_commits(made, hub):
    cache_files = output_files(made.cache)
    upload = hub_upload_step("uploads/resumed", made.tokenized, "user/resumed", repo_type="dataset",
                             max_commit_files=3)
    hub.fail_commits_after = 2  # the hub goes down after two commits
    with pytest.raises(HubUploadError) as failed:
        materialize_step(upload, prefix=made.prefix)
    message = "\n".join([str(failed.value), *getattr(failed.value, "__notes__", [])])
    assert "dataset user/resumed@main: commit 3 of 5 (3 files, " in message
    assert "the hub answered 503 (Service Unavailable (an emulated outage)); run the step again to resume" in message
    assert "(while materializing step 'uploads/resumed'" in message
    out = upload.output_path_under(made.prefix)
    assert read_status(out).status is Status.FAILED
    with pytest.raises(RecordNotAvailableError):
        read_record(out)
    repo = hub.repos[("dataset", "user/resumed")]
    assert len(repo.history(repo.head)) == 1 + 2
    sent_before = lfs_puts(hub)

    hub.fail_commits_after = None  # back up: the next materialization runs again (FAILED) and resumes
    result = load_result(materialize_step(upload, prefix=made.prefix).output_path, HubUpload)
    assert len(result.commits) == 3 and (result.files_skipped, result.files_uploaded) == (6, 7)
    history = repo.history(repo.head)
    assert len(history) == 1 + 5
    changed = [p for c in history[:-1] for p in repo.changed_paths(c.sha)]
    assert sorted(changed) == sorted(cache_files)  # every file committed exactly once
    assert repo.files() == {**cache_files, ".gitattributes": repo.files()[".gitattributes"]}
    # LFS objects of the commit that failed had reached the hub: none was sent twice.
    sent = lfs_puts(hub)
    assert len(sent) == len(set(sent)) and len(sent_before) < len(sent)


@pytest.mark.parametrize("moment", ["mid-transfer", "commit-in-flight"])
def test_an_upload_killed_mid_way_leaves_no_success_and_its_retry_completes_the_repo(hub, tmp_path, moment):
    """SIGKILL the process uploading, at a moment the hub emulator holds for it: part-way through sending the
    large LFS file (after its first MiB arrived), or with a commit fully sent but not yet applied (it lands
    after its sender died). No success is recorded; the retry takes the dead attempt's lease over, sends only
    what the branch lacks, and the repo ends holding exactly the source, every file committed once."""
    prefix = str(tmp_path / "outputs")
    repo_id = f"user/killed-{moment}"
    source = materialize_step(hub_upload_worker.source_step(), prefix=prefix, settings=FAST)
    source_files = output_files(source.output_path)
    big_sha = hashlib.sha256(source_files["big.bin"]).hexdigest()
    if moment == "mid-transfer":
        hub.pause_puts_after = 2**20
    else:
        hub.hold_commits_after = 1  # the commit after the first: big.bin and c.txt, its LFS object already sent
    held = hub.put_paused if moment == "mid-transfer" else hub.commit_held
    log = tmp_path / "worker.log"
    with open(log, "w") as sink:
        worker = subprocess.Popen([sys.executable, "-m", "tests.support.hub_upload_worker", prefix, repo_id],
                                  cwd=ROOT, env=subprocess_env(HF_HOME=str(tmp_path / "hf-home")),
                                  stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: held.is_set() or worker.poll() is not None, f"the upload reaching the {moment} hold")
        assert worker.poll() is None, f"the upload ended before the {moment} hold:\n{log.read_text()[-3000:]}"
        worker.kill()
        worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        hub.resume.set()
    repo = hub.repos[("dataset", repo_id)]
    if moment == "mid-transfer":  # the cut-off body is dropped, never stored as the object
        wait_for(lambda: hub.incomplete_bodies == 1, "the hub reading the killed upload's body to its end")
        assert big_sha not in hub.uploaded and hub.api_commits == 1
    else:  # the commit the dead client sent lands all the same
        wait_for(lambda: hub.api_commits == 2, "the held commit landing")
    landed = len(repo.history(repo.head)) - 1
    assert landed == (1 if moment == "mid-transfer" else 2)

    # The killed attempt left its lease (RUNNING, its holder dead) and no success: no record, no check to pass.
    upload = hub_upload_worker.upload_step(repo_id)
    out = upload.output_path_under(prefix)
    killed = read_status(out)
    assert killed.status is Status.RUNNING and f":{worker.pid}:" in killed.holder
    with pytest.raises(RecordNotAvailableError):
        read_record(out)

    retried = materialize_step(upload, prefix=prefix, settings=FAST)
    assert not retried.cached and retried.took_over.startswith(f"stale RUNNING by {killed.holder}")
    assert read_status(out).status is Status.SUCCESS
    result = load_result(out, HubUpload)
    skipped = {"mid-transfer": 2, "commit-in-flight": 4}[moment]
    assert (result.files_skipped, result.files_uploaded) == (skipped, 6 - skipped)
    assert len(result.commits) == 3 - landed and run_check(BRANCH_HOLDS_FILES, out, retried.record.result).passed
    assert repo.files() == {**source_files, ".gitattributes": repo.files()[".gitattributes"]}
    history = repo.history(repo.head)
    assert len(history) == 1 + 3 and history[0].sha == result.revision
    changed = [p for c in history[:-1] for p in repo.changed_paths(c.sha)]
    assert sorted(changed) == sorted(source_files)  # every file committed exactly once
    puts = lfs_puts(hub)  # the cut-off PUT of big.bin and the retry's; or only the killed attempt's
    assert puts == [big_sha] * (2 if moment == "mid-transfer" else 1)


def test_a_hub_cache_of_unknown_tokenizer_is_refused_before_it_is_copied(made, hub):
    cache_files = output_files(made.cache)
    repo = hub.add(HubRepo("user/no-fingerprint", {p: b for p, b in cache_files.items()
                                                   if p != "tokenizer_fingerprint.json"}))
    step = pretokenized_step("tokenized/hub-unknown", "user/no-fingerprint", made.tokenizer)
    with pytest.raises(TokenizerMismatchError) as refused:
        materialize_step(step, prefix=made.prefix)
    assert str(refused.value) == (
        f"hf://datasets/user/no-fingerprint@{repo.head}/tokenizer_fingerprint.json: missing, so nothing says which"
        " tokenizer made this cache; a cache made by a tokenize step (and uploaded with it) has one")
    assert not [r for r in hub.requests if "/resolve/" in r.path and "shard_ledger" in r.path]  # nothing copied
    assert read_status(step.output_path_under(made.prefix)).status is Status.FAILED


def test_the_token_is_sent_but_never_recorded(made, hub, caplog, capfd, monkeypatch, tmp_path):
    import logging

    from marin_assets.dagster.metadata import outcome_metadata

    caplog.set_level(logging.DEBUG)
    upload = hub_upload_step("uploads/secret", made.tokenized, "user/secret", max_commit_files=5)
    outcome = materialize_step(upload, prefix=made.prefix)

    writes = [r for r in hub.requests if r.method == "POST"]
    assert writes and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in writes)
    for endpoint in ("/api/repos/create", "/preupload/", "/info/lfs/objects/batch", "/commit/"):
        assert any(endpoint in r.path for r in writes), endpoint
    assert all("authorization" not in r.headers for r in hub.requests if r.method == "PUT")  # signed URLs
    needle = TOKEN.encode()
    assert not [p for p in Path(made.prefix).rglob("*") if p.is_file() and needle in p.read_bytes()]
    assert TOKEN not in repr(outcome) and TOKEN not in repr(outcome_metadata(outcome))
    assert TOKEN not in caplog.text and caplog.records  # something was logged, none of it the token

    # A token the hub refuses, and no token at all: clear errors, the token in neither.
    wrong = "hf_wrongTokenXx8Yy7Zz6"
    monkeypatch.setenv("HF_TOKEN", wrong)
    with pytest.raises(HubUploadError) as refused:
        upload_to_hub(str(tmp_path / "a"), made.cache, "user/other")
    assert str(refused.value) == (
        "model user/other@main: creating the repository: the hub answered 401 (Invalid credentials in Authorization"
        " header); the token (HF_TOKEN or `hf auth login`) may not write there")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(HubUploadError, match=r"^model user/other@main: no Hugging Face token; set HF_TOKEN \(or run"):
        upload_to_hub(str(tmp_path / "b"), made.cache, "user/other")
    out, err = capfd.readouterr()
    for secret in (TOKEN, wrong):
        assert secret not in out + err + caplog.text


def test_an_unreachable_hub_is_a_clear_error_without_the_token(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    with serve_hub() as stopped:
        url = stopped.url  # nothing listens there once it stops
    use_hub(monkeypatch, url, token=TOKEN)
    try:
        with pytest.raises(HubUploadError) as failed:
            upload_to_hub(str(tmp_path / "out"), str(tmp_path / "src"), "user/gone")
    finally:
        release_hub()
    assert str(failed.value).startswith("model user/gone@main: creating the repository: ConnectError: ")
    assert TOKEN not in str(failed.value)


def test_upload_and_download_throughput_against_the_emulator(hub, tmp_path):
    """Measured, not asserted (no timed assertions): printed for the record."""
    source = tmp_path / "big"
    source.mkdir()
    files = {f"part-{i}.bin": os.urandom(16 * 2**20) for i in range(3)}
    for name, data in files.items():
        (source / name).write_bytes(data)
    total = sum(len(d) for d in files.values())
    result = upload_to_hub(str(tmp_path / "up"), str(source), "user/big", repo_type="dataset",
                           max_commit_bytes=32 * 2**20)
    assert len(result.commits) == 2  # 16 + 16 MiB fit one 32 MiB commit, the third file the next
    started = time.monotonic()
    got = download_hf(str(tmp_path / "down"), "user/big", revision=result.revision, include=("part-*",))
    download_s = time.monotonic() - started
    assert {f.path: f.sha256 for f in got.files} == {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    print(f"\nemulator: upload {total / 2**20 / result.seconds:.0f} MB/s ({total / 2**20:.0f} MiB in"
          f" {result.seconds:.2f} s, {len(result.commits)} commits), download {total / 2**20 / download_s:.0f} MB/s")
