"""`marin-assets gc`: unreferenced outputs listed with size, age and status; deleted only when safe.

Real outputs made by `materialize_step` (hello steps); orphans made by changing a step's hash_attrs.
Deletion goes through the lease protocol, so the race tests check the end state on disk: a complete
`SUCCESS` output or none, never a `SUCCESS` with files missing. Each race trial is classified by the
interleaving it took (what each side saw of the status object); steered trials hold one side until the other
has got somewhere, so every interleaving is covered whatever the machine's load, and free trials race for real.
"""

import collections
import dataclasses
import json
import os
import random
import shutil
import textwrap
import threading
import time

import fsspec
import pytest

from marin_assets.cli import main as cli_main
from marin_assets.core.files import atomic_write
from marin_assets.core.gc import (
    GC_RUN_ID,
    StepFamily,
    delete_garbage,
    delete_output,
    find_garbage,
    parse_duration,
)
from marin_assets.core.lease import LeaseLostError, acquire
from marin_assets.core.materialize import materialize_step
from marin_assets.core.provenance import current_provenance
from marin_assets.core.record import ArtifactRecord, read_record, write_record
from marin_assets.core.status import Status, StatusRecord
from marin_assets.core.step import Step, walk
from marin_assets.core.stores import read_status, status_store
from marin_assets.pipeline.hello import numbers_step, stats_step
from tests.support.helpers import BIN, FAST, run_cli, subprocess_env, wait_for

DAY = 86400.0
WEEK = 7 * DAY

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
EXTRA = 'from marin_assets.pipeline.hello import numbers_step\n\nother = numbers_step("t/other", n=5, seed=7)\n'


def hello(n: int) -> Step:
    """The stats step over `n` numbers (its numbers step is its dependency)."""
    return stats_step("t/stats", numbers_step("t/numbers", n=n, seed=7))


def materialize_all(step: Step, prefix: str) -> None:
    for s in walk([step]):
        materialize_step(s, prefix=prefix, settings=FAST)


def fails(step: Step, prefix: str) -> None:
    with pytest.raises(ValueError, match="n must be positive"):
        materialize_step(step, prefix=prefix, settings=FAST)


def age_tree(path: str, seconds: float) -> None:
    """Backdate every file and folder under `path` by `seconds`."""
    when = time.time() - seconds
    for here, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(os.path.join(here, name), (when, when), follow_symlinks=False)
    os.utime(path, (when, when))


def disk_size(path: str) -> tuple[int, int]:
    """Bytes and files under `path`, counted independently of gc (links by their own size)."""
    total = count = 0
    for here, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(here, name)).st_size
            count += 1
    return total, count


def build_world(prefix: str):
    """Outputs of every kind gc meets; returns the current steps and what each folder should get."""
    old, new = hello(10), hello(12)
    materialize_all(old, prefix)
    materialize_all(new, prefix)
    fails(numbers_step("t/numbers", n=0, seed=7), prefix)  # a fresh FAILED orphan: kept (too young)
    old_failed = numbers_step("t/broken", n=0, seed=1)
    fails(old_failed, prefix)
    age_tree(old_failed.output_path_under(prefix), 10 * DAY)
    current_failed = numbers_step("t/current-broken", n=0, seed=1)  # referenced, FAILED long ago: listed, kept
    fails(current_failed, prefix)
    age_tree(current_failed.output_path_under(prefix), 10 * DAY)

    stale = numbers_step("t/stale", n=3).output_path_under(prefix)  # its holder died ten days ago
    status_store(stale).write_if(None, StatusRecord(Status.RUNNING, "host:1:dead", "tok", time.time() - 10 * DAY))
    atomic_write(f"{stale}/part-0.jsonl", b"{}\n" * 10)
    age_tree(stale, 10 * DAY)
    for folder, days in (("t/abandoned_0123abcd", 10), ("t/fresh_89abcdef", 0)):  # no status at all
        atomic_write(f"{prefix}/{folder}/part-0.bin", b"x" * 100)
        age_tree(f"{prefix}/{folder}", days * DAY)

    live_step = numbers_step("t/live", n=4)
    lease = acquire(status_store(live_step.output_path_under(prefix)), FAST)
    lease.start_heartbeat()

    adopted = f"{prefix}/raw/adopted"  # not {name}_{hash}: data someone placed, never deleted
    atomic_write(f"{adopted}/data.txt", b"precious")
    status_store(adopted).write_if(None, StatusRecord(Status.SUCCESS, "h:1:x", "tok", time.time()))
    atomic_write(f"{prefix}/README.txt", b"not an output")
    expected = {
        old.deps[0].output_path_under(prefix): ("delete", "SUCCESS", "success"),
        old.output_path_under(prefix): ("delete", "SUCCESS", "success"),
        numbers_step("t/numbers", n=0, seed=7).output_path_under(prefix): ("keep", "FAILED", "failed"),
        old_failed.output_path_under(prefix): ("delete", "FAILED", "failed"),
        current_failed.output_path_under(prefix): ("keep", "FAILED", "failed"),
        stale: ("delete", "RUNNING", "stale"),
        f"{prefix}/t/abandoned_0123abcd": ("delete", None, "missing"),
        f"{prefix}/t/fresh_89abcdef": ("keep", None, "missing"),
        live_step.output_path_under(prefix): ("keep", "RUNNING", "live"),
        adopted: ("keep", "SUCCESS", "success"),
    }
    return [new, current_failed], expected, lease


