"""Quiet runs (issue 29): `marin-assets materialize` and `tick` print a line per asset, not Dagster's DEBUG log;
the full output goes to a log file, the run's events to the instance; a failure names the asset, the cause and
the log; `status` says "not materialized", never `None`.

Through the real CLI, on hello-world-sized definitions (`tests/support/quiet_definitions.py`), one instance and
prefix for the module: the runs build on each other (first computed, then cached, then a failure).
"""

import json
import re
import time
from pathlib import Path

import dagster as dg
import pytest

from marin_assets.dagster.console import LOSS_LINES, RunPresenter
from marin_assets.dagster.instance import write_instance_yaml
from tests.support.helpers import BIN, ROOT, run_cli, subprocess_env
from tests.support.quiet_definitions import CHATTY_LINES

DEFINITIONS = ROOT / "tests" / "support" / "quiet_definitions.py"
HELLO = ["hello/numbers", "hello/stats", "hello/report"]
SELECTION = "*hello/report,quiet/chatty"


def cli(env, *args, check=True):
    return run_cli(BIN / "marin-assets", *args, "-f", DEFINITIONS, env=env, check=check)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The commands of the module, in order, on one fresh instance and prefix."""
    tmp = tmp_path_factory.mktemp("quiet")
    home = tmp / "dagster_home"
    home.mkdir()
    write_instance_yaml(home / "dagster.yaml")
    env = subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=str(tmp / "outputs"))
    done = {"env": env, "home": home}
    done["status_before"] = cli(env, "status", "--select", "*")
    done["first"] = cli(env, "materialize", "--select", SELECTION)
    done["second"] = cli(env, "materialize", "--select", SELECTION)
    done["verbose"] = cli(env, "materialize", "--select", "hello/numbers", "--verbose")
    done["failed"] = cli(env, "materialize", "--select", "quiet/fails", check=False)
    done["failed_on_ray"] = cli(env, "materialize", "--select", "quiet/fails-on-ray", check=False)
    done["tick"] = cli(env, "tick", "quiet_once", check=False)
    done["status_after"] = cli(env, "status", "--select", "*")
    return done


def lines(proc) -> list[str]:
    return proc.stdout.splitlines()


def log_file(proc) -> Path:
    """The log file the command's first line names."""
    found = re.search(r"everything printed goes to (\S+)", proc.stdout)
    assert found, proc.stdout
    return Path(found.group(1))


def test_a_first_run_prints_a_line_per_asset_and_keeps_the_rest_in_the_log(runs):
    first = runs["first"]
    out = lines(first)
    assets = [*HELLO, "quiet/chatty"]
    by_asset: dict[str, list[str]] = {}
    for line in out[1:-2]:  # started (it did work), then computed with its seconds
        words = line.split()
        by_asset.setdefault(next(w for w in words if w in assets), []).append(words[0])
        if words[0] == "computed":
            assert re.match(r"  computed +(\d+\.\d s|\d+m \d\ds)  ", line), line
    assert by_asset == {asset: ["started", "computed"] for asset in assets}, out
    assert out[-2].startswith("4 assets: 4 computed, 0 cached in ")
    assert len(out) == 1 + 2 * len(assets) + 2, out  # the header, two lines per asset, the summary and where
    # Nothing else reaches the terminal: no Dagster DEBUG line, nothing the light step printed in this process.
    assert "DEBUG" not in first.stdout + first.stderr
    assert "chatty line" not in first.stdout + first.stderr and first.stderr.strip() == ""
    log = log_file(first).read_text()  # ... it is all in the log file, as --verbose would print it
    assert " - DEBUG - " in log and "STEP_START" in log
    assert all(f"chatty line {i}" in log for i in range(CHATTY_LINES))


def test_the_run_is_recorded_in_the_instance_like_any_dagster_run(runs, monkeypatch):
    run_id = re.search(r"/runs/([0-9a-f-]{36})", runs["first"].stdout).group(1)
    monkeypatch.setenv("DAGSTER_HOME", str(runs["home"]))
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS
        events = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        materialized = {m.asset_key.to_user_string(): m.metadata["cached"].value
                        for m in (e.asset_materialization for e in events) if m is not None}
        assert materialized == dict.fromkeys([*HELLO, "quiet/chatty"], False)
        steps = {e.user_message for e in instance.all_logs(run_id) if e.dagster_event is None}
        assert {f"[quiet/chatty] chatty line {i}" for i in range(CHATTY_LINES)} <= steps  # the UI shows every line


