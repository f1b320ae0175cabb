"""A materialization with the Dagster instance on a real PostgreSQL server, configured by the
production example `deploy/dagster.yaml` (credentials from the environment)."""

import shutil
import subprocess

import dagster as dg
import psycopg2
import pytest

from tests.support.helpers import BIN, ROOT, subprocess_env
from tests.support.postgres_server import postgres_server


@pytest.fixture(scope="module")
def postgres():
    with postgres_server() as server:
        yield server


def test_runs_and_materializations_live_in_postgres(postgres, tmp_path, prefix, monkeypatch):
    host, port, user, db = postgres
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    pg_env = {"DAGSTER_PG_HOST": host, "DAGSTER_PG_PORT": str(port), "DAGSTER_PG_USER": user,
              "DAGSTER_PG_PASSWORD": "", "DAGSTER_PG_DB": db}
    env = subprocess_env(DAGSTER_HOME=str(home), **pg_env)
    run = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-f", "definitions.py",
                          "--select", "*hello/report"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not list(home.glob("**/*.db"))  # no SQLite storage was used

    for name, value in {"DAGSTER_HOME": str(home), **pg_env}.items():
        monkeypatch.setenv(name, value)
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        [dagster_run] = instance.get_runs()
        assert dagster_run.status == dg.DagsterRunStatus.SUCCESS
        event = instance.get_latest_materialization_event(dg.AssetKey(["hello", "report"]))
        assert event.run_id == dagster_run.run_id
        assert event.asset_materialization.metadata["output_path"].value.startswith(prefix)

    with psycopg2.connect(host=host, port=port, user=user, dbname=db) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, status FROM runs")
        assert cur.fetchall() == [(dagster_run.run_id, "SUCCESS")]
        cur.execute("SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'")
        assert cur.fetchone()[0] == 3  # numbers, stats, report
