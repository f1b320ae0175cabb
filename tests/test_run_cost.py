"""The cost of a training run, on one real tiny Levanter run materialized as a step: parameters counted
in the exported weights, FLOPs per token against an independent count and against what Levanter logged,
tokens/s, MFU against the measured CPU peak (said to be an assumption), device-hours; the speedrun-style
table of a sweep's runs, as the Dagster UI shows it; records made before costs still load."""

import json
import math
import os

import dagster as dg
import pytest

from marin_assets import StepDefinitionError, load_result, materialize_step
from marin_assets.core.record import read_record, record_path
from marin_assets.core.results import from_jsonable, to_jsonable
from marin_assets.core.step import walk
from marin_assets.dagster.metadata import result_metadata
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.evals.loss import loss_eval_step
from marin_assets.pipeline.reports.run_costs import TABLE_FILE, RunCostTable, every_run_costed, run_costs_step
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.cost import (
    RunCostError,
    compute_dtype,
    datasheet_peak,
    device_peak,
    run_cost,
)
from marin_assets.pipeline.training.levanter_trainer import SUMMARY_STEP, read_metrics
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.runner import METRICS_FILE
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult, TrainStep

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
TRAINER = TrainerSpec(num_train_steps=8, train_batch_size=4, checkpoint_every=4, steps_per_eval=4, max_eval_batches=1)


