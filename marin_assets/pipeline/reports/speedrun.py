"""Speedrun: training runs submitted to a compute-budget track and ranked on a leaderboard, as Marin's speedrun
does — a submission names its author, says what it tries, and declares the track whose FLOPs budget it stays
within; its numbers (model and hardware FLOPs, wall time, device-hours, losses and downstream scores) are
measured, never declared: they come from the run's record (`RunCost`) and its evaluations.

Tracks are budgets of training model FLOPs (`RunCost.total_flops`, Levanter's count). Marin's are 3e18, 6e18
and 3e19 FLOPs; ours are those divided by a million, so that a CPU run is a speedrun: the demo's Llama (200
steps, 1.8e12 FLOPs) is a `tiny` run. A submission over its declared budget is recorded with its numbers, fails
its `within_declared_track` check, and is listed by every leaderboard as excluded, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.evals.steps import EvalStep
from marin_assets.pipeline.reports.experiment_summary import PlotData
from marin_assets.pipeline.training.training_run import TrainStep

if TYPE_CHECKING:
    from marin_assets.pipeline.training.training_run import TrainResult

TABLE_FILE = "leaderboard.md"
LOWER_IS_BETTER = ("loss", "bpb", "perplexity")
"""A metric named by one of these (or `…_loss`, `…_bpb`) ranks the lowest first (`eval_bpb`, `eval_loss/docs`,
`task/perplexity`)."""
HIGHER_IS_BETTER = ("acc", "acc_norm")
"""A metric named by one of these ranks the highest first (`task/acc`)."""


class SpeedrunError(ValueError):
    """A submission or a leaderboard cannot be made from what the runs recorded."""


@dataclass(frozen=True)
class Track:
    """A speedrun budget: the training model FLOPs a run may spend to compete in it."""

    name: str
    max_flops: float
    """Training model FLOPs (`RunCost.total_flops`) a run of this track spends at most."""


TRACKS = (Track("tiny", 3e12), Track("small", 6e12), Track("medium", 3e13))
"""Marin's TINY, SMALL and MEDIUM budgets (3e18, 6e18, 3e19 FLOPs) divided by a million, for CPU-sized runs."""


def track_of(flops: float, tracks: Sequence[Track] = TRACKS) -> Track | None:
    """The track of a run that spent `flops`: the smallest budget that holds it; None when none does."""
    fitting = [t for t in tracks if flops <= t.max_flops]
    return min(fitting, key=lambda t: t.max_flops) if fitting else None


@dataclass(frozen=True)
class Author:
    """Who submits a speedrun."""

    name: str
    affiliation: str | None = None
    url: str | None = None
    """A page about the author."""


@record_type("speedrun_submission")
@dataclass(frozen=True)
class Submission:
    """A speedrun: who ran what, the track it declared, and what it measured."""

    run: str
    """The training step's name."""
    author: Author
    description: str
    """What the run tries, in a sentence."""
    declared_track: str
    """The track it was submitted to."""
    declared_budget: float
    """That track's FLOPs budget."""
    track: str | None
    """The track its FLOPs put it in (the smallest budget holding them); None when it exceeds every track."""
    within_budget: bool
    """Whether its model FLOPs are within the declared budget (else every leaderboard excludes it)."""
    model_flops: float
    """Training model FLOPs: FLOPs per token × tokens (`RunCost.total_flops`)."""
    hardware_flops: float
    """What the hardware could have done while it trained: training seconds × devices × peak FLOP/s per device
    (Marin's "training hardware FLOPs"; see `peak_basis`)."""
    peak_basis: str
    """`datasheet` or `measured` (a CPU's peak is its measured matmul throughput, an assumption)."""
    parameters: int | None
    tokens: int
    training_seconds: float
    """Sum of the per-step durations (Marin's training time; compilation included)."""
    wall_seconds: float
    """Wall time of the training calls: startup, evaluation and checkpoints included."""
    device_hours: float
    device: str
    """`count × device_kind`."""
    mfu: float
    """Model FLOPs utilization against `peak_basis`'s peak."""
    metrics: dict[str, float]
    """What a leaderboard ranks by: `train_loss`, `eval_loss`, `eval_bpb` and `eval_loss/<set>` from the run's
    record, and each evaluation's numbers (`loss`, `bpb`, `<task>/acc` …)."""


