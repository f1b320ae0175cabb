"""The demo's graph at test size, for the browser tests: the same stages, names, checks and
metadata as `definitions.py`, with a tiny corpus and model, plus an experiment summary over a
2 × 2 sweep (model size × learning rate) trained on the same cache, and a followed local folder (MARIN_UI_FOLLOWED,
whose asset carries the source sensor's freshness policy). Storage: MARIN_PREFIX. The report's title comes from
the JSON file at MARIN_UI_SETTINGS, so a test can change a hash_attr and reload."""

import json
import os
from dataclasses import replace

from marin_assets import build_definitions
from marin_assets.dagster import checkpoint_evals_asset, checkpoint_sensor, source_sensor
from marin_assets.experiments import tiny_stories
from marin_assets.pipeline.data.download import url_download_step
from marin_assets.pipeline.hello import numbers_step, report_step, stats_step
from marin_assets.pipeline.reports.experiment_summary import experiment_summary_step
from marin_assets.pipeline.sweeps import lr_model_sweep
from marin_assets.pipeline.training.specs import OptimizerSpec
from tests.support.automation_pipeline import SHORT, TINY

settings_file = os.environ.get("MARIN_UI_SETTINGS")
settings = json.loads(open(settings_file).read()) if settings_file and os.path.exists(settings_file) else {}

numbers = numbers_step("hello/numbers", n=1000, seed=0)
report = report_step("hello/report", stats_step("hello/stats", numbers), title=settings.get("title", "Hello"))
pipeline = tiny_stories.build(train_documents=800, validation_documents=60, vocab_size=400, model=TINY, trainer=SHORT,
                              optimizer=OptimizerSpec(learning_rate=1e-2))
per_checkpoint = [tiny_stories.checkpoint_evals(pipeline)]
sweep = lr_model_sweep("ui", {"stories": pipeline["tokenized"]},
                       {f"h{m.hidden_dim}": m for m in (TINY, replace(TINY, hidden_dim=48, intermediate_dim=96))},
                       [1e-3, 1e-2], trainer=replace(SHORT, num_train_steps=4, checkpoint_every=4, steps_per_eval=2,
                                                     max_eval_batches=1), evaluate=False)
summary = experiment_summary_step("reports/ui-sweep", sweep)
followed = url_download_step("raw/ui-followed-docs", [os.environ.get("MARIN_UI_FOLLOWED", "/srv/ui-followed-docs")])
steps = [report, pipeline["export"], pipeline["evaluate"], summary, followed]
SELECTION = "*hello/report,*exports/tiny-stories-llama,*evals/tiny-stories-llama,*reports/ui-sweep,raw/ui-followed-docs"
SENSOR = "marin_checkpoint_evals"

defs = build_definitions(steps, describe_drift=True,
                         extra_assets=[checkpoint_evals_asset(e) for e in per_checkpoint],
                         sensors=[checkpoint_sensor(per_checkpoint), source_sensor([followed])])