def test_lists_unreferenced_and_old_partial_outputs_with_size_age_and_status(prefix):
    current, expected, lease = build_world(prefix)
    try:
        report = find_garbage(prefix, current, older_than_s=WEEK, settings=FAST)
    finally:
        lease.stop_heartbeat()
    got = {e.path: e for e in report.entries}
    assert {p: (e.action, e.status, e.state) for p, e in got.items()} == expected
    for path, entry in got.items():
        assert (entry.size_bytes, entry.files) == disk_size(path), path
    new_numbers = current[0].deps[0]
    superseded = got[hello(10).deps[0].output_path_under(prefix)]
    assert superseded.reason == f"unreferenced: t/numbers is now {new_numbers.hash}; SUCCESS"
    assert superseded.name == "t/numbers" and superseded.hash == hello(10).deps[0].hash
    assert superseded.age_s < DAY
    for old in ("t/broken", "t/stale", "t/abandoned"):
        entry = next(e for e in report.entries if e.relative.startswith(old + "_"))
        assert 10 * DAY - 300 < entry.age_s < 10 * DAY + 300, entry
        assert "older than 7d" in entry.reason
    assert "no definition named t/stale" in next(e for p, e in got.items() if "/t/stale_" in p).reason
    assert got[f"{prefix}/t/fresh_89abcdef"].reason.endswith("younger than --older-than 7d")
    assert next(e for e in report.entries if e.state == "live").reason.startswith("live lease: RUNNING by ")
    assert got[current[1].output_path_under(prefix)].referenced_by == "t/current-broken"
    assert "materializing it replaces it" in got[current[1].output_path_under(prefix)].reason
    assert got[f"{prefix}/raw/adopted"].reason.startswith("not a content-addressed output")
    # what is referenced and complete, and files that are no output, are not reported at all
    assert not {s.output_path_under(prefix) for s in walk([current[0]])} & set(got)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["to_delete"] == {"outputs": 5, "bytes": sum(e.size_bytes for e in report.to_delete)}
    assert {o["relative"] for o in data["outputs"]} == {p[len(prefix) + 1:] for p in expected}
    assert set(data["outputs"][0]) >= {"path", "name", "hash", "status", "state", "size_bytes", "age_s",
                                        "action", "reason", "referenced_by"}