def run_metrics(result: TrainResult) -> dict[str, float]:
    """A training record's final losses by metric name (those it recorded)."""
    found = {"train_loss": result.final_train_loss, "eval_loss": result.final_eval_loss,
             "eval_bpb": result.final_eval_bpb, **{f"eval_loss/{k}": v for k, v in result.eval_losses.items()}}
    return {k: float(v) for k, v in found.items() if v is not None}


def submission(run: str, result: TrainResult, author: Author, description: str, track: Track,
               tracks: Sequence[Track], evaluations: Mapping[str, Mapping[str, float]] | None = None) -> Submission:
    """The submission of training run `run` (its record `result`) to `track`, with the numbers of its
    `evaluations` (step name → numbers) among its metrics."""
    cost = result.cost
    if cost is None:
        raise SpeedrunError(f"run {run!r} recorded no cost (made before costs were recorded): re-materialize it"
                            " with force to measure its FLOPs")
    metrics = run_metrics(result)
    given: dict[str, str] = {}
    for step, numbers in (evaluations or {}).items():
        for key, value in numbers.items():
            if key in metrics:
                raise SpeedrunError(f"run {run!r}: metric {key!r} is given by {given.get(key, 'its record')} and by"
                                    f" evaluation {step!r}; submit one of them")
            given[key] = f"evaluation {step!r}"
            metrics[key] = float(value)
    derived = track_of(cost.total_flops, tracks)
    return Submission(
        run=run, author=author, description=description, declared_track=track.name, declared_budget=track.max_flops,
        track=derived.name if derived else None, within_budget=cost.total_flops <= track.max_flops,
        model_flops=cost.total_flops,
        hardware_flops=cost.step_seconds * cost.device_count * cost.peak_flops_per_device,
        peak_basis=cost.peak_basis, parameters=cost.parameters, tokens=cost.tokens,
        training_seconds=cost.step_seconds, wall_seconds=cost.wall_seconds, device_hours=cost.device_hours,
        device=f"{cost.device_count} × {cost.device_kind}", mfu=cost.mfu, metrics=metrics)


def within_declared_track(output_path: str, result: dict) -> CheckOutcome:
    """The run's model FLOPs are within the budget of the track it was submitted to."""
    flops, budget, track = result["model_flops"], result["declared_budget"], result["declared_track"]
    if result["within_budget"]:
        return CheckOutcome(True, f"{flops:.3g} FLOPs within track {track!r} ({budget:.3g})",
                            {"model_flops": flops, "budget": budget})
    where = f"track {result['track']!r}" if result.get("track") else "no track"
    return CheckOutcome(False, f"{flops:.3g} FLOPs exceed track {track!r} ({budget:.3g}): the run belongs to {where}",
                        {"model_flops": flops, "budget": budget})


WITHIN_DECLARED_TRACK = Check("within_declared_track", within_declared_track,
                              "The run's training FLOPs are within the budget of the track it was submitted to.")


def _tracks_checked(where: str, tracks: Sequence[Track]) -> tuple[Track, ...]:
    names = [t.name for t in tracks]
    if not tracks or len(set(names)) != len(names) or any(not t.max_flops > 0 for t in tracks):
        raise StepDefinitionError(f"{where}: tracks need distinct names and positive budgets, got {list(tracks)}")
    return tuple(sorted(tracks, key=lambda t: t.max_flops))


def _track_named(where: str, name: str, tracks: Sequence[Track]) -> Track:
    for t in tracks:
        if t.name == name:
            return t
    raise StepDefinitionError(f"{where}: unknown track {name!r}; the tracks are "
                              + ", ".join(f"{t.name} (≤ {t.max_flops:.3g} FLOPs)" for t in tracks))


@dataclass(frozen=True, eq=False)
class SpeedrunStep(Step):
    """A speedrun submission: leaderboards find submissions by this type and check their tracks."""

    train: Step = field(kw_only=True)
    """The training step submitted."""
    declared_track: str = field(kw_only=True)
    tracks: tuple[Track, ...] = field(kw_only=True)
    """The tracks it was submitted under (its declared one among them)."""


