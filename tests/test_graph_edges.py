"""Edges of the graph a new user hits: thousands of steps deep, names Dagster would merge,
overrides that name no place, sweeps with repeated or colliding grid points."""

import functools
import logging
import os
import pickle
import tempfile
import threading

import dagster as dg
import pytest

from marin_assets import Step, StepDefinitionError, build_definitions, materialize_step
from marin_assets.core.plan import plan
from marin_assets.core.record import load_result
from marin_assets.core.step import walk
from marin_assets.execution.ray_runner import run_on_ray
from marin_assets.pipeline.hello import numbers_step, stats_step
from marin_assets.pipeline.sweeps import lr_model_sweep
from marin_assets.pipeline.training.specs import ModelSpec
from resources import RayResource
from tests.support.helpers import FAST

DEPTH = 2500
"""Deeper than Python's default recursion limit (1000) by far."""


def count_from(previous: Step | None, output_path: str) -> int:
    """Each link reads the one before it, as a real pipeline's function reads its input."""
    return 1 if previous is None else load_result(previous) + 1


def chain(depth: int) -> list[Step]:
    steps: list[Step] = []
    for i in range(depth):
        previous = steps[-1] if steps else None
        steps.append(Step(name=f"deep/link-{i:05d}", fn=functools.partial(count_from, previous),
                          deps=[previous] if previous else []))
    return steps


@pytest.fixture
def fast_prefix(monkeypatch):
    """A prefix on tmpfs when there is one: thousands of fsynced status writes stay quick."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=base) as root:
        monkeypatch.setenv("MARIN_PREFIX", root)
        yield root


def test_a_graph_thousands_deep_walks_plans_loads_and_runs(fast_prefix, local_ray):
    steps = chain(DEPTH)
    last = steps[-1]
    assert [s.name for s in walk([last])] == [s.name for s in steps]
    rows = plan([last], {last.name}, fast_prefix, FAST)
    assert len(rows) == DEPTH and rows[-1].action == "blocked" and rows[0].action == "blocked"
    # Dagster builds the job (its graph code recurses once per level).
    defs = build_definitions([last])
    job = defs.resolve_implicit_global_asset_job_def()
    # Run: all but the last in this process, then the last through Dagster on Ray — the step
    # pickled for the worker references the whole chain through its function.
    for step in steps[:-1]:
        materialize_step(step, prefix=fast_prefix, settings=FAST)
    assert plan([last], {last.name}, fast_prefix, FAST)[-1].action == "run"
    result = job.get_subset(asset_selection={dg.AssetKey(last.name.split("/"))}).execute_in_process(
        instance=dg.DagsterInstance.ephemeral())
    assert result.success
    assert load_result(last) == DEPTH


def test_a_deep_step_pickles_as_a_reference_and_runs_on_ray(fast_prefix, local_ray):
    steps = chain(DEPTH)
    copy = pickle.loads(pickle.dumps(steps[-1]))
    assert copy == steps[-1] and copy.deps[0] == steps[-2] and len(walk([copy])) == DEPTH
    with pytest.raises(RuntimeError, match="received as a reference"):
        copy.deps[0].fn("x")  # only the step being run carries its function
    for step in steps[:3]:
        materialize_step(step, prefix=fast_prefix, settings=FAST)
    value = run_on_ray(steps[3], steps[3].output_path, fast_prefix, threading.Event(), RayResource(),
                       logging.getLogger("test"))
    assert value == 4


@pytest.mark.parametrize("first, second, kind", [
    ("data/a-b", "data/a_b", "op"),
    ("data/a.b", "data/a_b", "op"),
    ("data/b_c", "data_b/c", "input"),
])
def test_names_dagster_would_merge_are_a_definition_error_naming_both(first, second, kind):
    a, b = Step(name=first, fn=print), Step(name=second, fn=print)
    reader = Step(name="use/both", fn=print, deps=[a, b])
    with pytest.raises(StepDefinitionError) as caught:
        build_definitions([reader])
    message = str(caught.value)
    assert repr(first) in message and repr(second) in message and f"Dagster {kind} name" in message


def test_a_partitioned_asset_name_colliding_with_a_step_is_refused():
    from marin_assets.dagster import checkpoint_evals_asset
    from marin_assets.experiments.tiny_stories import build, checkpoint_evals

    pipeline = build(prefix="edge")
    evals = checkpoint_evals(pipeline, prefix="edge")
    clash = Step(name=evals.name.replace("-", "_"), fn=print)
    with pytest.raises(StepDefinitionError, match="would both be the Dagster op name"):
        build_definitions([clash], extra_assets=[checkpoint_evals_asset(evals)])


@pytest.mark.parametrize("override, problem", [
    ("", "is empty"),
    ("   ", "is empty"),
    ("/", "is the root folder"),
    ("///", "is the root folder"),
    ("gs://", "is a bare 'gs://'"),
    ("s3:///", "is a bare 's3://'"),
    ("file://", "is a bare 'file://'"),
    ("://bucket/x", "has no valid URL scheme"),
    (" gs://bucket/x", "whitespace"),
    ("gs:/bucket", "must stay under the prefix"),
])
def test_an_override_that_names_no_place_is_a_definition_error(override, problem):
    with pytest.raises(StepDefinitionError) as caught:
        Step(name="raw/adopted", fn=print, override_output_path=override)
    assert "step 'raw/adopted'" in str(caught.value) and problem in str(caught.value)


def test_overrides_that_name_a_place_are_kept():
    for override in ("raw/data", "/mnt/data", "gs://bucket", "s3://bucket/prefix/", "file:///mnt/x"):
        assert Step(name="raw/adopted", fn=print, override_output_path=override).override_output_path == override


def sweep(models, rates):
    numbers = numbers_step("raw/n", n=5)
    return lr_model_sweep("s", {"n": stats_step("tokenized/n", numbers)}, models, rates, evaluate=False)


def test_a_sweep_with_a_grid_point_twice_is_a_definition_error():
    small = ModelSpec(hidden_dim=32, intermediate_dim=64, num_heads=2, num_kv_heads=2)
    with pytest.raises(StepDefinitionError, match=r"learning rate 0\.001 is also model 'small' × learning rate 0\.001"):
        sweep({"small": small}, [1e-3, 1e-3])
    with pytest.raises(StepDefinitionError, match="'tiny' × learning rate 0.001 is also model 'small'"):
        sweep({"small": small, "tiny": small}, [1e-3])


def test_a_sweep_whose_run_names_collide_is_a_definition_error():
    small = ModelSpec(hidden_dim=32, intermediate_dim=64, num_heads=2, num_kv_heads=2)
    with pytest.raises(StepDefinitionError, match=r"both get the run name 's-small-lr0\.001'"):
        sweep({"small": small}, [1e-3, 1.0000001e-3])
    assert len(sweep({"small": small}, [1e-3, 2e-3])) == 2