def test_delete_removes_only_what_is_marked_and_never_a_referenced_or_leased_output(prefix):
    current, expected, lease = build_world(prefix)
    try:
        report = find_garbage(prefix, current, older_than_s=WEEK, settings=FAST)
        deletions = delete_garbage(report, FAST)
        assert read_status(next(p for p, v in expected.items() if v[2] == "live")).holder == lease.record.holder
    finally:
        lease.stop_heartbeat()
    doomed = {p for p, (action, _, _) in expected.items() if action == "delete"}
    assert {d.path for d in deletions if d.deleted} == doomed
    assert sum(d.freed_bytes for d in deletions) == sum(e.size_bytes for e in report.to_delete)
    assert not any(os.path.exists(p) for p in doomed)
    assert all(os.path.exists(p) for p in set(expected) - doomed)
    for step in walk([current[0]]):  # the current outputs: intact, still a cache hit
        assert materialize_step(step, prefix=prefix, settings=FAST).cached
    assert open(f"{prefix}/raw/adopted/data.txt").read() == "precious"
    assert os.path.exists(f"{prefix}/README.txt")
    again = find_garbage(prefix, current, older_than_s=WEEK, settings=FAST)
    assert again.to_delete == ()

    refused = next(e for e in report.entries if e.action == "keep")
    with pytest.raises(ValueError, match="refusing to delete .* it is not marked for deletion"):
        delete_output(refused, prefix, FAST)


def test_never_deletes_outside_the_prefix_nor_through_a_link(prefix, tmp_path):
    old = hello(10)
    materialize_all(old, prefix)
    outside = tmp_path / "elsewhere"
    (outside / "t" / "x_0badc0de").mkdir(parents=True)
    (outside / "t" / "x_0badc0de" / "precious.bin").write_bytes(b"p" * 10)
    os.symlink(outside / "t" / "x_0badc0de", f"{prefix}/t/link_0badc0de")  # a linked folder named like an output
    orphan = old.output_path_under(prefix)
    os.symlink(outside / "t" / "x_0badc0de" / "precious.bin", f"{orphan}/link.bin")  # a link inside an orphan
    sibling = f"{prefix}-sibling"  # shares the prefix's text, not its folder
    shutil.copytree(orphan, f"{sibling}/t/stats_{old.hash}", symlinks=True)

    report = find_garbage(prefix, [], older_than_s=WEEK, settings=FAST)
    assert {e.relative for e in report.entries} == {old.name_with_hash, old.deps[0].name_with_hash}
    assert all(d.deleted for d in delete_garbage(report, FAST))
    assert not os.path.exists(orphan) and not os.path.exists(f"{prefix}/t/numbers_{old.deps[0].hash}")
    assert (outside / "t" / "x_0badc0de" / "precious.bin").read_bytes() == b"p" * 10
    assert os.path.islink(f"{prefix}/t/link_0badc0de")
    assert read_status(f"{sibling}/t/stats_{old.hash}").status is Status.SUCCESS

    entry = report.entries[0]
    for bad in (dataclasses.replace(entry, path=f"{sibling}/{entry.relative}"),
                dataclasses.replace(entry, path=f"{prefix}/t/link_0badc0de", relative="t/link_0badc0de")):
        with pytest.raises(ValueError, match="refusing to delete"):
            delete_output(bad, prefix, FAST)


def test_the_cli_lists_as_json_keeps_extra_definitions_and_deletes(tmp_path, prefix, dagster_home):
    (tmp_path / "defs.py").write_text(DEFS)
    (tmp_path / "extra.py").write_text(EXTRA)
    old, new, other = hello(10), hello(12), numbers_step("t/other", n=5, seed=7)
    for step in (old, new, other):
        materialize_all(step, prefix)
    gc = [BIN / "marin-assets", "gc", "-f", tmp_path / "defs.py", "--json"]
    env = subprocess_env(HELLO_N="12")

    listed = json.loads(run_cli(*gc, env=env).stdout)
    assert {o["relative"]: o["action"] for o in listed["outputs"]} == {
        old.name_with_hash: "delete", old.deps[0].name_with_hash: "delete", other.name_with_hash: "delete"}
    assert listed["prefix"] == prefix and listed["older_than_s"] == WEEK
    assert all(os.path.exists(s.output_path_under(prefix)) for s in (old, other))  # listing deletes nothing

    done = json.loads(run_cli(*gc, "--also", tmp_path / "extra.py", "--delete", env=env).stdout)
    assert {o["relative"] for o in done["outputs"]} == {old.name_with_hash, old.deps[0].name_with_hash}
    assert done["deleted"]["outputs"] == 2 and all(d["deleted"] for d in done["deletions"])
    assert not os.path.exists(old.output_path_under(prefix))
    assert read_status(other.output_path_under(prefix)).status is Status.SUCCESS
    for step in walk([new]):
        assert read_record(step.output_path_under(prefix)).hash == step.hash


