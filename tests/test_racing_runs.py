"""Racing Dagster runs: separate `dagster asset materialize` processes, one shared instance and
prefix. The lease makes each output computed once; every run succeeds with the same output."""

import subprocess
import textwrap
from collections import Counter

import dagster as dg

from marin_assets.core.record import read_record
from marin_assets.core.status import Status
from marin_assets.core.stores import read_status
from tests.support.helpers import BIN, ROOT, subprocess_env

DEFS = textwrap.dedent("""
    import functools
    from marin_assets import Step, build_definitions
    from resources import StorageResource
    from tests.support.race_steps import counted

    shared = Step(name="race/shared", fn=functools.partial(counted, "shared", 3.0), hash_attrs={"v": 1})
    left = Step(name="race/left", fn=functools.partial(counted, "left", 0.5), deps=[shared])
    right = Step(name="race/right", fn=functools.partial(counted, "right", 0.5), deps=[shared])
    storage = StorageResource(heartbeat_interval=1.0, stale_timeout=30.0, poll_interval=0.2)
    defs = build_definitions([left, right], resources={"storage": storage})
""")


def launch(tmp_path, env, select):
    return subprocess.Popen([str(BIN / "dagster"), "asset", "materialize", "-f", str(tmp_path / "defs.py"),
                             "--select", select], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def setup(tmp_path, dagster_home, prefix):
    (tmp_path / "defs.py").write_text(DEFS)
    # The instance exists before the race, as it does in real use: processes creating a fresh
    # SQLite instance at the same moment can both stamp its schema version (a Dagster race).
    dg.DagsterInstance.get().get_runs()
    events = tmp_path / "events"
    return events, subprocess_env(RACE_EVENTS=str(events), DAGSTER_HOME=str(dagster_home), MARIN_PREFIX=prefix)


def calls(events) -> Counter:
    return Counter(line.split()[0] for line in events.read_text().splitlines()) if events.exists() else Counter()


def test_ten_runs_racing_for_one_asset_compute_it_once(tmp_path, dagster_home, prefix):
    events, env = setup(tmp_path, dagster_home, prefix)
    procs = [launch(tmp_path, env, "race/shared") for _ in range(10)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, outputs[0][-3000:]
    assert calls(events) == Counter({"shared": 1})  # the function ran exactly once

    instance = dg.DagsterInstance.get()
    runs = instance.get_runs()
    assert len(runs) == 10 and {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    events_ = instance.fetch_materializations(dg.AssetKey(["race", "shared"]), limit=20).records
    paths = {e.asset_materialization.metadata["output_path"].value for e in events_}
    cached = sorted(e.asset_materialization.metadata["cached"].value for e in events_)
    assert len(events_) == 10 and len(paths) == 1 and cached == [False] + [True] * 9
    [out] = paths
    assert read_status(out).status is Status.SUCCESS
    record = read_record(out)
    assert record.result["pid"] == int(open(f"{out}/made-by.txt").read())  # one writer, intact


def test_two_assets_sharing_a_dependency_launched_together_compute_it_once(tmp_path, dagster_home, prefix):
    events, env = setup(tmp_path, dagster_home, prefix)
    procs = [launch(tmp_path, env, "*race/left"), launch(tmp_path, env, "*race/right")]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:]
    assert calls(events) == Counter({"shared": 1, "left": 1, "right": 1})
    instance = dg.DagsterInstance.get()
    shared = instance.fetch_materializations(dg.AssetKey(["race", "shared"]), limit=5).records
    assert sorted(e.asset_materialization.metadata["cached"].value for e in shared) == [False, True]
    assert {r.status for r in instance.get_runs()} == {dg.DagsterRunStatus.SUCCESS}
