"""The `dg` CLI (dagster-dg-cli) from the project root, as a user runs it: `[tool.dg]` in pyproject.toml
points it at `marin_assets.definitions`, which the root `definitions.py` re-exports for `dagster`.

The instance is a temporary DAGSTER_HOME written by the Makefile's own rule, so the `dg dev` test
also shows that the UI's first visit has no "Join the Dagster community" modal (nux) to dismiss.
Only the cheap hello assets are materialized.
"""

import json
import os
import shutil
import signal
import subprocess
import urllib.request

import pytest
import yaml

from marin_assets.dagster import instance
from tests.support.helpers import BIN, ROOT, run_cli, subprocess_env, wait_for
from tests.support.servers import free_port

VENV_WARNING = "does not match the virtual environment"


def make(*args, cwd=ROOT) -> None:
    run_cli("make", "--no-print-directory", *args, env=subprocess_env(), cwd=cwd)


def nux_enabled(home) -> bool:
    """Whether the instance in `home` would show the sign-up modal (what the UI's `shouldShowNux` reads)."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        return instance.nux_enabled


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A DAGSTER_HOME made by `make $(DAGSTER_HOME)/dagster.yaml` and a fresh storage prefix."""
    tmp = tmp_path_factory.mktemp("dg")
    home = tmp / "home"
    make(f"DAGSTER_HOME={home}", f"{home}/dagster.yaml")
    return subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=str(tmp / "outputs"))


def test_the_instance_the_makefile_writes_has_no_signup_modal(tmp_path):
    new = tmp_path / "new"
    make(f"DAGSTER_HOME={new}", f"{new}/dagster.yaml")
    assert yaml.safe_load((new / "dagster.yaml").read_text()) == instance.LOCAL
    assert instance.LOCAL["nux"] == {"enabled": False}
    assert nux_enabled(new) is False

    old = tmp_path / "old"  # an instance made before nux was set: it keeps its settings and gains the key
    old.mkdir()
    (old / "dagster.yaml").write_text("telemetry:\n  enabled: false\nretention: {}\n")
    assert nux_enabled(old) is True
    os.utime(old / "dagster.yaml", (0, 0))  # older than the Makefile: make remakes it
    make(f"DAGSTER_HOME={old}", f"{old}/dagster.yaml")
    assert yaml.safe_load((old / "dagster.yaml").read_text()) == {"telemetry": {"enabled": False}, "retention": {},
                                                                  **instance.RELIABILITY, "nux": {"enabled": False}}
    assert nux_enabled(old) is False

    # The `.env` rule writes the project-local instance (`.dagster_home/`): run it in a copy of the Makefile.
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    make(".env", f"BIN={BIN}", cwd=tmp_path)
    assert nux_enabled(tmp_path / ".dagster_home") is False
    assert (tmp_path / ".env").read_text() == f"DAGSTER_HOME=${{DAGSTER_HOME:-{tmp_path}/.dagster_home}}\n"

    deploy = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())  # the production instance too
    assert deploy["nux"] == {"enabled": False}
    assert {key: deploy[key] for key in instance.RELIABILITY} == instance.RELIABILITY


def test_dg_checks_and_lists_the_definitions_dagster_loads(env):
    import definitions
    import marin_assets.definitions

    check = run_cli(BIN / "dg", "check", "defs", env=env)
    assert "All definitions loaded successfully." in check.stdout + check.stderr
    assert VENV_WARNING not in check.stdout + check.stderr  # `.venv/bin/dg` needs no activated venv
    # The defs folder's YAML experiments (marin_assets/defs/*/defs.yaml) are checked against their schema first.
    assert "All component YAML validated successfully." in check.stdout

    components = json.loads(run_cli(BIN / "dg", "list", "components", "--json", env=env).stdout)["items"]
    assert "marin_assets.dagster.components.LanguageModelExperiment" in {c["key"] for c in components}

    listed = json.loads(run_cli(BIN / "dg", "list", "defs", "--json", env=env).stdout)
    keys = {a["asset_key"] for a in listed["assets"]}
    assert {"hello/report", "evals/python-docs-llama", "evals/python-docs-llama-harness"} <= keys
    assert definitions.defs is marin_assets.definitions.defs  # the root file re-exports, builds nothing
    graph = definitions.defs.resolve_asset_graph()
    assert keys == {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {s["name"] for s in listed["sensors"]} == {s.name for s in definitions.defs.sensors}
    assert {s["name"] for s in listed["schedules"]} == {s.name for s in definitions.defs.schedules}


def status(env) -> dict[str, dict]:
    out = run_cli(BIN / "marin-assets", "status", "--select", "*hello/report", "--json", env=env).stdout
    return {row["asset_key"]: row for row in json.loads(out)}


def test_dg_launch_materializes_and_dagster_reuses_it(env):
    hello = {"hello/numbers", "hello/stats", "hello/report"}
    assert {k: r["cached"] for k, r in status(env).items()} == dict.fromkeys(hello)  # not materialized yet

    run_cli(BIN / "dg", "launch", "--assets", "*hello/report", env=env)
    first = status(env)
    assert {k: (r["status"], r["cached"]) for k, r in first.items()} == dict.fromkeys(hello, ("SUCCESS", False))
    assert all(os.path.isdir(r["output_path"]) for r in first.values())

    # The `dagster` CLI on the root definitions.py: the same identities and instance, so nothing runs again.
    run_cli(BIN / "dagster", "asset", "materialize", "-f", "definitions.py", "--select", "*hello/report", env=env)
    second = status(env)
    assert {k: (r["status"], r["cached"]) for k, r in second.items()} == dict.fromkeys(hello, ("SUCCESS", True))
    assert {k: r["output_path"] for k, r in second.items()} == {k: r["output_path"] for k, r in first.items()}



def graphql(base: str, query: str) -> dict:
    request = urllib.request.Request(f"{base}/graphql", json.dumps({"query": query}).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        data = json.load(response)
    assert "errors" not in data, data["errors"]
    return data["data"]


LOCATIONS = """{ shouldShowNux
  workspaceOrError { ... on Workspace { locationEntries { name loadStatus
    locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
REPORT = '{ assetNodeOrError(assetKey: {path: ["hello", "report"]}) { ... on AssetNode { groupName opVersion } } }'


def stop(server: subprocess.Popen) -> None:
    """SIGTERM to the whole process group, then SIGKILL: `dagster dev` can ignore SIGTERM for seconds."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def test_dg_dev_serves_the_project_without_the_signup_modal(env, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "dg-dev.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([str(BIN / "dg"), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def loaded():
            assert server.poll() is None, log_path.read_text()[-3000:]
            try:
                data = graphql(base, LOCATIONS)
            except OSError:
                return None
            [entry] = data["workspaceOrError"]["locationEntries"]
            return (data, entry) if entry["loadStatus"] == "LOADED" else None

        data, entry = wait_for(loaded, "dg dev to load the project", timeout=300, interval=0.5)
        assert entry["name"] == "marin_assets"  # [tool.dg.project] code_location_name, as in workspace.yaml
        assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry
        assert data["shouldShowNux"] is False  # the first visit opens on the asset graph
        node = graphql(base, REPORT)["assetNodeOrError"]
        assert node["groupName"] == "hello" and len(node["opVersion"]) == 8  # code_version: the identity hash
    finally:
        stop(server)
    assert server.returncode is not None