def test_cli_text_output_and_errors_for_bad_arguments(tmp_path, prefix, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no ./.env read into this process
    monkeypatch.setenv("HELLO_N", "12")
    (tmp_path / "defs.py").write_text(DEFS)
    materialize_all(hello(10), prefix)
    assert cli_main(["gc", "-f", "defs.py"]) == 0
    text = capsys.readouterr().out
    assert "delete  SUCCESS" in text and f"t/numbers_{hello(10).deps[0].hash}" in text
    assert "2 to delete (" in text and "nothing deleted: run again with --delete" in text
    assert os.path.exists(hello(10).output_path_under(prefix))

    with pytest.raises(SystemExit, match=r"--older-than: invalid duration '7x': expected a number and a unit"):
        cli_main(["gc", "-f", "defs.py", "--older-than", "7x"])
    with pytest.raises(SystemExit, match=r"--also no_such_module_xyz: cannot load it \(ModuleNotFoundError"):
        cli_main(["gc", "-f", "defs.py", "--also", "no_such_module_xyz"])
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match=r"--also empty.py: no steps, step families or dagster.Definitions"):
        cli_main(["gc", "-f", "defs.py", "--also", "empty.py"])
    assert parse_duration("12h") == 43200 and parse_duration("7d") == WEEK and parse_duration("90") == 90


def test_a_step_family_keeps_its_members(prefix):
    members = {f"evals/e/step-{k}": numbers_step(f"evals/e/step-{k}", n=k) for k in (1, 2)}
    for step in members.values():
        materialize_step(step, prefix=prefix, settings=FAST)
    stray = numbers_step("evals/e/step-1", n=99)  # the same name, another identity: not the family's
    materialize_step(stray, prefix=prefix, settings=FAST)
    family = StepFamily("evals/e", lambda name: members.get(name))
    report = find_garbage(prefix, [], families=[family], older_than_s=WEEK, settings=FAST)
    assert [e.relative for e in report.entries] == [stray.name_with_hash]


# --- racing materializations --------------------------------------------------------------------------

FILES = 60


def slow_step(seed: int, delay: float = 0.0, gate: threading.Event | None = None) -> Step:
    """Writes FILES files (checked by `complete`), optionally waiting on `gate` first."""
    def fn(out):
        if gate is not None:
            gate.wait(30)
        os.makedirs(out, exist_ok=True)
        for i in range(FILES):
            with open(f"{out}/part-{i:03d}.txt", "w") as f:
                f.write(f"{seed}:{i}\n")
            time.sleep(delay / FILES)
        return {"files": FILES}

    return Step(name="t/race", fn=fn, hash_attrs={"seed": seed})


def complete(out: str, seed: int) -> bool:
    """A SUCCESS here has every file and its record (asserted); returns whether there is a SUCCESS."""
    status = read_status(out)
    if status is None:
        assert not os.path.exists(out) or not [n for n in os.listdir(out) if n.startswith("part-")], os.listdir(out)
        return False
    assert status.status is Status.SUCCESS, status
    assert read_record(out).result == {"files": FILES}
    for i in range(FILES):
        with open(f"{out}/part-{i:03d}.txt") as f:
            assert f.read() == f"{seed}:{i}\n"
    return True


