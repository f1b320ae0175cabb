"""A priced plan: FLOPs counted without Levanter as Levanter counts them; devices, prices and peaks; throughput
fitted to earlier runs; a real tiny IsoFLOP sweep priced before launch (estimated from a peak), then from
measured throughput, against the records it made (the errors printed, not asserted); the budget guard of
`marin-assets plan` and of a Dagster run tag refusing and allowing; predicted and actual in the record and
in the Dagster metadata; records made before predictions still read."""

import dataclasses
import json
import pickle
import shutil
import textwrap

import dagster as dg
import pytest

from marin_assets import build_definitions, load_result, materialize_step
from marin_assets.cli import main as cli_main
from marin_assets.core.estimate import EstimateInputs, WorkEstimate
from marin_assets.core.light import light
from marin_assets.core.prices import DEFAULT_ASSUMED_MFU, DEFAULT_PRICES, PriceFileError, PriceTable, devices_of
from marin_assets.core.pricing import over_budget, predict, price_steps
from marin_assets.core.record import ArtifactRecord, read_record
from marin_assets.core.step import Resources, Step, walk
from marin_assets.core.stores import read_status
from marin_assets.core.throughput import HISTORY_DIR, History, Sample, fit
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.hello import numbers_step, stats_step
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.estimates import lm_training_flops_per_token
from marin_assets.pipeline.training.pretrain.isoflop import IsoFlopScale
from marin_assets.pipeline.training.pretrain.isoflop_sweep import isoflop_sweep
from marin_assets.pipeline.training.specs import ModelSpec
from marin_assets.pipeline.training.training_run import TrainResult
from resources import StorageResource

VOCAB = 512
SCALE = IsoFlopScale(hidden_start=16, hidden_stop=48, hidden_step=16, seq_len=64, reference_steps=16, min_batch=2,
                     max_tokens_per_param=10_000, flop_tolerance=0.1)
"""Three widths at 1e9 FLOPs: 10–16 steps of 4–16 sequences of 64 tokens each."""


def sweep_graph():
    """Generated stories → a 400-id BPE → a cache → a one-budget IsoFLOP sweep of three runs (the same steps in
    this test and in the definitions file its CLI loads)."""
    stories = corpus_step("raw/priced-stories", train_documents=300, validation_documents=30, seed=3, shards=1)
    tokenizer = bpe_tokenizer_step("tokenizers/priced-bpe", stories, vocab_size=400)
    tokenized = tokenize_step("tokenized/priced-stories", stories, tokenizer)
    return isoflop_sweep("priced", [1e9], {"stories": tokenized}, VOCAB, SCALE)


# ---- work, devices, prices, fits ----


@pytest.mark.parametrize("model", [ModelSpec(), ModelSpec(family="gpt2", hidden_dim=64, num_heads=4, seq_len=128),
                                   ModelSpec(hidden_dim=96, intermediate_dim=256, num_heads=6, num_kv_heads=2)])
def test_training_flops_per_token_are_counted_without_levanter_as_levanter_counts_them(model):
    from marin_assets.pipeline.training.cost import training_flops_per_token

    assert lm_training_flops_per_token(model, 1024) == pytest.approx(training_flops_per_token(model, 1024), rel=1e-12)


