"""Speedrun submissions and their leaderboard: a real tiny Llama run submitted with its measured numbers (FLOPs
as Levanter counts them, hardware FLOPs, time, device-hours, bits per byte), ranked through Dagster among
planted training records whose scores and FLOPs are chosen to make ties, budget overruns and other tracks; the
track a run's FLOPs put it in; downstream scores that rank the highest first; and what each step refuses."""

import dataclasses
import math

import dagster as dg
import pytest

from marin_assets import StepDefinitionError, build_definitions, load_result, materialize_step
from marin_assets.core.step import walk
from marin_assets.dagster.metadata import result_metadata
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.evals.harness import HarnessEval
from marin_assets.pipeline.evals.harness_tasks import HarnessTask
from marin_assets.pipeline.evals.steps import EvalStep
from marin_assets.pipeline.reports.speedrun import (
    TRACKS,
    Author,
    Leaderboard,
    LeaderboardRow,
    SpeedrunError,
    Submission,
    Track,
    leaderboard_step,
    metric_direction,
    speedrun_step,
    track_of,
)
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step
from marin_assets.pipeline.training.cost import FLOPS_FORMULA, RunCost, training_flops_per_token
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult, TrainStep

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
TRACKS_HERE = (Track("tiny", 3e9), Track("small", 6e9))
"""Budgets at the scale of test runs: the real run below spends about 1e8 FLOPs."""
ME = Author("Ada", "Marin tests", "https://example.org/ada")


def planted_run(name: str, flops: float, bpb: float | None, loss: float = 3.0, cost: bool = True) -> TrainStep:
    """A training step whose record is planted: the FLOPs and scores a leaderboard reads, and nothing trained."""
    tokens = 10_000

    def run(out: str) -> TrainResult:
        spent = RunCost(parameters=50_000, flops_per_token=flops / tokens, flops_formula=FLOPS_FORMULA,
                        tokens=tokens, total_flops=flops, tokens_per_second=1e4, flops_per_second=flops / 2,
                        device_kind="cpu", device_count=1, peak_flops_per_device=1e10, peak_basis="measured",
                        peak_source="planted", mfu=flops / 2 / 1e10, levanter_mfu=None, step_seconds=2.0,
                        wall_seconds=5.0, device_hours=5.0 / 3600)
        return TrainResult(run_id=name, steps=10, final_train_loss=loss + 0.1, final_eval_loss=loss,
                           eval_losses={"stories": loss}, tokens_per_second=1e4, checkpoint_steps=[10],
                           checkpoint_dir=out, hf_dir=None, final_eval_bpb=bpb, cost=spent if cost else None)

    return TrainStep(name=f"checkpoints/{name}", fn=run, hash_attrs={"flops": flops, "bpb": bpb, "loss": loss,
                                                                      "cost": cost}, kind="train", model=TINY)