HIT_THEN_GC = "cache hit, then gc deleted"
STEP_LEASED = "step took the lease first, gc kept the output"
STEP_LOST_SWAP = "gc took the lease between the step's read and its swap, the step waited"
STEP_WAITED = "step found gc holding the lease and waited"
GC_FIRST = "gc had finished before the step looked"
GC_STALLED = "gc stalled past the stale timeout, the step took its lease over"
INTERLEAVINGS = (HIT_THEN_GC, STEP_LEASED, STEP_LOST_SWAP, STEP_WAITED, GC_FIRST)
"""How a materialization and a deletion of the same output can interleave (each ends with a complete output or
none: `complete`); a trial is classified by what each side saw of the status object (`Trial`)."""
HOLD = 60.0  # a bound against a hang on a steered hold, not a timing assertion


class Trial:
    """One materialization racing one deletion: what each side did to the status object, seen through the
    status stores they use (`watch_status_stores`), and the points where a steered trial holds one side until
    the other has got somewhere, so that it takes a chosen interleaving whatever the machine's load."""

    def __init__(self, steer: str | None = None):
        self.steer = steer
        self.step_about_to_swap, self.step_swapped, self.step_saw_gc = (threading.Event() for _ in range(3))
        self.gc_swapped, self.gc_deleted_data, self.step_done = (threading.Event() for _ in range(3))
        self.step_read_success = threading.Event()
        self.step_lost_swap = False

    @staticmethod
    def hold(event: threading.Event, what: str) -> None:
        assert event.wait(HOLD), f"steered trial: {what} never happened"

    def before_swap(self, side: str) -> None:
        """Called as a side first tries to take the lease (a compare-and-swap of a new token)."""
        if side == "step":
            self.step_about_to_swap.set()
            if self.steer == STEP_LOST_SWAP:
                self.hold(self.gc_swapped, "gc taking the lease")
        elif self.steer == HIT_THEN_GC:
            self.hold(self.step_done, "the step's cache hit")
        elif self.steer == STEP_LEASED:
            self.hold(self.step_swapped, "the step taking the lease")
        elif self.steer == STEP_LOST_SWAP:
            self.hold(self.step_about_to_swap, "the step reading SUCCESS and trying to take the lease")

    def after_swap(self, side: str, took: bool) -> None:
        if side == "gc":
            if took:
                self.gc_swapped.set()
        elif took:
            self.step_swapped.set()
        else:
            self.step_lost_swap = True

    def before_deleting_data(self) -> None:
        """gc holds the lease (heartbeating) and is about to delete the data."""
        if self.steer == STEP_WAITED:
            self.hold(self.step_saw_gc, "the step finding gc's lease")

    def step_read(self, status: StatusRecord | None) -> None:
        if status is not None and status.status is Status.RUNNING and status.run_id == GC_RUN_ID:
            self.step_saw_gc.set()
        if status is not None and status.status is Status.SUCCESS:
            self.step_read_success.set()
            if self.steer == "record gone":
                self.hold(self.gc_deleted_data, "gc deleting the data")

    def classify(self, deleted: bool, outcome) -> str:
        if not deleted:
            if outcome.took_over.startswith("stale RUNNING"):  # a loaded machine starved gc's heartbeat
                return GC_STALLED
            assert outcome.took_over.startswith("recompute of SUCCESS"), outcome.took_over
            return STEP_LEASED
        if outcome.cached:
            return HIT_THEN_GC
        if self.step_lost_swap:
            return STEP_LOST_SWAP
        if self.step_saw_gc.is_set():
            return STEP_WAITED
        assert outcome.took_over is None, outcome.took_over  # it found no status: a fresh output
        return GC_FIRST


class WatchedStore:
    """A status store that tells the current `Trial` what one side (`step` or `gc`) does with it."""

    def __init__(self, store, side: str, trial: Trial):
        self._store, self._side, self._trial, self._tokens = store, side, trial, set()

    def read(self):
        current = self._store.read()
        if self._side == "step":
            self._trial.step_read(current[0])
        return current

    def write_if(self, expected, new):
        taking = new.token not in self._tokens  # a new token takes the lease; renewals and finish keep theirs
        self._tokens.add(new.token)
        if taking:
            self._trial.before_swap(self._side)
        generation = self._store.write_if(expected, new)
        if taking:
            self._trial.after_swap(self._side, generation is not None)
        return generation

    def __getattr__(self, name):
        return getattr(self._store, name)