class Run:
    """One tiny pipeline under its own prefix: corpus → BPE → cache → an 8-step Llama, materialized once."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        stories = corpus_step("raw/stories", train_documents=300, validation_documents=30, seed=1, shards=1)
        self.tokenized = tokenize_step("tokenized/stories", stories, bpe_tokenizer_step("tokenizers/bpe", stories,
                                                                                         vocab_size=400))
        self.train = train_step("checkpoints/cost-tiny", {"stories": self.tokenized}, TINY,
                                OptimizerSpec(learning_rate=1e-2), TRAINER)
        for step in walk([self.train]):
            materialize_step(step, prefix=prefix)
        self.output = self.train.output_path_under(prefix)
        self.result = load_result(self.output, TrainResult)
        self.metrics = read_metrics(os.path.join(self.output, METRICS_FILE))
        self.summary = self.metrics.pop(SUMMARY_STEP)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    return Run(str(tmp_path_factory.mktemp("cost") / "outputs"))


def independent_training_flops_per_token(model: ModelSpec, vocab: int) -> int:
    """Forward: 2 FLOPs per weight of every projection, attention over the full seq_len map (QKᵀ and AV, 2
    per multiply-add; mask and softmax, 3 per score), and the LM head; training: forward + 2 × forward."""
    d, f, s, h, kv = model.hidden_dim, model.intermediate_dim, model.seq_len, model.num_heads, model.num_kv_heads
    head = d // h
    projection_weights = d * h * head + 2 * d * kv * head + h * head * d + 3 * d * f  # q, k, v, o; gate, up, down
    attention = 2 * s * h * head + 2 * s * h * head + 3 * s * h
    forward = model.num_layers * (2 * projection_weights + attention) + 2 * d * vocab
    return 3 * forward


def test_parameters_are_the_exported_weights(run):
    from safetensors import safe_open

    with safe_open(os.path.join(run.result.hf_dir, "model.safetensors"), framework="numpy") as f:
        counted = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    assert run.result.cost.parameters == run.result.parameter_count == counted == 43_104


def test_flops_per_token_are_an_independent_count_and_what_levanter_logged(run):
    cost, vocab = run.result.cost, run.result.vocab_size
    assert vocab == 512 and cost.flops_per_token == independent_training_flops_per_token(TINY, vocab) == 185_472
    assert run.summary["throughput/flops_per_example"] == cost.flops_per_token * TINY.seq_len
    assert cost.tokens == TRAINER.num_train_steps * TRAINER.train_batch_size * TINY.seq_len == run.result.train_tokens
    assert cost.total_flops == cost.flops_per_token * cost.tokens
    last = run.metrics[TRAINER.num_train_steps - 1]
    assert last["throughput/total_tokens"] == cost.tokens
    assert math.isclose(last["throughput/total_gflops"] * 1e9, cost.total_flops, rel_tol=1e-9)
    assert "3 × forward" in cost.flops_formula


def test_tokens_per_second_mfu_and_device_hours_follow_from_the_run(run):
    cost = run.result.cost
    logged = [m for s, m in sorted(run.metrics.items()) if "throughput/tokens_per_second" in m]
    assert len(logged) == TRAINER.num_train_steps
    by_speed = sorted(logged, key=lambda m: m["throughput/tokens_per_second"])
    median = by_speed[len(by_speed) // 2]
    assert cost.tokens_per_second == median["throughput/tokens_per_second"]
    assert round(cost.tokens_per_second, 1) == run.result.tokens_per_second
    assert math.isclose(cost.flops_per_second, median["throughput/gflops_per_second"] * 1e9, rel_tol=1e-9)
    assert (cost.device_kind, cost.device_count, cost.peak_basis) == ("cpu", 1, "measured")
    assert cost.mfu == cost.tokens_per_second * cost.flops_per_token / (cost.peak_flops_per_device * cost.device_count)
    assert 0 < cost.mfu and cost.levanter_mfu is None  # Levanter has no CPU peak, so it logs no MFU
    assert cost.wall_seconds == run.result.train_seconds > cost.step_seconds > 0
    assert math.isclose(cost.step_seconds, sum(m["throughput/duration"] for m in logged), rel_tol=1e-9)
    assert cost.device_hours == cost.wall_seconds * cost.device_count / 3600


def test_wall_time_counts_every_attempt_and_a_finished_run_adds_none(run, tmp_path):
    from marin_assets.core.paths import using_prefix
    from marin_assets.pipeline.training.runner import ATTEMPTS_FILE, training_seconds

    first = run.result.cost.wall_seconds
    assert first > 0 and run.result.train_seconds == pytest.approx(first)
    assert json.loads(open(os.path.join(run.output, ATTEMPTS_FILE)).read())["seconds"] == [first]
    # The function run again over a finished run (as after a crash between training and the record):
    # Levanter trains nothing, the time stays.
    with using_prefix(run.prefix):
        again = run.train.fn(run.output)
    assert again.cost.wall_seconds == pytest.approx(first) and again.checkpoint_steps == run.result.checkpoint_steps
    # A resumed run adds its attempt to the earlier ones.
    out = str(tmp_path / "resumed")
    assert training_seconds(out, 2.5) == 2.5 and training_seconds(out, 4.0) == 6.5
    assert training_seconds(out, None) == 6.5


def test_the_cpu_peak_is_recorded_as_a_measured_assumption(run):
    cost = run.result.cost
    assert cost.peak_source.startswith("CPU: no published peak; peak = measured float32 matmul throughput of this host")
    assert f"{cost.peak_flops_per_device / 1e9:.1f} GFLOP/s per device" in cost.peak_source
    assert "an assumption, not a datasheet number" in cost.peak_source
    assert datasheet_peak("cpu", "float32") is None


def test_accelerator_peaks_come_from_levanters_datasheet_table():
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989.5e12
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "float32") == 67e12
    assert datasheet_peak("TPU v4", "bfloat16") == 275e12
    assert (compute_dtype("f32"), compute_dtype("p=f32,c=bfloat16")) == ("float32", "bfloat16")
    peak = device_peak("float32")
    assert (peak.kind, peak.count, peak.basis) == ("cpu", 1, "measured") and peak.flops_per_device > 1e8


def test_a_model_that_is_not_the_one_levanter_trained_is_an_error(run):
    with pytest.raises(RunCostError) as e:
        run_cost("cost-tiny", run.metrics, run.summary, TINY, 1024, 2048, 1.0, device_peak())
    assert str(e.value) == ("run 'cost-tiny': Levanter logged 11,870,208 FLOPs per example, but the model recorded"
                            " (llama, hidden 32, layers 1, seq_len 64, vocabulary 1024) gives 18,161,664: the record's"
                            " model or vocabulary is not the one trained")
    with pytest.raises(RunCostError, match="run 'x': its metrics have no throughput/tokens_per_second"):
        run_cost("x", {}, {}, TINY, 512, 2048, 1.0, device_peak())


def old_record(result: TrainResult) -> dict:
    """The JSON of `result` as a record made before costs and bits per byte were recorded."""
    data = to_jsonable(result)
    del data["cost"], data["final_eval_bpb"]
    return data


def test_records_made_before_costs_still_load(run):
    loaded = from_jsonable(old_record(run.result), TrainResult)
    assert loaded.cost is None and loaded.final_eval_bpb is None
    assert loaded.parameter_count == run.result.parameter_count and loaded.loss_curve == run.result.loss_curve


def test_a_sweeps_cost_table_has_a_row_per_run_and_dagster_shows_it(run):
    old = TrainStep(name="checkpoints/cost-old", fn=lambda out: run.result, hash_attrs={"old": True}, kind="train",
                    model=TINY)
    materialize_step(old, prefix=run.prefix)
    old_output = old.output_path_under(run.prefix)
    with open(record_path(old_output)) as f:
        record = json.load(f)
    record["result"] = old_record(run.result)
    with open(record_path(old_output), "w") as f:
        json.dump(record, f)
    evaluation = loss_eval_step("evals/cost-tiny", run.train, {"stories": run.tokenized})
    table = run_costs_step("reports/costs", [run.train, evaluation, old])
    assert [d.name for d in table.deps] == ["checkpoints/cost-tiny", "checkpoints/cost-old"]
    materialize_step(table, prefix=run.prefix)

    output = table.output_path_under(run.prefix)
    made = load_result(output, RunCostTable)
    cost, result = run.result.cost, run.result
    new, older = made.rows
    assert (new.name, new.parameters, new.tokens, new.total_flops, new.tokens_per_second, new.mfu, new.device,
            new.wall_seconds, new.device_hours) == (
        "checkpoints/cost-tiny", cost.parameters, cost.tokens, cost.total_flops, cost.tokens_per_second, cost.mfu,
        "1 × cpu", cost.wall_seconds, cost.device_hours)
    assert (new.final_train_loss, new.final_eval_loss, new.final_eval_bpb) == (
        result.final_train_loss, result.final_eval_loss, result.final_eval_bpb)
    assert 0 < result.final_eval_bpb < 16 and new.peak == "measured"
    assert older.name == "checkpoints/cost-old" and older.mfu is older.device_hours is older.final_eval_bpb is None
    assert older.parameters == result.parameter_count  # what an old record has, it shows

    with open(os.path.join(output, TABLE_FILE)) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("| run | params | tokens | FLOPs | tokens/s | MFU |") and len(lines) == 4
    assert lines[2].startswith(f"| checkpoints/cost-tiny | 43,104 | 2,048 | {cost.total_flops:.3g} |")
    assert f"| {cost.mfu:.2%} | measured | 1 × cpu |" in lines[2] and "| — |" in lines[3]

    shown = result_metadata(read_record(output).result)
    assert isinstance(shown["result.rows"], dg.TableMetadataValue) and shown["result.rows.count"] == 2
    columns = {c.name: c.type for c in shown["result.rows"].schema.columns}
    assert columns["mfu"] == columns["total_flops"] == columns["device_hours"] == "float"
    assert columns["parameters"] == columns["tokens"] == "int"
    cells = [r.data for r in shown["result.rows"].records]
    assert [c["name"] for c in cells] == ["checkpoints/cost-tiny", "checkpoints/cost-old"]
    assert cells[0]["mfu"] == cost.mfu and cells[0]["total_flops"] == cost.total_flops and cells[1]["mfu"] is None

    check = every_run_costed(output, read_record(output).result)
    assert not check.passed and "no cost recorded for ['checkpoints/cost-old']" in check.message


def test_a_cost_table_needs_a_training_step(run):
    with pytest.raises(StepDefinitionError, match="step 'reports/none': none of the 1 steps given is a training"
                                                  r" step \(made by train_step\)"):
        run_costs_step("reports/none", [run.tokenized])


def test_a_sweeps_cost_table_is_an_asset_over_its_training_runs(run):
    from marin_assets import build_definitions
    from marin_assets.pipeline.sweeps import lr_model_sweep

    sweep = lr_model_sweep("tiny", {"stories": run.tokenized}, {"a": TINY}, [1e-3, 3e-3], TRAINER)
    table = run_costs_step("reports/tiny-costs", sweep)
    assert [d.name for d in table.deps] == ["checkpoints/tiny-a-lr0.001", "checkpoints/tiny-a-lr0.003"]
    graph = build_definitions([*sweep, table]).resolve_asset_graph()
    assert graph.get(dg.AssetKey(["reports", "tiny-costs"])).parent_keys == {
        dg.AssetKey(["checkpoints", "tiny-a-lr0.001"]), dg.AssetKey(["checkpoints", "tiny-a-lr0.003"])}