def planted_accuracy(train: TrainStep, acc: float) -> EvalStep:
    """A downstream evaluation of `train` whose record is planted: one multiple-choice task's accuracy."""
    task = HarnessTask(name="stories_cloze", yaml="/planted/stories_cloze.yaml", output_type="multiple_choice",
                       files={})
    return EvalStep(name=f"evals/{train.name.split('/')[1]}-cloze", fn=lambda out: {"tasks": {"stories_cloze": {
        "acc": acc, "acc_stderr": 0.01}}}, deps=[train], hash_attrs={"acc": acc}, kind="eval", evaluates=train,
                    eval_kind=HarnessEval([task]))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A real tiny Llama run on generated stories (eight steps), materialized once, and its record."""
    prefix = str(tmp_path_factory.mktemp("speedrun") / "outputs")
    stories = corpus_step("raw/stories", train_documents=300, validation_documents=30, seed=1, shards=1)
    tokenized = tokenize_step("tokenized/stories", stories, bpe_tokenizer_step("tokenizers/bpe", stories,
                                                                                vocab_size=400))
    train = train_step("checkpoints/real", {"stories": tokenized}, TINY, OptimizerSpec(learning_rate=1e-2),
                       TrainerSpec(num_train_steps=8, train_batch_size=4, checkpoint_every=4, steps_per_eval=4,
                                   max_eval_batches=1))  # as tests/test_run_cost.py: compiled once a session
    for step in walk([train]):
        materialize_step(step, prefix=prefix)
    return prefix, train, load_result(train.output_path_under(prefix), TrainResult)


def test_a_run_belongs_to_the_smallest_track_that_holds_its_flops():
    assert [t.name for t in TRACKS] == ["tiny", "small", "medium"] and TRACKS[0].max_flops == 3e18 / 1e6
    assert track_of(1.8e12).name == "tiny" and track_of(3e12).name == "tiny"  # a budget is inclusive
    assert track_of(3.0001e12).name == "small" and track_of(6e12).name == "small"
    assert track_of(2e13).name == "medium" and track_of(3.1e13) is None
    assert track_of(5e9, TRACKS_HERE[::-1]).name == "small"  # in any order
    assert metric_direction("eval_bpb") and metric_direction("eval_loss/stories") and metric_direction("t/perplexity")
    assert metric_direction("stories_cloze/acc") is False and metric_direction("stories_cloze/acc_norm") is False
    assert metric_direction("tokens_per_second") is None


def test_a_submission_is_its_runs_measured_numbers(real):
    prefix, train, result = real
    step = speedrun_step("speedrun/real", train, author=ME, description="Llama at 32 wide, eight steps", track="tiny",
                         tracks=TRACKS_HERE)
    got = load_result(materialize_step(step, prefix=prefix).output_path, Submission)
    cost = result.cost
    assert got.run == "checkpoints/real" and got.author == ME and got.declared_track == "tiny"
    assert got.model_flops == cost.total_flops == training_flops_per_token(TINY, result.vocab_size) * cost.tokens
    assert got.tokens == 8 * 4 * 64 and got.parameters == result.parameter_count
    assert math.isclose(got.hardware_flops, cost.step_seconds * cost.device_count * cost.peak_flops_per_device)
    assert got.hardware_flops > got.model_flops  # a CPU run is far from its peak
    assert got.training_seconds == cost.step_seconds and got.wall_seconds == cost.wall_seconds >= cost.step_seconds
    assert got.device_hours == cost.device_hours and got.device == "1 × cpu" and got.peak_basis == "measured"
    assert got.track == "tiny" and got.within_budget and got.declared_budget == 3e9
    assert got.metrics == {"train_loss": result.final_train_loss, "eval_loss": result.final_eval_loss,
                           "eval_bpb": result.final_eval_bpb, "eval_loss/stories": result.eval_losses["stories"]}
    assert 0 < got.metrics["eval_bpb"] < 20


def test_the_leaderboard_ranks_a_track_through_dagster(real, local_ray, dagster_home):
    from resources import StorageResource

    prefix, train, result = real
    real_bpb = result.final_eval_bpb
    runs = {  # name: (FLOPs, eval bpb, declared track)
        "fast": (1e9, real_bpb - 0.5, "tiny"),
        "tied-cheap": (1e9, real_bpb - 0.2, "tiny"),
        "tied-dear": (2e9, real_bpb - 0.2, "tiny"),
        "slow": (2.5e9, real_bpb + 0.5, "tiny"),
        "overspent": (4e9, real_bpb - 1.0, "tiny"),  # the best score, over its budget
        "elsewhere": (5e9, real_bpb - 1.5, "small"),
    }
    submissions = [speedrun_step(f"speedrun/{name}", planted_run(name, flops, bpb), author=f"author-{name}",
                                 description=f"planted: {name}", track=track, tracks=TRACKS_HERE)
                   for name, (flops, bpb, track) in runs.items()]
    submissions.append(speedrun_step("speedrun/real", train, author=ME, description="Llama at 32 wide, eight steps",
                                     track="tiny", tracks=TRACKS_HERE))
    board = leaderboard_step("leaderboards/tiny", submissions, "tiny")  # by eval_bpb, lower first
    defs = build_definitions([board], resources={"storage": StorageResource(prefix=prefix)})
    run = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=dg.DagsterInstance.get())
    assert run.success

    got = load_result(board.output_path_under(prefix), Leaderboard)
    assert got.metric == "eval_bpb" and got.lower_is_better and got.max_flops == 3e9
    assert [(r.rank, r.submission) for r in got.rows] == [
        (1, "speedrun/fast"), (2, "speedrun/tied-cheap"), (2, "speedrun/tied-dear"), (4, "speedrun/real"),
        (5, "speedrun/slow")]
    assert [r.metric for r in got.rows] == sorted(r.metric for r in got.rows)
    assert got.rows[3].metric == real_bpb and got.rows[3].model_flops == result.cost.total_flops
    assert got.rows[3].author == "Ada" and got.rows[3].affiliation == "Marin tests"
    assert {e.submission: e.reason for e in got.excluded} == {
        "speedrun/overspent": "over budget: 4e+09 FLOPs > 3e+09; its FLOPs put it in track 'small'",
        "speedrun/elsewhere": "submitted to track 'small'"}
    assert got.frontier.series["frontier"] == [[result.cost.total_flops, real_bpb], [1e9, real_bpb - 0.5]]

    checks = {(e.asset_key.to_user_string(), e.check_name): e for e in run.get_asset_check_evaluations()}
    assert checks[("leaderboards/tiny", "someone_ranked")].passed
    overspent = checks[("speedrun/overspent", "within_declared_track")]
    assert not overspent.passed and overspent.severity == dg.AssetCheckSeverity.ERROR
    assert "4e+09 FLOPs exceed track 'tiny' (3e+09): the run belongs to track 'small'" in overspent.description
    assert checks[("speedrun/real", "within_declared_track")].passed

    events = {e.asset_key.to_user_string(): e.materialization.metadata for e in run.get_asset_materialization_events()}
    table = events["leaderboards/tiny"]["result.rows"]
    assert isinstance(table, dg.TableMetadataValue)
    assert [(r.data["rank"], r.data["author"]) for r in table.records][:3] == [
        (1, "author-fast"), (2, "author-tied-cheap"), (2, "author-tied-dear")]
    assert {f.name for f in dataclasses.fields(LeaderboardRow)} == set(table.records[0].data)  # every column shown
    excluded = events["leaderboards/tiny"]["result.excluded"]
    assert [r.data["reason"] for r in excluded.records][1] == "submitted to track 'small'"
    assert "frontier" in events["leaderboards/tiny"]["result.frontier"].value  # the inline plot's legend
    assert events["speedrun/real"]["result.model_flops"].value == result.cost.total_flops
    assert events["speedrun/real"]["result.author.name"].value == "Ada"


def test_a_downstream_accuracy_ranks_the_highest_first(tmp_path):
    runs = {name: planted_run(name, flops, 1.0) for name, flops in (("a", 1e9), ("b", 2e9), ("c", 1.5e9))}
    evals = {name: planted_accuracy(train, acc) for (name, train), acc in zip(runs.items(), (0.4, 0.7, 0.4),
                                                                               strict=True)}
    submissions = [speedrun_step(f"speedrun/{n}", runs[n], author="x", description="planted", track="tiny",
                                 tracks=TRACKS_HERE, evaluations=[evals[n]]) for n in runs]
    board = leaderboard_step("leaderboards/cloze", submissions, "tiny", metric="stories_cloze/acc")
    for step in walk([board]):
        materialize_step(step, prefix=str(tmp_path))
    got = load_result(board.output_path_under(str(tmp_path)), Leaderboard)
    assert not got.lower_is_better
    assert [(r.rank, r.submission, r.metric) for r in got.rows] == [
        (1, "speedrun/b", 0.7), (2, "speedrun/a", 0.4), (2, "speedrun/c", 0.4)]  # a tie: fewer FLOPs first
    assert got.frontier.series["frontier"] == [[1e9, 0.4], [2e9, 0.7]]
    a = load_result(submissions[0].output_path_under(str(tmp_path)), Submission)
    assert a.metrics["stories_cloze/acc"] == 0.4 and "stories_cloze/acc_stderr" not in a.metrics
    shown = result_metadata({"rows": [r.__dict__ for r in got.rows]})
    assert [r.data["submission"] for r in shown["result.rows"].records] == ["speedrun/b", "speedrun/a", "speedrun/c"]


def test_bad_submissions_and_leaderboards_say_what_is_wrong(tmp_path):
    run = planted_run("x", 1e9, 1.0)
    with pytest.raises(StepDefinitionError, match=r"unknown track 'huge'; the tracks are tiny \(≤ 3e\+09 FLOPs\),"
                                                  r" small \(≤ 6e\+09 FLOPs\)"):
        speedrun_step("speedrun/x", run, author="x", description="d", track="huge", tracks=TRACKS_HERE)
    with pytest.raises(StepDefinitionError, match="is not a training step"):
        speedrun_step("speedrun/x", corpus_step("raw/c", train_documents=2, validation_documents=1), author="x",
                      description="d", track="tiny")
    with pytest.raises(StepDefinitionError, match="give the author's name"):
        speedrun_step("speedrun/x", run, author=" ", description="d", track="tiny")
    with pytest.raises(StepDefinitionError, match="are not evaluations of 'checkpoints/x'"):
        speedrun_step("speedrun/x", run, author="x", description="d", track="tiny",
                      evaluations=[planted_accuracy(planted_run("y", 1e9, 1.0), 0.5)])
    good = speedrun_step("speedrun/x", run, author="x", description="d", track="tiny", tracks=TRACKS_HERE)
    with pytest.raises(StepDefinitionError, match="unknown track 'medium'"):
        leaderboard_step("leaderboards/x", [good], "medium")
    with pytest.raises(StepDefinitionError, match=r"say whether 'tokens' ranks lowest or highest first"):
        leaderboard_step("leaderboards/x", [good], "tiny", metric="tokens")
    with pytest.raises(StepDefinitionError, match="give speedrun submissions"):
        leaderboard_step("leaderboards/x", [run], "tiny")
    other = speedrun_step("speedrun/y", planted_run("y", 1e9, 1.0), author="y", description="d", track="tiny")
    with pytest.raises(StepDefinitionError, match=r"do not share track 'tiny' .*\['speedrun/(x|y)'\]"):
        leaderboard_step("leaderboards/x", [good, other], "tiny")  # TRACKS' tiny is not TRACKS_HERE's

    # A submission to the track whose run never measured the metric: the leaderboard names it and what it has.
    unmeasured = speedrun_step("speedrun/no-bpb", planted_run("no-bpb", 1e9, None), author="z", description="d",
                               track="tiny", tracks=TRACKS_HERE)
    board = leaderboard_step("leaderboards/x", [good, unmeasured], "tiny")
    for step in walk([board])[:-1]:
        materialize_step(step, prefix=str(tmp_path))
    with pytest.raises(SpeedrunError, match=r"submission 'speedrun/no-bpb' \(run 'checkpoints/no-bpb'\) has no"
                                            r" 'eval_bpb' to rank it by; it has: eval_loss=3, eval_loss/stories=3,"
                                            r" train_loss=3.1"):
        materialize_step(board, prefix=str(tmp_path))
    # A run recorded before costs were: nothing to measure it by.
    uncosted = speedrun_step("speedrun/old", planted_run("old", 1e9, 1.0, cost=False), author="o", description="d",
                             track="tiny", tracks=TRACKS_HERE)
    materialize_step(uncosted.deps[0], prefix=str(tmp_path))
    with pytest.raises(SpeedrunError, match="run 'checkpoints/old' recorded no cost"):
        materialize_step(uncosted, prefix=str(tmp_path))