@pytest.fixture
def watch_status_stores(monkeypatch):
    """Route the status stores of `materialize_step` and of gc's deletion, and gc's deleting of the data, through
    the trial set in the returned holder (`holder["trial"] = Trial(...)`; None: as they are)."""
    import marin_assets.core.gc.deletion as deletion
    import marin_assets.core.materialize as materialize

    holder: dict = {"trial": None}

    def watching(side, plain):
        def status_store(path):
            store = plain(path)
            return store if holder["trial"] is None else WatchedStore(store, side, holder["trial"])
        return status_store

    def delete_contents(path, root, lease, plain=deletion._delete_contents):
        if (trial := holder["trial"]) is not None:
            trial.before_deleting_data()
        plain(path, root, lease)
        if trial is not None:
            trial.gc_deleted_data.set()

    monkeypatch.setattr(materialize, "status_store", watching("step", materialize.status_store))
    monkeypatch.setattr(deletion, "status_store", watching("gc", deletion.status_store))
    monkeypatch.setattr(deletion, "_delete_contents", delete_contents)
    return holder


def race(prefix: str, seed: int, holder: dict, steer: str | None, recompute: bool, jitter: float = 0.0):
    """Materialize `slow_step(seed)`, list it as garbage, then delete it while a thread materializes it again
    (`recompute`: forcing a recompute of its SUCCESS). `steer`: the interleaving to hold the sides into; None
    races them freely, one side starting `jitter` seconds late (gc if it is negative). Returns (interleaving,
    deleted, made)."""
    step = slow_step(seed)
    out = step.output_path_under(prefix)
    materialize_step(step, prefix=prefix, settings=FAST)
    (entry,) = find_garbage(prefix, [], older_than_s=WEEK, settings=FAST).entries
    trial = holder["trial"] = Trial(steer)
    result: dict = {}
    deletion_done = threading.Event()

    def racer():
        try:
            if steer == STEP_WAITED:
                trial.hold(trial.gc_swapped, "gc taking the lease")
            elif steer == GC_FIRST:
                trial.hold(deletion_done, "gc finishing")
            elif jitter > 0:
                time.sleep(jitter)  # free trials: a random head start for gc (not a wait for anything)
            result["outcome"] = materialize_step(step, prefix=prefix, settings=FAST,
                                                 recompute="test" if recompute else None)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            result["error"] = e
        finally:
            trial.step_done.set()

    thread = threading.Thread(target=racer)
    thread.start()
    try:
        if jitter < 0:
            time.sleep(-jitter)  # or for the step
        deletion = delete_output(entry, prefix, FAST)
    finally:
        deletion_done.set()
        thread.join()
        holder["trial"] = None
    if "error" in result:
        raise result["error"]
    made = complete(out, seed)
    assert deletion.deleted or made, "nothing was left half-way"
    shutil.rmtree(out, ignore_errors=True)
    return trial.classify(deletion.deleted, result["outcome"]), deletion.deleted, made


STEERED = [(HIT_THEN_GC, False), (STEP_LEASED, True), (STEP_LOST_SWAP, True), (STEP_WAITED, False),
           (STEP_WAITED, True), (GC_FIRST, False), (GC_FIRST, True)]


def test_a_materialization_racing_a_delete_ends_with_a_complete_output_or_none(prefix, watch_status_stores):
    """Steered trials take every interleaving (each asserted to be the one it was steered into); free trials,
    started at random moments, race for real. Each ends with a complete output or none; the counts are printed."""
    steered, free = collections.Counter(), collections.Counter()
    for seed, (steer, recompute) in enumerate(STEERED):
        got, deleted, made = race(prefix, seed, watch_status_stores, steer, recompute)
        assert got == steer, (steer, recompute)
        assert (deleted, made) == {HIT_THEN_GC: (True, False), STEP_LEASED: (False, True)}.get(steer, (True, True))
        steered[got] += 1
    rng = random.Random(0)
    for seed in range(len(STEERED), len(STEERED) + 12):  # half force a recompute: they take the lease from SUCCESS
        got, _, _ = race(prefix, seed, watch_status_stores, None, recompute=seed % 2 == 1,
                         jitter=rng.uniform(-0.01, 0.01))
        free[got] += 1
    assert set(steered) == set(INTERLEAVINGS) and sum(free.values()) == 12
    print(f"\ngc racing a materialization, trials per interleaving: steered {dict(steered)}; free {dict(free)}")


