"""Two small graphs for the freshness and partitioned-check tests, which Dagster's GraphQL loads from this file
(`followed`, `training`: built when loaded; storage: MARIN_PREFIX):

- `Followed`: a download of a local folder of real text (MARIN_FOLLOWED_FOLDER) that the source sensor
  follows, and a light step counting its lines;
- `Training`: a tiny training run (two checkpoints) whose checkpoints are evaluated one partition each.
"""

import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path

import dagster as dg

from marin_assets import build_definitions
from marin_assets.core.light import light
from marin_assets.core.step import Step
from marin_assets.dagster import checkpoint_evals_asset, checkpoint_sensor, source_sensor
from marin_assets.experiments import tiny_stories
from marin_assets.pipeline.data.download import url_download_step
from marin_assets.pipeline.evals.loss import loss_checkpoint_evals
from marin_assets.pipeline.evals.steps import CheckpointEvals
from marin_assets.pipeline.training.specs import OptimizerSpec
from tests.support.automation_pipeline import SHORT, TINY


def count_lines(download: Step, output_path: str) -> int:
    """Lines of text in every file of the download."""
    return sum(len(p.read_text().splitlines()) for p in Path(download.output_path).rglob("*.txt"))


@dataclass(frozen=True)
class Followed:
    download: Step
    lines: Step
    sensor: dg.SensorDefinition
    definitions: dg.Definitions


def followed_graph(folder: str) -> Followed:
    download = url_download_step("raw/followed-docs", [folder])
    lines = Step(name="derived/followed-lines", fn=light(functools.partial(count_lines, download)), deps=[download])
    sensor = source_sensor([lines], minimum_interval_seconds=1)
    return Followed(download, lines, sensor, build_definitions([lines], sensors=[sensor]))


TRAINER = replace(SHORT, num_train_steps=6, checkpoint_every=3, steps_per_eval=3, max_eval_batches=1)
CHECKPOINTS = [3, 5]
"""What TRAINER saves: step 3, and always the last."""


@dataclass(frozen=True)
class Training:
    pipeline: dict[str, Step]
    evals: CheckpointEvals
    sensor: dg.SensorDefinition
    definitions: dg.Definitions


def training_graph() -> Training:
    pipeline = tiny_stories.build(prefix="fresh", train_documents=300, validation_documents=40, vocab_size=300,
                                  model=TINY, trainer=TRAINER, optimizer=OptimizerSpec(learning_rate=1e-2))
    evals = loss_checkpoint_evals("evals/fresh-llama-checkpoints", pipeline["train"],
                                  {"stories": pipeline["tokenized"]}, max_eval_batches=1)
    sensor = checkpoint_sensor([evals], minimum_interval_seconds=1)
    return Training(pipeline, evals, sensor, build_definitions([pipeline["train"]], sensors=[sensor],
                                                               extra_assets=[checkpoint_evals_asset(evals)]))


@dg.definitions
def followed() -> dg.Definitions:
    return followed_graph(os.environ["MARIN_FOLLOWED_FOLDER"]).definitions


@dg.definitions
def training() -> dg.Definitions:
    return training_graph().definitions
