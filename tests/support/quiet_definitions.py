"""Hello-world-sized definitions for the quiet-console tests (`tests/test_quiet_output.py`): the hello
world, a light step that prints and logs a lot from the Dagster process itself, and a step that fails
on its input. Storage: MARIN_PREFIX."""

import logging
from functools import partial

import dagster as dg

from marin_assets import Step, build_definitions, load_result
from marin_assets.core.light import light
from marin_assets.pipeline.hello import Stats, numbers_step, report_step, stats_step

CHATTY_LINES = 40

numbers = numbers_step("hello/numbers", n=200, seed=0)
stats = stats_step("hello/stats", numbers)
report = report_step("hello/report", stats, title="Quiet")


@light
def chatter(output_path: str) -> int:
    """Print and log what libraries print on start-up: none of it belongs on the terminal."""
    for i in range(CHATTY_LINES):
        print(f"chatty line {i}")
    logging.getLogger("chatty").info("an INFO line from a library")
    return CHATTY_LINES


chatty = Step(name="quiet/chatty", fn=chatter, hash_attrs={"lines": CHATTY_LINES})


def mean_must_be(expected: float, output_path: str) -> float:
    """Refuse numbers whose mean is not `expected`: a failure with a cause to show."""
    mean = load_result(stats, Stats).mean
    if abs(mean - expected) > 1e-9:
        raise ValueError(f"the numbers' mean is {mean:.3f}, not {expected}")
    return mean


fails = Step(name="quiet/fails", fn=light(lambda out: mean_must_be(42.0, out)), deps=[stats],
             hash_attrs={"expected": 42.0})
fails_on_ray = Step(name="quiet/fails-on-ray", fn=partial(mean_must_be, 41.0), deps=[stats],
                    hash_attrs={"expected": 41.0})  # not light: a Ray task



TICKED = [dg.AssetKey(["hello", "report"]), dg.AssetKey(["quiet", "fails"])]


@dg.sensor(name="quiet_once", asset_selection=dg.AssetSelection.assets(*TICKED))
def once(context: dg.SensorEvaluationContext) -> dg.RunRequest:
    """One run of the report and the failing step, for `marin-assets tick`."""
    return dg.RunRequest(run_key="once", asset_selection=TICKED)


defs = build_definitions([report, chatty, fails, fails_on_ray], sensors=[once])