def test_a_cache_hit_whose_output_gc_deletes_before_its_record_is_read_looks_again(prefix, watch_status_stores):
    interleaving, deleted, made = race(prefix, 0, watch_status_stores, "record gone", recompute=False)
    assert deleted and made and interleaving in (STEP_WAITED, GC_FIRST)


def test_a_waiting_materialization_recomputes_after_the_delete(prefix):
    step = slow_step(1)
    out = step.output_path_under(prefix)
    materialize_step(step, prefix=prefix, settings=FAST)
    for i in range(400):  # a large output: deleting it takes a while
        atomic_write(f"{out}/extra/{i}.bin", b"z" * 10)
    (entry,) = find_garbage(prefix, [], older_than_s=WEEK, settings=FAST).entries
    result = {}

    def racer():  # starts once gc holds the lease (or, on a slow start, has finished)
        wait_for(lambda: (status := read_status(out)) is None or status.run_id == GC_RUN_ID, "gc taking the lease",
                 interval=0.001)
        result["outcome"] = materialize_step(step, prefix=prefix, settings=FAST)

    thread = threading.Thread(target=racer)
    thread.start()
    assert delete_output(entry, prefix, FAST).deleted
    thread.join()
    assert result["outcome"].cached is False
    assert complete(out, 1) and not os.path.exists(f"{out}/extra")


def test_a_live_holder_wins_and_a_stale_holder_taken_over_by_gc_cannot_mark_success(prefix):
    gate = threading.Event()
    step = slow_step(2, gate=gate)
    out = step.output_path_under(prefix)
    materialize_step(slow_step(2), prefix=prefix, settings=FAST)
    (entry,) = find_garbage(prefix, [], older_than_s=WEEK, settings=FAST).entries
    holder = threading.Thread(target=lambda: materialize_step(step, prefix=prefix, settings=FAST, recompute="t"))
    holder.start()
    wait_for(lambda: read_status(out).status is Status.RUNNING, "the holder taking the lease")
    kept = delete_output(entry, prefix, FAST)  # listed as SUCCESS; a materialization holds it now
    assert not kept.deleted and "status changed since it was listed (now RUNNING by" in kept.reason
    gate.set()
    holder.join()
    assert complete(out, 2)

    stalled = acquire(status_store(out), FAST, recompute="stalled")  # holds the lease, never heartbeats
    (entry,) = wait_for(lambda: [e for e in find_garbage(prefix, [], older_than_s=0, settings=FAST).entries
                                 if e.state == "stale"], "the stalled lease going stale", interval=0.05)
    assert entry.action == "delete"
    assert delete_output(entry, prefix, FAST).deleted
    with pytest.raises(LeaseLostError):
        stalled.finish(Status.SUCCESS)
    assert not complete(out, 2)  # no status, no data (the failed swap re-made only the folder and its lock)


def test_an_interrupted_delete_is_finished_by_gc_and_never_resumed_by_a_materialization(prefix):
    step = slow_step(3)
    out = step.output_path_under(prefix)
    atomic_write(f"{out}/part-000.txt", b"half-deleted leftover")  # what an interrupted gc leaves
    status_store(out).write_if(None, StatusRecord(Status.FAILED, "h:1:gc", "tok", time.time(), run_id=GC_RUN_ID,
                                                   error="deletion by marin-assets gc interrupted"))
    (entry,) = find_garbage(prefix, [], older_than_s=WEEK, settings=FAST).entries
    assert entry.action == "delete" and "deletion by marin-assets gc was interrupted" in entry.reason
    outcome = materialize_step(step, prefix=prefix, settings=FAST)  # someone still uses it: starts afresh
    assert "previous attempt FAILED" in outcome.took_over and complete(out, 3)

    leftover = f"{prefix}/t/.race_{step.hash}.gc-{'0' * 32}"  # renamed away by a gc that died right after
    atomic_write(f"{leftover}/part-001.txt", b"x")
    (entry,) = find_garbage(prefix, [step], older_than_s=WEEK, settings=FAST).entries
    assert (entry.relative, entry.state, entry.action) == (f"t/.race_{step.hash}.gc-{'0' * 32}", "leftover", "delete")
    assert delete_output(entry, prefix, FAST).deleted and not os.path.exists(leftover) and complete(out, 3)