def test_a_second_run_prints_one_cached_line_per_asset(runs):
    out = lines(runs["second"])
    body = out[1:-2]
    assert sorted(line.split()[-1] for line in body) == sorted([*HELLO, "quiet/chatty"])
    assert all(line.split()[0] == "cached" for line in body), out
    assert out[-2].startswith("4 assets: 0 computed, 4 cached in ")


def test_verbose_prints_everything_here(runs):
    verbose = runs["verbose"]
    assert " - DEBUG - " in verbose.stderr and "STEP_START" in verbose.stderr
    assert "everything printed goes to" not in verbose.stdout


def test_a_failure_names_the_asset_the_cause_and_where_the_log_is(runs):
    failed = runs["failed"]
    assert failed.returncode == 1
    out = failed.stdout
    assert re.search(r"^  FAILED +\d+\.\d s  quiet/fails", out, re.MULTILINE), out
    assert "ValueError: the numbers' mean is " in out and "not 42.0" in out
    assert "DagsterExecutionStepExecutionError" not in out  # the step's own exception, not Dagster's wrapper
    assert f"full output: {log_file(failed)}" in out and log_file(failed).exists()
    assert re.search(r"events: http://127\.0\.0\.1:3000/runs/[0-9a-f-]{36}", out)
    assert out.splitlines()[-1] == "marin-assets materialize: failed: quiet/fails (the cause is above)"
    log = log_file(failed).read_text()  # the whole stack is in the log
    assert "Stack Trace:" in log and 'in mean_must_be\n    raise ValueError(f"the numbers' in log
    raised = re.search(r'^\s*at File "([^"]+)", line (\d+), in (\S+)$', out, re.MULTILINE)
    assert raised and raised.group(1).endswith("quiet_definitions.py") and raised.group(3) == "mean_must_be", out


def test_a_step_failing_on_ray_shows_the_line_that_raised_on_the_worker(runs):
    """Not the driver's re-raise in execution/ray_runner.py: the user's line, where it ran."""
    failed = runs["failed_on_ray"]
    assert failed.returncode == 1
    out = failed.stdout
    assert "ValueError: the numbers' mean is " in out and "not 41.0" in out, out
    raised = re.search(r'^\s*at File "([^"]+)", line (\d+), in (\S+)$', out, re.MULTILINE)
    assert raised, out
    assert raised.group(1).endswith("tests/support/quiet_definitions.py") and raised.group(3) == "mean_must_be", out
    source = (ROOT / "tests" / "support" / "quiet_definitions.py").read_text().splitlines()
    assert "raise ValueError" in source[int(raised.group(2)) - 1]


def test_a_quiet_tick_prints_a_line_per_run_as_it_ends_and_a_failed_runs_cause(runs):
    tick = runs["tick"]
    assert tick.returncode == 1
    *details, last = lines(tick)
    assert re.match(r"failed +\d+\.\d s  partition -\s+hello/report, quiet/fails  \(run [0-9a-f-]{36}\)$", last)
    assert re.match(r"  FAILED +\d+\.\d s  quiet/fails$", details[0])  # no line per asset that went well
    assert any("ValueError: the numbers' mean is" in line for line in details[1:])
    assert any(f"full output: {Path(runs['home'])}" in line for line in details[1:])
    assert "DEBUG" not in tick.stdout + tick.stderr