def test_devices_prices_and_peaks(tmp_path):
    assert devices_of(Resources(cpu=4)) == devices_of(Resources(cpu=4.0))
    assert (devices_of(Resources(cpu=4)).kind, devices_of(Resources(cpu=4)).count) == ("cpu", 4)
    assert (devices_of(Resources(gpu=8, gpu_type="H100")).kind, devices_of(Resources(gpu=8)).kind) == ("h100", "gpu")
    assert (devices_of(Resources(tpu_type="v4-32")).kind, devices_of(Resources(tpu_type="v4-32")).count) == ("v4", 16)
    assert devices_of(Resources(tpu_type="v5e-16")).kind == "v5litepod"
    assert devices_of(Resources(tpu_type="v5e-16")).count == 16
    assert devices_of(Resources(gpu=8, gpu_type="H100", hosts=2)).count == 16  # every host's GPUs
    assert devices_of(Resources(cpu=4, hosts=3)).count == 12
    table = PriceTable()
    assert table.price("h100") == DEFAULT_PRICES["h100"] and table.price("a100-40g") == DEFAULT_PRICES["a100"]
    assert table.peak("h100") is not None and table.peak("h100")[0] == pytest.approx(989.5e12)
    assert table.peak("cpu") is None  # no datasheet for a CPU
    path = tmp_path / "prices.toml"
    path.write_text('currency = "EUR"\nassumed_mfu = 0.5\n[per_device_hour]\nH100 = 2.0\n[peak_flops]\ncpu = 1e11\n')
    mine = PriceTable.load(str(path))
    assert (mine.price("h100"), mine.price("v4"), mine.currency, mine.assumed_mfu) == (2.0, DEFAULT_PRICES["v4"],
                                                                                      "EUR", 0.5)
    assert mine.peak("cpu") == (1e11, f"peak 1e+11 FLOP/s from price file {path}")
    path.write_text("[per_device_hour]\nh100 = -1\n")
    with pytest.raises(PriceFileError, match=r"prices.toml: \[per_device_hour\] h100 = -1 is not a non-negative"):
        PriceTable.load(str(path))
    path.write_text("[per_device_hours]\nh100 = 1\n")
    with pytest.raises(PriceFileError, match=r"unknown keys \['per_device_hours'\]"):
        PriceTable.load(str(path))


def sample(work, seconds, rate=None, devices=1.0):
    return Sample("s_00000000", "train", "train", "flops", work, seconds, "cpu", devices, steady_rate=rate)


def test_throughput_is_fitted_to_earlier_runs():
    # Two sizes: the line through them (10 s fixed, 1e9 per second).
    line = fit([sample(1e10, 20.0), sample(3e10, 40.0)])
    assert line is not None and line.rate == pytest.approx(1e9) and line.fixed_s == pytest.approx(10.0)
    # One run that measured its own steady rate splits its time alone; per device on 4 devices.
    one = fit([sample(4e10, 30.0, rate=1e9, devices=4.0)])
    assert one is not None and (one.rate, one.fixed_s) == (1e9, pytest.approx(20.0))
    assert one.seconds(2e10) == pytest.approx(40.0)
    same = fit([sample(1e10, 20.0), sample(1e10, 30.0)])  # one size only: a rate through the origin
    assert same is not None and same.fixed_s == 0 and same.seconds(1e10) == pytest.approx(25.0)
    assert fit([sample(None, 3.0)]) is None and fit([]) is None