# --- object stores ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["gs", "s3"])
def test_gc_on_an_object_store_deletes_orphans_and_keeps_current_live_and_sibling_outputs(protocol, request):
    prefix = request.getfixturevalue(f"{protocol}_prefix")  # the GCS emulator, or a local S3 (moto)
    fs = fsspec.filesystem(protocol)
    old, new = hello(10), hello(12)
    materialize_all(old, prefix)
    materialize_all(new, prefix)
    orphan = old.output_path_under(prefix)
    sibling = f"{prefix}-sibling/t/stats_{old.hash}"  # shares the prefix's text, not its folder
    fs.pipe_file(f"{sibling}/stats.json", b"{}")
    live_out = numbers_step("t/live", n=4).output_path_under(prefix)
    live = acquire(status_store(live_out), FAST)
    live.start_heartbeat()
    try:
        report = find_garbage(prefix, [new], older_than_s=WEEK, settings=FAST)
        by_rel = {e.relative: e for e in report.entries}
        assert {r: (e.action, e.status) for r, e in by_rel.items()} == {
            old.name_with_hash: ("delete", "SUCCESS"), old.deps[0].name_with_hash: ("delete", "SUCCESS"),
            numbers_step("t/live", n=4).name_with_hash: ("keep", "RUNNING")}
        assert by_rel[old.name_with_hash].size_bytes == fs.du(orphan.split("://", 1)[1])
        assert by_rel[old.name_with_hash].age_s < DAY
        assert all(d.deleted for d in delete_garbage(report, FAST))
        assert read_status(live_out).holder == live.record.holder
    finally:
        live.stop_heartbeat()
    fs.invalidate_cache()
    assert not fs.find(orphan.split("://", 1)[1]) and read_status(orphan) is None
    assert fs.exists(f"{sibling}/stats.json")
    for step in walk([new]):
        assert materialize_step(step, prefix=prefix, settings=FAST).cached


# --- scale ----------------------------------------------------------------------------------------------


def test_listing_a_thousand_outputs(prefix):
    steps = [numbers_step(f"bulk/o{i:04d}", n=1) for i in range(1000)]
    provenance = current_provenance(None)
    made = time.perf_counter()
    for step in steps:  # status + record + a data file each, with the core API (no step runs)
        out = step.output_path_under(prefix)
        atomic_write(f"{out}/numbers.jsonl", b'{"x": 1.0}\n')
        write_record(out, ArtifactRecord(step.name, step.hash, {"n": 1}, [], out, None, None, provenance))
        status_store(out).write_if(None, StatusRecord(Status.SUCCESS, "h:1:x", "tok", time.time()))
    made = time.perf_counter() - made
    started = time.perf_counter()
    report = find_garbage(prefix, steps[:500], older_than_s=WEEK, settings=FAST)
    listed = time.perf_counter() - started
    assert len(report.entries) == 500 and report.scanned_files == 4000  # data, record, status, lock
    assert {e.relative for e in report.to_delete} == {s.name_with_hash for s in steps[500:]}
    started = time.perf_counter()
    assert all(d.deleted for d in delete_garbage(report, FAST))
    deleted = time.perf_counter() - started
    assert len(os.listdir(f"{prefix}/bulk")) == 500
    print(f"\ngc over 1,000 outputs (4,000 files): made in {made:.2f}s, listed in {listed:.3f}s,"
          f" 500 deleted in {deleted:.2f}s")
