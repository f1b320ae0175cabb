"""Every private API of a pinned dependency we call, exercised for real on tiny inputs.

Each test names the private function in its failure message: when an upgrade changes one, it fails here,
loudly and by name, rather than as a corrupt cache or a schedule that never fires. The private calls
themselves live in one place each: `marin_assets/pipeline/tokens/levanter_cache.py` and
`marin_assets/pipeline/evals/levanter_harness.py` (Levanter),
`marin_assets/dagster/schedules.py::stale_or_missing` (Dagster), `resources/ray.py::session_dir` (Ray).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import dagster as dg
import pytest

from marin_assets.pipeline.tokens import levanter_cache as lc
from tests.support.helpers import ROOT, subprocess_env

EOS = "<|endoftext|>"
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "hi there, how are you", "the end of the story"] * 4


def hf_tokenizer(frames_with_eos: bool, normalizer=None):
    """A tiny byte-level BPE (as `train_tokenizer` makes), with or without a post-processor adding EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS, trainer=trainer)
    if normalizer is not None:
        tok.normalizer = normalizer
    if frames_with_eos:
        tok.post_processor = processors.TemplateProcessing(single=f"{EOS} $A {EOS}",
                                                           special_tokens=[(EOS, tok.token_to_id(EOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                                   model_input_names=["input_ids", "attention_mask"])


@pytest.fixture(scope="module")
def processor():
    return lc.batch_tokenizer(hf_tokenizer(frames_with_eos=True), "text")


def write_cache(path: str, exemplar: dict, rows: list[list[int]]) -> None:
    store = lc.open_store(exemplar, path, mode="a")
    store.extend([{"input_ids": r} for r in rows])


def read_rows(path: str, exemplar: dict) -> list[list[int]]:
    store = lc.open_store(exemplar, path, mode="r")
    return [list(map(int, row["input_ids"])) for row in store.get_batch_sync(list(range(len(store))))]


A = [[1, 2, 3], [4, 5]]
B = [[6, 7, 8, 9]]


def test_pinned_versions_are_the_installed_ones():
    """The private calls below were checked against these versions; an upgrade must re-check them."""
    assert importlib.metadata.version("levanter") == lc.LEVANTER_VERSION, "levanter moved: review levanter_cache.py"
    assert importlib.metadata.version("jax") == lc.JAX_VERSION, \
        "jax moved: does its tensorstore spec builder know s3:// now? review refuse_unsupported_array_store"
    assert importlib.metadata.version("dagster") == "1.13.27", "dagster moved: review schedules.stale_or_missing"
    assert importlib.metadata.version("ray") == "2.60.0", "ray moved: review resources/ray.py::session_dir"


def test_importing_tokenize_does_not_import_levanter_or_jax():
    code = ("import sys, marin_assets.pipeline.tokens.tokenize, marin_assets.pipeline.tokens.levanter_cache\n"
            "print(sorted(m for m in ('levanter', 'jax', 'haliax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip()
    assert out == "[]", f"importing the tokenize step's module loaded {out}"


def test_a_ledger_is_committed_whole_and_a_torn_one_falls_back_to_the_commit_before(processor, tmp_path):
    cache_dir = str(tmp_path / "new" / "part")  # not there yet: the commit creates it
    metadata = lc.cache_metadata(processor)
    before = lc.new_ledger(3, {"s": 3}, [], False, metadata)
    lc.commit_ledger(cache_dir, before)
    finished = lc.new_ledger(5, {"s": 5}, ["s"], True, metadata)
    lc.commit_ledger(cache_dir, finished)
    loaded = lc.load_ledger(cache_dir)
    assert loaded == finished, "CacheLedger.to_json then CacheLedger.load no longer round-trips"
    ledger = tmp_path / "new" / "part" / lc.LEDGER_FILE
    raw = json.loads(ledger.read_text())  # cache_not_empty reads it
    assert (raw["total_num_rows"], raw["is_finished"]) == (5, True), \
        "CacheLedger.to_json no longer writes total_num_rows/is_finished"
    assert sorted(p.name for p in ledger.parent.iterdir()) == [lc.LEDGER_FILE, f"{lc.LEDGER_FILE}.bak"]  # no temp
    ledger.write_text("")  # as Levanter's own commit left it when killed between truncating and writing
    assert lc.load_ledger(cache_dir) == before
    assert lc.load_ledger(str(tmp_path / "none")) is None


def test_expose_rows_uses__expose_available_rows(processor, tmp_path):
    path = str(tmp_path / "c")
    exemplar = processor.output_exemplar
    write_cache(path, exemplar, [[1, 2], [3], [4, 5, 6]])
    store = lc.open_store(exemplar, path, mode="a")
    lc.expose_rows(store, 2)  # as after a crash: a third row was written but never committed
    assert len(store) == 2 and read_rows(path, exemplar) == [[1, 2], [3]], \
        "_expose_available_rows no longer truncates the visible rows"
    store.extend([{"input_ids": [7]}])
    assert read_rows(path, exemplar) == [[1, 2], [3], [7]], \
        "_expose_available_rows: rows appended after it no longer replace the uncommitted ones"
    lc.expose_rows(store, 1)
    lc.expose_rows(store, 3)  # revealing rows again (what merge_parts does after a copy)
    assert read_rows(path, exemplar) == [[1, 2], [3], [7]], "_expose_available_rows no longer reveals rows"


def two_caches(tmp_path, exemplar: dict) -> tuple[str, str, dict[str, int]]:
    dest, part = str(tmp_path / "dest"), str(tmp_path / "part")
    write_cache(dest, exemplar, A)
    write_cache(part, exemplar, B)
    offsets = {k: v.data_size for k, v in lc.open_store(exemplar, dest, mode="a").tree.items()}
    assert offsets == {"input_ids": 5}
    return dest, part, offsets


def test_copy_cache_data_uses__extend_cache_with_other_cache(processor, tmp_path):
    exemplar = processor.output_exemplar
    dest, part, offsets = two_caches(tmp_path, exemplar)
    assert lc.copy_cache_data(dest, part, exemplar, offsets, len(A)) == len(B), \
        "_extend_cache_with_other_cache no longer returns the source's row count"
    store = lc.open_store(exemplar, dest, mode="r")
    data = store.tree["input_ids"].data[5:9].read().result()
    assert list(map(int, data)) == B[0], "_extend_cache_with_other_cache no longer copies data at the offset"
    assert len(store) == len(A), "_extend_cache_with_other_cache now changes the visible rows"


def test_copy_cache_offsets_uses__extend_cache_metadata_with_other(processor, tmp_path):
    exemplar = processor.output_exemplar
    dest, part, offsets = two_caches(tmp_path, exemplar)
    assert lc.copy_cache_offsets(dest, part, exemplar, offsets, len(A)) == len(B), \
        "_extend_cache_metadata_with_other no longer returns the source's row count"
    store = lc.open_store(exemplar, dest, mode="r")
    ends = store.tree["input_ids"].offsets[1:4].read().result()
    assert list(map(int, ends)) == [3, 5, 9], \
        "_extend_cache_metadata_with_other no longer appends the source's row ends shifted by the data offset"
    assert len(store) == len(A), "_extend_cache_metadata_with_other now changes the visible rows"


def test_append_cache_then_expose_concatenates(processor, tmp_path):
    exemplar = processor.output_exemplar
    dest, part, offsets = two_caches(tmp_path, exemplar)
    lc.append_cache(dest, part, exemplar, offsets, len(A))
    lc.expose_rows(lc.open_store(exemplar, dest, mode="a"), len(A) + len(B))
    assert read_rows(dest, exemplar) == A + B, \
        "_extend_cache_with_other_cache + _extend_cache_metadata_with_other no longer concatenate caches"


def test_stale_or_missing_uses_CachingStaleStatusResolver():
    from marin_assets.dagster.schedules import stale_or_missing

    def definitions(root_version: str) -> dg.Definitions:
        @dg.asset(code_version=root_version)
        def root() -> None:
            return None

        @dg.asset(code_version="1", deps=[root])
        def leaf() -> None:
            return None

        return dg.Definitions(assets=[root, leaf])

    root, leaf = dg.AssetKey("root"), dg.AssetKey("leaf")
    with dg.instance_for_test() as instance:
        defs = definitions("1")
        repo = defs.get_repository_def()
        assert stale_or_missing(instance, repo, [root, leaf]) == {root, leaf}, \
            "CachingStaleStatusResolver no longer reports never-materialized assets as MISSING"
        defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance, asset_selection=[root])
        assert stale_or_missing(instance, repo, [root, leaf]) == {leaf}, \
            "CachingStaleStatusResolver: a materialized asset with an unchanged code version is not up to date"
        defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
        assert stale_or_missing(instance, repo, [root, leaf]) == set()
        changed = definitions("2").get_repository_def()
        assert root in stale_or_missing(instance, changed, [root, leaf]), \
            "CachingStaleStatusResolver no longer reports a changed code version as STALE"


def test_session_dir_is_the_embedded_rays_session_folder(local_ray):
    from resources.ray import session_dir

    path = session_dir()
    assert path is not None and os.path.isdir(path), f"session_dir() gave {path!r}, not a folder"
    # This Ray's own sockets live in its session folder (`session_latest` would not do: another
    # process's Ray may have started since).
    sockets = [n["ObjectStoreSocketName"] for n in local_ray.nodes() if n.get("Alive")]
    assert sockets and all(os.path.realpath(s).startswith(os.path.realpath(path) + os.sep) for s in sockets), \
        f"RuntimeContext.get_temp_dir()/get_session_name() no longer name this Ray's session folder ({sockets})"
    assert os.path.basename(path).startswith("session_") and os.path.isdir(os.path.join(path, "logs"))


def test_the_harness_model_uses_LmEvalHarnessWorker_and_LevanterHarnessLM_as_they_were():
    """`evals/levanter_harness.py` builds Levanter's private `_LmEvalHarnessWorker` and subclasses
    `LevanterHarnessLM`, reading the leader's `EvalPos`, `EvalBatch`, `max_packed_segments` and calling
    `dispatch_loglikelihood` (scores as lm-eval's own run, in tests/test_harness_eval.py)."""
    import inspect

    from levanter.eval_harness import LevanterHarnessLM, _LmEvalHarnessWorker

    from marin_assets.pipeline.evals.levanter_harness import lm_class

    worker = inspect.signature(_LmEvalHarnessWorker.__init__).parameters
    assert list(worker)[1:7] == ["EvalBatch", "EvalPos", "model", "axis_resources", "tokenizer", "mp"], \
        f"_LmEvalHarnessWorker's constructor changed: {list(worker)}"
    assert "max_packed_segments" in worker, "_LmEvalHarnessWorker no longer takes max_packed_segments"
    assert callable(getattr(_LmEvalHarnessWorker, "dispatch_loglikelihood", None)), \
        "_LmEvalHarnessWorker.dispatch_loglikelihood is gone"
    ours = lm_class()
    assert issubclass(ours, LevanterHarnessLM)
    for overridden in ("_loglikelihood_tokens", "loglikelihood", "tok_encode"):
        assert any(overridden in vars(c) for c in LevanterHarnessLM.__mro__ if c is not object), \
            f"LevanterHarnessLM.{overridden}, which our harness model overrides, is gone"