def test_each_basis_of_a_prediction(tmp_path):
    prefix = str(tmp_path)
    reads = Step(name="t/reads", fn=lambda out: None, kind="tokenize",
                 estimate=lambda inputs: WorkEstimate("tokenize", "bytes", 3000.0, tokens=750.0, bytes=3000.0))
    earlier = [Sample(f"t/old{i}_0000000{i}", "tokenize", "tokenize", "bytes", b, s, "cpu", 1.0, tokens=b / 2, bytes=b)
               for i, (b, s) in enumerate([(1000.0, 2.0), (2000.0, 3.0)])]
    measured = predict(reads, EstimateInputs(prefix), History(prefix, earlier), PriceTable())
    assert (measured.basis, measured.wall_s, measured.work.tokens) == ("measured", pytest.approx(4.0), 1500.0)
    assert measured.cost == pytest.approx(4.0 / 3600 * DEFAULT_PRICES["cpu"])
    assert "tokens at 0.5 per byte, measured by 2 earlier tokenize step(s)" in measured.work.note

    trains = Step(name="t/trains", fn=lambda out: None, kind="train", resources=Resources(gpu=8, gpu_type="H100"),
                  estimate=lambda inputs: WorkEstimate("train", "flops", 1e18, flops=1e18))
    estimated = predict(trains, EstimateInputs(prefix), History(prefix), PriceTable())
    assert estimated.basis == "estimated"
    assert estimated.wall_s == pytest.approx(1e18 / (989.5e12 * 8 * DEFAULT_ASSUMED_MFU))
    assert estimated.device_hours == pytest.approx(estimated.wall_s * 8 / 3600)
    assert estimated.cost == pytest.approx(estimated.device_hours * DEFAULT_PRICES["h100"])
    on_cpu = dataclasses.replace(trains, resources=Resources())
    unknown = predict(on_cpu, EstimateInputs(prefix), History(prefix), PriceTable())
    assert (unknown.basis, unknown.wall_s, unknown.cost) == ("unknown", None, None)
    assert unknown.how == "no earlier train step on cpu, and no peak FLOP/s for it"
    bare = Step(name="t/bare", fn=lambda out: None, kind="export")
    assert predict(bare, EstimateInputs(prefix), History(prefix), PriceTable()).basis == "unknown"
    exports = [Sample(f"t/e{i}_0000000{i}", "export", None, None, None, s, "cpu", 1.0) for i, s in enumerate([1, 5, 2])]
    median = predict(bare, EstimateInputs(prefix), History(prefix, exports), PriceTable())
    assert (median.basis, median.wall_s) == ("measured", 2)
    priced = price_steps([reads, trains, bare], prefix, PriceTable(), History(prefix, earlier))
    assert priced.totals["basis"] == {"measured": 1, "estimated": 1, "unknown": 1}
    assert priced.totals["device_hours"] == pytest.approx(measured.device_hours + estimated.device_hours)
    assert [p.step for p in priced.most_expensive()] == ["t/trains", "t/reads"]
    refused = over_budget(priced, max_device_hours=0.1)
    assert refused.startswith("the plan's 3 step(s) to run predict") and "most expensive: t/trains (" in refused
    assert refused.endswith("; 1 step(s) could not be priced: t/bare (no work model, and no earlier export step on"
                            " cpu); they count 0")
    assert over_budget(priced, max_device_hours=1e6, max_cost=1e9) is None


def test_steps_carry_estimates_that_never_travel_or_enter_identity():
    sweep = sweep_graph()
    run = sweep.runs[0]
    assert run.estimate is not None and sweep.train["stories"].estimate is not None
    assert pickle.loads(pickle.dumps(run)).estimate is None  # sent to a Ray worker as a reference
    before = run.estimate(EstimateInputs("/nowhere"))
    c = sweep.candidate_of(run)
    assert before.flops == pytest.approx(c.flops, rel=1e-12) and before.tokens == c.tokens
    assert "vocabulary 512, from tokenizers/priced-bpe's requested vocab_size" in before.note
    tokenized = sweep.train["stories"].estimate(EstimateInputs("/nowhere"))
    assert tokenized.work is None and "not materialized" in tokenized.note


def test_records_made_before_predictions_still_read():
    old = {"name": "a", "hash": "0" * 8, "hash_attrs": {}, "deps": [], "output_path": "/x", "result": None,
           "result_type": None, "duration_s": 1.0, "version": 1,
           "provenance": {"run_id": None, "user": "u", "host": "h", "git_commit": None, "created_at": "t",
                          "command_line": []}}
    assert ArtifactRecord.from_json(json.dumps(old)).prediction is None


# ---- a sweep: predicted before launch, then measured, against its records ----


DEFS = textwrap.dedent(
    """
    import os
    from marin_assets import build_definitions
    from resources import StorageResource
    from tests.test_priced_plan import sweep_graph

    defs = build_definitions(list(sweep_graph().runs), resources={"storage": StorageResource(prefix=os.environ["P"])})
    """
)


def plan_json(capsys, defs_file, *more):
    capsys.readouterr()
    code = cli_main(["plan", "-f", str(defs_file), "--select", "*", "--json", *more])
    return code, json.loads(capsys.readouterr().out)


