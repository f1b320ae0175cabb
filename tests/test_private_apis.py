"""Every private API of a pinned dependency we call, exercised for real on tiny inputs.

Each test names the private function in its failure message: when an upgrade changes one, it fails here,
loudly and by name, rather than as a corrupt cache or a schedule that never fires. The private calls
themselves live in one place each: `marin_assets/pipeline/evals/levanter_harness.py` (Levanter; the cache
fence, `pipeline/tokens/levanter_cache.py`, now calls public names only, and its tests stay here beside them),
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
def processor(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tokenizer"))
    hf_tokenizer(frames_with_eos=True).save_pretrained(folder)
    return lc.batch_tokenizer(folder, "text")


def test_pinned_versions_are_the_installed_ones():
    """The private calls below were checked against these versions; an upgrade must re-check them."""
    assert importlib.metadata.version("marin-levanter") == lc.LEVANTER_VERSION, \
        "marin-levanter moved: review levanter_cache.py (its cache API, ledger layout and processors)"
    assert importlib.metadata.version("jax") == lc.JAX_VERSION, \
        "jax moved: review pipeline/tokens/array_store.py (the S3 settings Levanter's tensorstore specs need)"
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


def test_the_harness_model_uses__LmEvalHarnessWorker():
    """`evals/levanter_harness.py` builds Levanter's private `_LmEvalHarnessWorker` under a subclass of the public
    `LevanterHarnessLM`, reading the leader's `EvalPos`, `EvalBatch`, `max_packed_segments` and calling
    `dispatch_loglikelihood` (scores as lm-eval's own run and as a plain forward pass, in
    tests/test_harness_eval.py). Levanter turns `LevanterHarnessLM` into a bare `object` subclass when lm-eval
    fails to import (as older lm-evals did under transformers 5): that would be an `LM` lm-eval cannot run."""
    import inspect

    from levanter.eval_harness import LevanterHarnessLM, _LmEvalHarnessWorker
    from lm_eval.api.model import TemplateLM

    from marin_assets.pipeline.evals.levanter_harness import lm_class

    worker = inspect.signature(_LmEvalHarnessWorker.__init__).parameters
    assert list(worker)[1:7] == ["EvalBatch", "EvalPos", "model", "axis_resources", "tokenizer", "mp"], \
        f"_LmEvalHarnessWorker's constructor changed: {list(worker)}"
    assert "max_packed_segments" in worker, "_LmEvalHarnessWorker no longer takes max_packed_segments"
    assert callable(getattr(_LmEvalHarnessWorker, "dispatch_loglikelihood", None)), \
        "_LmEvalHarnessWorker.dispatch_loglikelihood is gone"
    assert issubclass(LevanterHarnessLM, TemplateLM), "Levanter could not import lm-eval: LevanterHarnessLM is no LM"
    ours = lm_class()
    assert issubclass(ours, LevanterHarnessLM)
    for overridden in ("_loglikelihood_tokens", "loglikelihood", "tok_encode"):
        assert any(overridden in vars(c) for c in LevanterHarnessLM.__mro__ if c is not object), \
            f"LevanterHarnessLM.{overridden}, which our harness model overrides, is gone"