def speedrun_step(name: str, train: Step, *, author: Author | str, description: str, track: str,
                  evaluations: Sequence[Step] = (), tracks: Sequence[Track] = TRACKS) -> SpeedrunStep:
    """A submission of training run `train` to speedrun track `track`: author and description said, the numbers measured
    from its record (FLOPs, time, device-hours, final losses) and from `evaluations` of it (their scores join its
    metrics). A run over its track's budget is recorded, fails the `within_declared_track` check and is excluded
    from every leaderboard.

    Identity: `author`, `description`, `track`, `tracks` (and `train`, `evaluations`).
    """
    where = f"speedrun {name!r}"
    if not isinstance(train, TrainStep):
        raise StepDefinitionError(f"{where}: submits {getattr(train, 'name', train)!r}, which is not a training step"
                                  " (train_step, sft_step)")
    who = Author(author) if isinstance(author, str) else author
    if not isinstance(who, Author) or not who.name.strip():
        raise StepDefinitionError(f"{where}: give the author's name (a str or an Author), got {author!r}")
    if not description.strip():
        raise StepDefinitionError(f"{where}: describe what the run tries, in a sentence")
    checked = _tracks_checked(where, tracks)
    declared = _track_named(where, track, checked)
    strays = [getattr(e, "name", repr(e)) for e in evaluations if not isinstance(e, EvalStep) or e.evaluates != train]
    if strays:
        raise StepDefinitionError(f"{where}: {strays} are not evaluations of {train.name!r} (eval_step, loss_eval_step,"
                                  " harness_eval_step on it)")
    evaluated = [e for e in evaluations if isinstance(e, EvalStep)]  # all of them, as checked above

    def run(out: str) -> Submission:
        from marin_assets.core.record import load_result, read_record
        from marin_assets.pipeline.training.training_run import TrainResult

        scores = {e.name: e.eval_kind.numbers(read_record(e.output_path).result) for e in evaluated}
        return submission(train.name, load_result(train, TrainResult), who, description, declared, checked, scores)

    return SpeedrunStep(name=name, fn=run, deps=[train, *evaluations],
                        hash_attrs={"author": who, "description": description, "track": declared,
                                    "tracks": list(checked)},
                        kind="report", description=made_by(submission), checks=[WITHIN_DECLARED_TRACK],
                        train=train, declared_track=declared.name, tracks=checked)


@dataclass(frozen=True)
class LeaderboardRow:
    """A ranked submission."""

    rank: int
    """1 for the best; submissions with equal scores share a rank (1, 1, 3)."""
    submission: str
    """The speedrun step."""
    run: str
    author: str
    affiliation: str | None
    description: str
    metric: float
    """Its score on the leaderboard's metric."""
    model_flops: float
    hardware_flops: float
    device_hours: float
    wall_seconds: float
    training_seconds: float
    parameters: int | None
    tokens: int
    device: str
    mfu: float


@dataclass(frozen=True)
class ExcludedRun:
    """A submission a leaderboard does not rank, and why."""

    submission: str
    run: str
    author: str
    declared_track: str
    track: str | None
    """The track its FLOPs put it in."""
    model_flops: float
    metric: float | None
    reason: str
    """`submitted to track 'small'`, `over budget: 4.1e+08 FLOPs > 3e+08`."""


@record_type("speedrun_leaderboard")
@dataclass(frozen=True)
class Leaderboard:
    """The submissions of one track ranked by one metric; the others listed with the reason they are not."""

    track: str
    max_flops: float
    """The track's FLOPs budget."""
    metric: str
    lower_is_better: bool
    rows: list[LeaderboardRow]
    """Best first; ties in the metric share a rank and are listed by fewer FLOPs first."""
    excluded: list[ExcludedRun]
    frontier: PlotData
    """The best score reachable within each amount of model FLOPs among the ranked runs (the Pareto frontier)."""
    table_file: str
    """The ranked rows as a Markdown table under the output path."""


def metric_direction(metric: str) -> bool | None:
    """True when a metric ranks the lowest first (a loss, bits per byte, a perplexity), False when the highest
    does (an accuracy), None when its name does not say."""
    for part in reversed(metric.split("/")):  # `task/acc`, `eval_loss/docs`: the part that names a measure
        if part in HIGHER_IS_BETTER:
            return False
        if any(part == s or part.endswith(f"_{s}") for s in LOWER_IS_BETTER):
            return True
    return None