def test_a_sweep_is_priced_before_launch_and_its_records_hold_predicted_and_actual(tmp_path, monkeypatch, capsys,
                                                                                   dagster_home):
    from marin_assets.pipeline.training.cost import measure_matmul_flops

    prefix = str(tmp_path / "outputs")
    prices = tmp_path / "prices.toml"  # a CPU has no datasheet peak: this host's matmul rate stands for one
    prices.write_text(f"[per_device_hour]\ncpu = 0.05\n[peak_flops]\ncpu = {measure_matmul_flops():.6g}\n")
    monkeypatch.setenv("MARIN_PRICES", str(prices))
    monkeypatch.setenv("P", prefix)
    defs_file = tmp_path / "defs.py"
    defs_file.write_text(DEFS)
    sweep = sweep_graph()

    code, before = plan_json(capsys, defs_file)  # nothing exists yet: the whole sweep's total before launch
    assert code == 0
    rows = {r["asset_key"]: r for r in before["rows"]}
    for run in sweep.runs:
        predicted = rows[run.name]["prediction"]
        assert predicted["basis"] == "estimated" and predicted["flops"] == pytest.approx(sweep.candidate_of(run).flops)
        assert predicted["tokens"] == sweep.candidate_of(run).tokens and predicted["wall_s"] > 0
        assert predicted["cost"] == pytest.approx(predicted["device_hours"] * 0.05)
    assert rows["tokenized/priced-stories"]["prediction"]["basis"] == "unknown"  # its input is not made yet
    totals = before["totals"]
    assert totals["steps"] == 6 and totals["basis"] == {"measured": 0, "estimated": 3, "unknown": 3}
    assert totals["flops"] == pytest.approx(sum(sweep.candidate_of(r).flops for r in sweep.runs))
    assert before["prices"]["source"] == f"price file {prices}"

    first, rest = sweep.runs[0], sweep.runs[1:]
    for step in walk([first]):
        materialize_step(step, prefix=prefix)
    code, after_one = plan_json(capsys, defs_file)  # the first run measured a throughput on this host
    assert code == 0
    measured = {r["asset_key"]: r["prediction"] for r in after_one["rows"] if r["prediction"]}
    assert sorted(measured) == sorted(r.name for r in rest)
    assert all(p["basis"] == "measured" and "1 earlier train step(s) on cpu" in p["how"] for p in measured.values())
    for run in rest:
        materialize_step(run, prefix=prefix)

    lines = []
    for run in sweep.runs:
        record = read_record(run.output_path_under(prefix))
        trained = load_result(run.output_path_under(prefix), TrainResult)
        compared = record.prediction
        assert compared is not None and compared["actual"]["wall_s"] == pytest.approx(record.duration_s, abs=1e-3)
        assert compared["actual"]["flops"] == trained.cost.total_flops  # what Levanter counted
        assert compared["predicted"]["flops"] == pytest.approx(trained.cost.total_flops, rel=1e-9)
        assert compared["error"]["work"] == pytest.approx(0.0, abs=1e-9)
        wall = compared["predicted"]["wall_s"]
        assert compared["error"]["wall_s"] == pytest.approx((wall - record.duration_s) / record.duration_s, abs=1e-3)
        assert compared["predicted"]["basis"] == ("estimated" if run is first else "measured")
        estimated = rows[run.name]["prediction"]["wall_s"]
        planned = measured.get(run.name, {}).get("wall_s")
        lines.append(f"{run.name}: took {record.duration_s:.1f} s; estimated before launch {estimated:.3g} s"
                     f" ({(estimated - record.duration_s) / record.duration_s:+.0%})"
                     + (f"; measured plan {planned:.3g} s ({(planned - record.duration_s) / record.duration_s:+.0%})"
                        if planned is not None else "")
                     + f"; recorded {compared['error']['wall_s']:+.0%} ({compared['predicted']['basis']})")
    with capsys.disabled():
        print("\nsweep predictions against records:\n  " + "\n  ".join(lines))


# ---- the budget guard ----


HELLO = textwrap.dedent(
    """
    import os
    from marin_assets import build_definitions
    from marin_assets.pipeline.hello import numbers_step, stats_step
    from resources import StorageResource

    numbers = numbers_step("t/numbers", n=int(os.environ["HELLO_N"]), seed=7)
    stats = stats_step("t/stats", numbers)
    defs = build_definitions([stats], resources={"storage": StorageResource(prefix=os.environ["P"])})
    """
)


