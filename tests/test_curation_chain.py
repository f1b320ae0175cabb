"""The curation experiment end to end through Dagster on Ray: raw → normalize → filters → dedup →
decontaminate → tokenize → train, with what each stage removed measured against what was planted."""

import math

import dagster as dg

from marin_assets import build_definitions, load_result
from marin_assets.experiments import curated_docs
from marin_assets.pipeline.curation.planted import load_truth
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.curation import documents

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
SHORT = TrainerSpec(num_train_steps=8, train_batch_size=4, checkpoint_every=8, steps_per_eval=8, max_eval_batches=1)
"""Eight steps: enough for the held-out loss to pass below a uniform guess's (4 were not: 6.04 > ln 384 = 5.95)."""
CURATION = ["normalized", "heuristics", "quality", "exact", "fuzzy", "decontaminated"]


def test_the_curation_experiment_materializes_through_dagster_and_cleans_what_was_planted(prefix, local_ray,
                                                                                           dagster_home):
    pipeline = curated_docs.build(prefix="chain", vocab_size=300, model=TINY, trainer=SHORT)
    defs = build_definitions([pipeline["train"]])
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=dg.DagsterInstance.get())
    assert result.success
    keys = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert {pipeline[k].name for k in CURATION + ["raw", "classifier", "tokenized", "train"]} <= keys
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    for k in CURATION:
        assert checks[(pipeline[k].name, "removed_fraction_within")] is True, k

    # Each stage's metadata shows its counts and what it removed per reason, as tables.
    events = {e.asset_key.to_user_string(): e for e in result.get_asset_materialization_events()}
    for k in CURATION:
        metadata = events[pipeline[k].name].materialization.metadata
        assert isinstance(metadata["result.splits"], dg.TableMetadataValue), (k, sorted(metadata))
        if k in ("heuristics", "exact", "fuzzy", "decontaminated"):  # each removes some of what was planted
            assert isinstance(metadata["result.removed"], dg.TableMetadataValue), (k, sorted(metadata))
    fuzzy = events[pipeline["fuzzy"].name].materialization.metadata
    assert [r.data["name"] for r in fuzzy["result.removed"].records] == ["near-duplicate"]

    truth = load_truth(pipeline["raw"].output_path)
    final = documents(pipeline["decontaminated"].output_path)
    ids = [row["id"] for row in final]
    kept = set(ids)
    # exact duplicates: one copy each at most; contamination: none of the evaluation paragraphs left
    assert all(ids.count(i) <= 1 for i in truth.exact_duplicates)
    eval_lines = {line for path in truth.eval_sets.values() for line in _texts(path)}
    assert not any(line in row["text"] for row in final for line in eval_lines)
    # junk: most planted low-quality documents are gone; real documentation: most of it is kept
    junk_left = [i for i in truth.low_quality if i in kept]
    base_kept = sum(i in kept for i in truth.base_ids)
    print(f"chain: {len(final)} documents kept; junk left {len(junk_left)}/{len(truth.low_quality)};"
          f" base kept {base_kept}/{len(truth.base_ids)}")
    assert len(junk_left) <= len(truth.low_quality) // 4
    assert base_kept >= 0.8 * len(truth.base_ids)

    trained = load_result(pipeline["train"], TrainResult)
    # Trained on the curated text, the model predicts its held-out documents better than a uniform guess over
    # its vocabulary would (ln V nats per token; measured: 5.68 < ln 384 = 5.95), and its training loss fell.
    uniform = math.log(trained.vocab_size)
    assert trained.steps == 8 and trained.final_eval_loss < uniform, (trained.final_eval_loss, uniform)
    assert trained.final_train_loss < trained.loss_curve[0][1], trained.loss_curve


def _texts(path: str) -> list[str]:
    import json

    with open(path) as f:
        return [json.loads(line)["text"] for line in f]
