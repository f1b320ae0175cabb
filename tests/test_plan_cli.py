"""`marin-assets plan --json` against real materializations in a real DAGSTER_HOME."""

import json
import textwrap

import pytest

from marin_assets import cli
from tests.support.helpers import BIN, run_cli, subprocess_env

DEFS = textwrap.dedent(
    """
    import os
    from marin_assets import build_definitions
    from marin_assets.pipeline.hello import numbers_step, stats_step

    numbers = numbers_step("t/numbers", n=int(os.environ["HELLO_N"]), seed=7)
    stats = stats_step("t/stats", numbers)
    defs = build_definitions([stats])
    """
)


@pytest.fixture
def project(tmp_path, prefix, dagster_home):
    (tmp_path / "defs.py").write_text(DEFS)
    return tmp_path


@pytest.fixture
def plan_json(capsys, monkeypatch):
    """`marin-assets plan --json` in this process (the CLI's `main`; the text test runs the installed command)."""
    def plan(project, select, n):
        monkeypatch.setenv("HELLO_N", str(n))
        capsys.readouterr()
        assert cli.main(["plan", "-f", str(project / "defs.py"), "--select", select, "--json"]) == 0
        return {row["asset_key"]: row for row in json.loads(capsys.readouterr().out)["rows"]}

    return plan


def materialize(project, select, n, check=True):
    return run_cli(BIN / "dagster", "asset", "materialize", "-f", project / "defs.py", "--select", select,
                   env=subprocess_env(HELLO_N=str(n)), check=check)


def test_plan_run_reuse_blocked_and_changed_attrs(project, prefix, plan_json):
    rows = plan_json(project, "t/numbers,t/stats", 10)
    assert {k: r["action"] for k, r in rows.items()} == {"t/numbers": "run", "t/stats": "run"}
    assert rows["t/numbers"]["reason"] == "no output yet"
    assert "after t/numbers" in rows["t/stats"]["reason"]
    assert rows["t/stats"]["output_path"] == f"{prefix}/t/stats_{rows['t/stats']['hash']}"
    assert set(rows["t/stats"]) >= {"asset_key", "output_path", "hash", "action", "reason", "changed"}

    rows = plan_json(project, "t/stats", 10)  # dependency neither materialized nor selected
    assert rows["t/numbers"]["selected"] is False and rows["t/numbers"]["action"] == "blocked"
    assert rows["t/stats"]["action"] == "blocked"
    assert "dependency t/numbers is not materialized" in rows["t/stats"]["reason"]

    materialize(project, "*", 10)
    rows = plan_json(project, "*", 10)
    assert {r["action"] for r in rows.values()} == {"reuse"}
    assert all(r["changed"] == [] for r in rows.values())
    old_hashes = {k: r["hash"] for k, r in rows.items()}

    # n=0 makes generate_numbers fail: a FAILED dependency blocks a selection without it.
    assert materialize(project, "t/numbers", 0, check=False).returncode != 0
    rows = plan_json(project, "t/stats", 0)
    assert rows["t/numbers"]["status"] == "FAILED" and rows["t/numbers"]["action"] == "blocked"
    assert rows["t/stats"]["action"] == "blocked"
    assert rows["t/stats"]["reason"].startswith("dependency t/numbers is FAILED and not in the selection")

    rows = plan_json(project, "*", 0)
    assert rows["t/numbers"]["action"] == "run"
    assert "previous attempt FAILED (ValueError: n must be positive, got 0)" in rows["t/numbers"]["reason"]
    assert rows["t/numbers"]["previous_hash"] == old_hashes["t/numbers"]
    assert rows["t/numbers"]["changed"] == [{"field": "n", "old": 10, "new": 0}]
    assert rows["t/stats"]["changed"] == [
        {"field": "deps[t/numbers]", "old": old_hashes["t/numbers"], "new": rows["t/numbers"]["hash"]}]
    assert "hash changed from" in rows["t/stats"]["reason"]


def test_plan_text_output_names_changed_fields(project):
    materialize(project, "*", 10)
    text = run_cli(BIN / "marin-assets", "plan", "-f", project / "defs.py", "--select", "*",
                   env=subprocess_env(HELLO_N="12")).stdout
    assert "n: 10 -> 12" in text
    assert text.count("run ") == 2
    assert "of the steps to run:" in text and "total: 2 step(s)" in text  # the priced plan under it