def hello(n):
    """The hello-world pair, its functions marked light (they run in the Dagster process, no Ray to start)."""
    numbers = numbers_step("t/numbers", n=n, seed=7)
    stats = stats_step("t/stats", numbers)
    return (dataclasses.replace(numbers, fn=light(numbers.fn)), dataclasses.replace(stats, fn=light(stats.fn)))


def test_plan_refuses_a_selection_over_its_budget_naming_the_costliest_steps(tmp_path, monkeypatch, capsys,
                                                                             dagster_home):
    prefix = str(tmp_path / "outputs")
    monkeypatch.setenv("P", prefix)
    monkeypatch.delenv("MARIN_PRICES", raising=False)
    (tmp_path / "defs.py").write_text(HELLO)
    for step in hello(10):  # earlier runs of this kind of step: what the plan is priced from
        materialize_step(step, prefix=prefix)
    monkeypatch.setenv("HELLO_N", "11")
    args = ["plan", "-f", str(tmp_path / "defs.py"), "--select", "*"]

    capsys.readouterr()
    assert cli_main([*args, "--max-device-hours", "0"]) == 3
    out, err = capsys.readouterr()
    assert "of the steps to run:" in out and "total: 2 step(s)" in out
    assert "over budget" in err and "device-hours > --max-device-hours 0" in err
    assert "most expensive: t/" in err and "measured" in err
    assert cli_main([*args, "--max-device-hours", "1", "--max-cost", "1"]) == 0
    assert "over budget" not in capsys.readouterr().err
    prices = tmp_path / "prices.toml"
    prices.write_text("replace_defaults = true\n[per_device_hour]\ncpu = 1e6\n")
    code, shown = plan_json(capsys, tmp_path / "defs.py", "--prices", str(prices), "--max-cost", "1e-9")
    assert code == 3 and "> --max-cost 1e-09" in shown["budget"]["refused"]
    assert shown["totals"]["cost"] == pytest.approx(shown["totals"]["device_hours"] * 1e6)
    prices.write_text("[per_device_hour\n")
    assert cli_main([*args, "--prices", str(prices)]) == 2
    assert f"price file {prices}" in capsys.readouterr().err

    # Outputs made before samples were kept: the records of the definitions' materialized steps teach the same.
    shutil.rmtree(f"{prefix}/{HISTORY_DIR}")
    (tmp_path / "more.py").write_text(HELLO.replace("defs = build_definitions([stats]",
                                                    "more = numbers_step('t/more', n=12, seed=7)\n"
                                                    "defs = build_definitions([stats, more]"))
    monkeypatch.setenv("HELLO_N", "10")
    code, shown = plan_json(capsys, tmp_path / "more.py")
    rows = {r["asset_key"]: r for r in shown["rows"]}
    assert code == 0 and {k: r["action"] for k, r in rows.items()} == {"t/numbers": "reuse", "t/stats": "reuse",
                                                                       "t/more": "run"}
    assert rows["t/more"]["prediction"]["basis"] == "measured"
    assert "median of 2 earlier python step(s) on cpu" in rows["t/more"]["prediction"]["how"]