def rank(submissions: Mapping[str, Submission], track: Track, metric: str, lower_is_better: bool = True,
         output_path: str | None = None) -> Leaderboard:
    """The leaderboard of `track` by `metric` over `submissions` (speedrun step name → `Submission`), written as
    `leaderboard.md` under `output_path` when given. A submission to another track, or over its budget, is
    excluded with the reason; one to this track that lacks the metric is an error."""
    ranked: list[tuple[str, Submission, float]] = []
    excluded: list[ExcludedRun] = []
    for name, sub in submissions.items():
        value = sub.metrics.get(metric)
        reason = None
        if sub.declared_track != track.name:
            reason = f"submitted to track {sub.declared_track!r}"
        elif sub.model_flops > track.max_flops:
            over = f"; its FLOPs put it in track {sub.track!r}" if sub.track else "; more than any track allows"
            reason = f"over budget: {sub.model_flops:.3g} FLOPs > {track.max_flops:.3g}{over}"
        elif value is None:
            raise SpeedrunError(f"submission {name!r} (run {sub.run!r}) has no {metric!r} to rank it by; it has: "
                                + (", ".join(f"{k}={v:.4g}" for k, v in sorted(sub.metrics.items())) or "nothing")
                                + ". Rank by one of those, or give the run what measures it (validation data, an"
                                  " evaluation)")
        if reason is not None:
            excluded.append(ExcludedRun(name, sub.run, sub.author.name, sub.declared_track, sub.track,
                                        sub.model_flops, value, reason))
        else:
            ranked.append((name, sub, float(value)))  # type: ignore[arg-type]
    sign = 1.0 if lower_is_better else -1.0
    ranked.sort(key=lambda r: (sign * r[2], r[1].model_flops, r[0]))
    rows: list[LeaderboardRow] = []
    for i, (name, sub, value) in enumerate(ranked):
        place = rows[-1].rank if rows and rows[-1].metric == value else i + 1
        rows.append(LeaderboardRow(
            rank=place, submission=name, run=sub.run, author=sub.author.name, affiliation=sub.author.affiliation,
            description=sub.description, metric=value, model_flops=sub.model_flops, hardware_flops=sub.hardware_flops,
            device_hours=sub.device_hours, wall_seconds=sub.wall_seconds, training_seconds=sub.training_seconds,
            parameters=sub.parameters, tokens=sub.tokens, device=sub.device, mfu=sub.mfu))
    board = Leaderboard(track.name, track.max_flops, metric, lower_is_better, rows, excluded,
                        PlotData(f"{metric} against training FLOPs: the frontier of track {track.name}", "model FLOPs",
                                 metric, True, {"frontier": frontier(rows, lower_is_better)}),
                        TABLE_FILE)
    if output_path is not None:
        fs, target = fsspec.core.url_to_fs(join_path(output_path, TABLE_FILE))
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(target, "w") as f:
            f.write(markdown_table(board))
    return board


def frontier(rows: Sequence[LeaderboardRow], lower_is_better: bool = True) -> list[list[float]]:
    """[model FLOPs, score] of the runs no cheaper run beats or ties, by FLOPs: the best score within each budget."""
    points: list[list[float]] = []
    for row in sorted(rows, key=lambda r: (r.model_flops, r.metric if lower_is_better else -r.metric)):
        if not points or (row.metric < points[-1][1] if lower_is_better else row.metric > points[-1][1]):
            points.append([row.model_flops, row.metric])
    return points


_COLUMNS = [("rank", "rank", "{}"), ("submission", "submission", "{}"), ("author", "author", "{}"),
            ("metric", "metric", "{:.4f}"), ("model FLOPs", "model_flops", "{:.3g}"),
            ("hardware FLOPs", "hardware_flops", "{:.3g}"), ("device-h", "device_hours", "{:.4f}"),
            ("wall s", "wall_seconds", "{:,.1f}"), ("params", "parameters", "{:,}"), ("device", "device", "{}"),
            ("description", "description", "{}")]