def test_status_says_not_materialized_never_none(runs):
    before = {line.split()[0]: line for line in lines(runs["status_before"])}
    assert set(before) == {*HELLO, "quiet/chatty", "quiet/fails", "quiet/fails-on-ray"}
    assert all("not materialized" in line and "None" not in line for line in before.values())
    after = {line.split()[0]: line.split()[1:] for line in lines(runs["status_after"])}
    assert after["hello/report"][:3] == ["SUCCESS", "cached:", "true"]  # the tick's run: a cache hit
    assert after["quiet/chatty"][:3] == ["SUCCESS", "cached:", "true"]
    assert after["quiet/fails"][0] == "FAILED" and after["quiet/fails-on-ray"][0] == "FAILED"
    as_json = {r["asset_key"]: r for r in json.loads(cli(runs["env"], "status", "--select", "*", "--json").stdout)}
    assert as_json["quiet/fails"]["cached"] is None and as_json["quiet/fails"]["status"] == "FAILED"  # null for scripts


def user_line(step_key: str, message: str) -> dg.EventLogEntry:
    return dg.EventLogEntry(error_info=None, level=20, user_message=message, run_id="r", timestamp=time.time(),
                            step_key=step_key, job_name="j", dagster_event=None)


class Terminal:
    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_a_trainings_loss_is_shown_as_it_falls_at_most_once_a_tenth():
    """The lines a Levanter training relays (formats of tqdm_loggable's progress log and Levanter's evaluation
    callback, as a run of the demo relays them): a 200-step run logging its progress every step still shows at
    most one loss line per tenth of its steps, plus the last; an evaluation's own loss is not a training's."""
    terminal = Terminal()
    presenter = RunPresenter(terminal)
    train = "checkpoints__demo_llama"
    presenter(user_line(train, "[checkpoints/demo-llama] I20261126 06:45:38 1 tqdm_loggable.tqdm_logging "
                               "Progress on:train -/200 rate:- remaining:? elapsed:00:00 postfix:-"))
    for step in range(1, 201):
        loss = 7.0 - 2.5 * step / 200
        presenter(user_line(train, f"[checkpoints/demo-llama] I20261126 06:46:00 1 tqdm_loggable.tqdm_logging "
                                   f"Progress on:train {step}.00it/200it rate:3.1it/s remaining:00:10 "
                                   f"elapsed:00:30 postfix:loss={loss:.3f}"))
        if step % 50 == 0:
            presenter(user_line(train, f"[checkpoints/demo-llama] INFO levanter.checkpoint: Saving checkpoint at step "
                                       f"{step}."))
            presenter(user_line(train, f"[checkpoints/demo-llama] INFO levanter.eval: eval loss: {loss + 0.1:.3f}"))
    presenter(user_line("evals__demo_llama", "[evals/demo-llama] INFO levanter.eval: eval loss: 4.400"))
    shown = terminal.text.splitlines()
    assert shown[0].split() == ["started", train] and shown[-1].split() == ["started", "evals__demo_llama"]
    train_lines = [line.split() for line in shown if "train loss" in line]
    eval_lines = [line.split() for line in shown if "eval loss" in line]
    assert 5 <= len(train_lines) <= LOSS_LINES + 1
    assert train_lines[-1] == ["step", "200/200", "train", "loss", "4.500"]
    losses = [float(line[-1]) for line in train_lines]
    assert losses == sorted(losses, reverse=True)  # falling, as the run logged it
    assert [line[1] for line in eval_lines] == ["50/200", "100/200", "150/200", "200/200"]
    assert "4.400" not in terminal.text


def test_a_selection_that_cannot_run_is_refused_before_anything_runs(monkeypatch, tmp_path):
    from marin_assets import cli as marin_cli

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "outputs"))
    with pytest.raises(SystemExit, match=r"--select 'nope/x': .*\['nope/x'\] were selected, but no AssetsDefinition"):
        marin_cli.main(["materialize", "-f", str(DEFINITIONS), "--select", "nope/x"])
    with pytest.raises(SystemExit, match="'hello/report' has no partitioned asset, yet --partition was given"):
        marin_cli.main(["materialize", "-f", str(DEFINITIONS), "--select", "hello/report", "--partition", "5"])
    assert not (tmp_path / "outputs").exists()  # nothing ran
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.chdir(tmp_path)  # no ./.env to find an instance in either
    with pytest.raises(SystemExit, match="DAGSTER_HOME is not set"):
        marin_cli.main(["materialize", "-f", str(DEFINITIONS), "--select", "hello/report"])