def test_a_run_tag_refuses_a_dagster_run_before_any_work_and_the_metadata_shows_the_error(tmp_path, dagster_home):
    from marin_assets.dagster.budget import MAX_DEVICE_HOURS_TAG

    prefix = str(tmp_path / "outputs")
    for step in hello(10):
        materialize_step(step, prefix=prefix)
    numbers, stats = hello(11)
    defs = build_definitions([stats], resources={"storage": StorageResource(prefix=prefix)})
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.get()

    refused = job.execute_in_process(instance=instance, tags={MAX_DEVICE_HOURS_TAG: "0"}, raise_on_error=False)
    assert not refused.success
    failures = [e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failures and "refused before any work by its budget tags" in str(failures[0].event_specific_data.error)
    assert read_status(numbers.output_path_under(prefix)) is None  # no work started
    assert read_status(stats.output_path_under(prefix)) is None

    allowed = job.execute_in_process(instance=instance, tags={MAX_DEVICE_HOURS_TAG: "1"})
    assert allowed.success
    shown = allowed.asset_materializations_for_node("t__numbers")[0].metadata
    compared = shown["predicted_vs_actual"].value
    assert compared["predicted"]["basis"] == "measured" and "earlier python step(s)" in compared["predicted"]["how"]
    assert shown["prediction_error_wall"].value == pytest.approx(compared["error"]["wall_s"], abs=1e-4)
    words = shown["prediction_error"].text
    assert words.endswith("(measured)") and "wall time: predicted" in words
    assert shown["predicted_compute_s"].value == pytest.approx(compared["predicted"]["wall_s"], abs=1e-3)


WRONG_TYPES = [
    ("per_device_hour = 0.05\n", "per_device_hour = 0.05 must be a table", "found a number"),
    ("peak_flops = [1e10]\n", "peak_flops = [10000000000.0] must be a table", "found an array"),
    ("assumed_mfu = true\n", "assumed_mfu = True is not a fraction", "expected a number, found a boolean"),
    ('replace_defaults = "false"\n', "replace_defaults = 'false' must be a boolean", "found a string"),
    ("currency = 5\n", "currency = 5 must be a string", "found a number"),
    ("[per_device_hour]\nh100 = true\n", "[per_device_hour] h100 = True is not a non-negative number",
     "found a boolean"),
]


@pytest.mark.parametrize(("text", "names", "found"), WRONG_TYPES,
                         ids=["table-as-number", "table-as-array", "mfu-as-bool", "flag-as-string",
                              "currency-as-number", "bool-as-price"])
def test_a_price_file_entry_of_a_wrong_type_is_an_error_naming_the_file_and_key(tmp_path, monkeypatch, capsys,
                                                                                dagster_home, text, names, found):
    from marin_assets.dagster.budget import MAX_DEVICE_HOURS_TAG, PRICES_TAG

    path = tmp_path / "prices.toml"
    path.write_text(text)
    with pytest.raises(PriceFileError) as raised:
        PriceTable.load(str(path))
    assert str(raised.value).startswith(f"price file {path}: {names}") and found in str(raised.value)

    prefix = str(tmp_path / "outputs")
    monkeypatch.setenv("P", prefix)
    monkeypatch.setenv("HELLO_N", "10")
    (tmp_path / "defs.py").write_text(HELLO)
    capsys.readouterr()
    assert cli_main(["plan", "-f", str(tmp_path / "defs.py"), "--select", "*", "--prices", str(path)]) == 2
    assert f"marin-assets plan: price file {path}: {names}" in capsys.readouterr().err

    numbers, stats = hello(10)
    job = build_definitions([stats], resources={"storage": StorageResource(prefix=prefix)}
                            ).resolve_implicit_global_asset_job_def()
    run = job.execute_in_process(instance=dg.DagsterInstance.get(), raise_on_error=False,
                                 tags={MAX_DEVICE_HOURS_TAG: "1", PRICES_TAG: str(path)})
    failures = [str(e.event_specific_data.error) for e in run.all_events
                if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert not run.success and failures
    assert f"refused before any work by its budget tags: run tag marin/prices: price file {path}: {names}" \
        in failures[0] and found in failures[0]
    assert "AttributeError" not in failures[0]
    assert read_status(numbers.output_path_under(prefix)) is None


def test_a_budget_names_the_steps_it_could_not_price_and_refuses_them_when_asked(tmp_path, monkeypatch, capsys,
                                                                                 dagster_home):
    from marin_assets.dagster.budget import MAX_COST_TAG, MAX_DEVICE_HOURS_TAG, REFUSE_UNPRICED_TAG

    prefix = str(tmp_path / "outputs")  # no earlier run: every step of the plan is `unknown`
    monkeypatch.setenv("P", prefix)
    monkeypatch.setenv("HELLO_N", "10")
    monkeypatch.delenv("MARIN_PRICES", raising=False)
    (tmp_path / "defs.py").write_text(HELLO)
    args = ["plan", "-f", str(tmp_path / "defs.py"), "--select", "*", "--max-device-hours", "0", "--max-cost", "0"]
    named = "2 step(s) could not be priced: t/numbers (no work model, and no earlier python step on cpu), t/stats ("

    capsys.readouterr()
    assert cli_main(args) == 0  # by default they count 0, as before, and are named
    err = capsys.readouterr().err
    assert f"marin-assets plan: budget: {named}" in err and "--refuse-unpriced refuses them" in err
    assert cli_main([*args, "--refuse-unpriced"]) == 3
    err = capsys.readouterr().err
    assert f"over budget: {named}" in err and "--refuse-unpriced refuses a plan with any" in err
    code, shown = plan_json(capsys, tmp_path / "defs.py", "--max-cost", "0", "--refuse-unpriced")
    assert code == 3 and shown["budget"]["unpriced"] == ["t/numbers", "t/stats"] and shown["budget"]["refused"]
    assert cli_main(["plan", "-f", str(tmp_path / "defs.py"), "--select", "*"]) == 0  # no budget: no budget words
    assert "could not be priced" not in capsys.readouterr().err

    numbers, stats = hello(10)
    job = build_definitions([stats], resources={"storage": StorageResource(prefix=prefix)}
                            ).resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.get()
    refused = job.execute_in_process(instance=instance, raise_on_error=False, tags={
        MAX_DEVICE_HOURS_TAG: "0", MAX_COST_TAG: "0", REFUSE_UNPRICED_TAG: "true"})
    failures = [str(e.event_specific_data.error) for e in refused.all_events
                if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert not refused.success and failures and named in failures[0]
    assert read_status(numbers.output_path_under(prefix)) is None
    bad = job.execute_in_process(instance=instance, raise_on_error=False, tags={REFUSE_UNPRICED_TAG: "yes"})
    assert not bad.success and "run tag marin/refuse-unpriced='yes' is not true or false" in str(
        [e.event_specific_data.error for e in bad.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE])

    allowed = job.execute_in_process(instance=instance, tags={MAX_DEVICE_HOURS_TAG: "0", MAX_COST_TAG: "0"})
    assert allowed.success and read_status(stats.output_path_under(prefix)).status.value == "SUCCESS"
    said = [e.user_message for e in instance.all_logs(allowed.run_id) if "could not be priced" in e.user_message]
    assert said and said[0].startswith(f"budget: {named}") and f"{REFUSE_UNPRICED_TAG}=true" in said[0]


def test_budget_words_name_the_first_unpriced_steps_and_count_the_rest(tmp_path):
    from marin_assets.core.pricing import UNPRICED_SHOWN, unpriced, unpriced_words

    bare = [Step(name=f"t/bare{i}", fn=lambda out: None, kind="export") for i in range(UNPRICED_SHOWN + 2)]
    priced = price_steps(bare, str(tmp_path), PriceTable(), History(str(tmp_path)))
    missing = unpriced(priced, max_cost=0)
    words = unpriced_words(missing)
    assert len(missing) == UNPRICED_SHOWN + 2 and words.endswith(" and 2 more")
    assert f"t/bare{UNPRICED_SHOWN - 1} (" in words and f"t/bare{UNPRICED_SHOWN} (" not in words
    gpu = Step(name="t/gpu", fn=lambda out: None, kind="export", resources=Resources(gpu=1, gpu_type="X9"))
    on_gpu = price_steps([gpu], str(tmp_path), PriceTable(), History(str(tmp_path), [
        Sample("t/e_00000000", "export", None, None, None, 36.0, "x9", 1.0)]))
    # Hours known, no price for an x9: unpriced under a cost limit, priced under an hours limit.
    assert [p.step for p in unpriced(on_gpu, max_cost=1)] == ["t/gpu"] and unpriced(on_gpu, max_device_hours=1) == []
    assert over_budget(on_gpu, max_device_hours=1, refuse_unpriced=True) is None