def markdown_table(board: Leaderboard) -> str:
    """The ranked rows as a Markdown table (its metric column named after the metric), then the excluded runs."""
    titles = [board.metric if key == "metric" else title for title, key, _ in _COLUMNS]
    lines = [f"# Track {board.track} (≤ {board.max_flops:.3g} training FLOPs), by {board.metric}"
             f" ({'lower' if board.lower_is_better else 'higher'} is better)", "",
             "| " + " | ".join(titles) + " |", "|" + "---|" * len(_COLUMNS)]
    for row in board.rows:
        cells = [("—" if getattr(row, key) is None else fmt.format(getattr(row, key))) for _, key, fmt in _COLUMNS]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if board.excluded:
        lines += ["", "Excluded:", ""] + [f"- {e.submission} ({e.author}): {e.reason}" for e in board.excluded]
    return "\n".join(lines) + "\n"


def someone_ranked(output_path: str, result: dict) -> CheckOutcome:
    """At least one submission is ranked (a track whose every run is excluded has no leaderboard)."""
    rows, excluded = result.get("rows") or [], result.get("excluded") or []
    if rows:
        best = rows[0]
        return CheckOutcome(True, f"{len(rows)} ranked, {len(excluded)} excluded; best {best['submission']}"
                                  f" ({best['metric']:.4g})", {"ranked": len(rows), "excluded": len(excluded)})
    return CheckOutcome(False, f"no submission ranked; {len(excluded)} excluded", {"ranked": 0,
                                                                                  "excluded": len(excluded)})


SOMEONE_RANKED = Check("someone_ranked", someone_ranked, "At least one submission is ranked on the leaderboard.")


def leaderboard_step(name: str, submissions: Sequence[Step], track: str, metric: str = "eval_bpb",
                     lower_is_better: bool | None = None) -> Step:
    """The leaderboard of speedrun track `track`: its submissions ranked by `metric` (ties share a rank, fewer
    FLOPs listed first), the others listed as excluded with the reason. `lower_is_better`: None reads it from the
    metric's name (losses, bpb, perplexity: lower; acc: higher).

    Identity: `track`, `metric`, `lower_is_better` (as read from the metric), the names of `submissions` (and those
    steps).
    """
    where = f"leaderboard {name!r}"
    strays = [getattr(s, "name", repr(s)) for s in submissions if not isinstance(s, SpeedrunStep)]
    if strays or not submissions:
        raise StepDefinitionError(f"{where}: give speedrun submissions (speedrun_step); got {strays or 'none'}")
    names = [s.name for s in submissions]
    if len(set(names)) != len(names):
        raise StepDefinitionError(f"{where}: a submission is given twice: {sorted(names)}")
    subs: list[SpeedrunStep] = list(submissions)  # type: ignore[arg-type]
    known = {t.name: t for s in subs for t in s.tracks}
    chosen = _track_named(where, track, list(known.values()))
    disagree = sorted(s.name for s in subs if chosen not in s.tracks)
    if disagree:
        raise StepDefinitionError(f"{where}: the submissions do not share track {chosen.name!r} ({chosen.max_flops:.3g}"
                                  f" FLOPs): {disagree} define it otherwise or not at all")
    direction = metric_direction(metric) if lower_is_better is None else lower_is_better
    if direction is None:
        raise StepDefinitionError(f"{where}: say whether {metric!r} ranks lowest or highest first"
                                  " (lower_is_better=True or False)")

    def run(out: str) -> Leaderboard:
        from marin_assets.core.record import load_result

        return rank({s.name: load_result(s, Submission) for s in subs}, chosen, metric, direction, out)

    return Step(name=name, fn=run, deps=subs, kind="report", description=made_by(rank),
                hash_attrs={"track": chosen, "metric": metric, "lower_is_better": direction, "submissions": names},
                checks=[SOMEONE_RANKED])


__all__ = ["TRACKS", "Author", "ExcludedRun", "Leaderboard", "LeaderboardRow", "SpeedrunError", "SpeedrunStep",
           "Submission", "Track", "frontier", "leaderboard_step", "metric_direction", "rank", "run_metrics",
           "speedrun_step", "submission", "track_of"]

