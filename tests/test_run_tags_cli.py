"""Run tags from Dagster's command line, as the README documents them: `dagster asset materialize` has no
`--tags` (Dagster 1.13), `dagster job execute --tags` on the implicit asset job `__ASSET_JOB` does, with `-o`
selecting assets by op name. A real `dagster` process in a fresh DAGSTER_HOME; the tags must take effect:
`marin/force` recomputes a cached output, `marin/max-cost` refuses the run before any work, pricing only the
selected assets."""

import json
import subprocess

import dagster as dg

from marin_assets import materialize_step
from marin_assets.core.record import read_record
from marin_assets.core.stores import read_status
from tests.support.helpers import BIN, ROOT, run_cli, subprocess_env
from tests.support.tagged_definitions import numbers, stats

DEFS = ROOT / "tests" / "support" / "tagged_definitions.py"


def execute(env, selection: str, tags: dict[str, str]) -> subprocess.CompletedProcess:
    """`dagster job execute -f DEFS -j __ASSET_JOB -o SELECTION --tags JSON`: the README's command."""
    return run_cli(BIN / "dagster", "job", "execute", "-f", DEFS, "-j", "__ASSET_JOB", "-o", selection,
                   "--tags", json.dumps(tags), env=env, check=False)


def test_dagster_asset_materialize_has_no_tags_option():
    helped = run_cli(BIN / "dagster", "asset", "materialize", "--help", env=subprocess_env())
    assert "--select" in helped.stdout and "--tags" not in helped.stdout  # why the README points elsewhere


def test_tags_given_by_dagster_job_execute_reach_the_run_and_take_effect(tmp_path, dagster_home):
    prefix = tmp_path / "outputs"
    env = subprocess_env(DAGSTER_HOME=str(dagster_home), MARIN_PREFIX=str(prefix))
    materialize_step(numbers, prefix=str(prefix))  # cached: only a forced run recomputes it
    before = read_record(numbers.output_path_under(str(prefix)))

    forced = execute(env, "tagged__numbers", {"marin/force": "true"})
    assert forced.returncode == 0, forced.stderr[-3000:]
    with dg.DagsterInstance.get() as instance:
        (run,) = instance.get_runs()
        assert run.tags.get("marin/force") == "true" and run.status == dg.DagsterRunStatus.SUCCESS
        after = read_record(numbers.output_path_under(str(prefix)))
        assert after.provenance.run_id == run.run_id != before.provenance.run_id  # recomputed by this run

    refused = execute(env, "*tagged__stats", {"marin/max-cost": "0"})
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "run refused before any work by its budget tags: the plan's 1 step(s) to run predict" in said
    assert "most expensive: tagged/stats (" in said and "tagged/other" not in said  # priced: the selection only
    with dg.DagsterInstance.get() as instance:
        last = instance.get_runs(limit=1)[0]
        assert last.tags.get("marin/max-cost") == "0" and last.status == dg.DagsterRunStatus.FAILURE
        assert last.op_selection == ["*tagged__stats"]
    assert read_status(stats.output_path_under(str(prefix))) is None  # nothing ran
