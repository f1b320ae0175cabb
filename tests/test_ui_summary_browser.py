"""The experiment summary in a real browser: a tiny 2 × 2 sweep and its summary materialized by the CLI,
`dagster dev` serving them, Chromium (Playwright) opening the summary's asset page — the table, the inline
plot of eval loss against learning rate, and the overlaid loss curves behind "[Show Markdown]" all render."""

import re
import subprocess

import pytest

from tests.support.browser import dagster_dev_page
from tests.support.helpers import BIN, ROOT, subprocess_env

SHOTS = ROOT / "tests" / "artifacts" / "screenshots"
DEFINITIONS = '''
from marin_assets import build_definitions
from marin_assets.pipeline.corpus import corpus_step
from marin_assets.pipeline.experiment_summary import experiment_summary_step
from marin_assets.pipeline.specs import ModelSpec, TrainerSpec
from marin_assets.pipeline.sweep import lr_model_sweep
from marin_assets.pipeline.tokenize import tokenize_step
from marin_assets.pipeline.tokenizer import bpe_tokenizer_step

stories = corpus_step("raw/ui-stories", train_documents=300, validation_documents=30, seed=1, shards=1)
tokenized = tokenize_step("tokenized/ui-stories", stories, bpe_tokenizer_step("tokenizers/ui-bpe", stories,
                                                                                vocab_size=400))
models = {size: ModelSpec(hidden_dim=size, intermediate_dim=2 * size, num_layers=1, num_heads=2, num_kv_heads=2,
                          seq_len=64) for size in (32, 48)}
trainer = TrainerSpec(num_train_steps=4, train_batch_size=4, checkpoint_every=4, steps_per_eval=2, max_eval_batches=1)
runs = lr_model_sweep("ui", {"stories": tokenized}, {f"h{k}": m for k, m in models.items()}, [1e-3, 1e-2],
                      trainer=trainer, evaluate=False)
defs = build_definitions([experiment_summary_step("reports/ui-sweep", runs)])
'''


@pytest.fixture(scope="module")
def summary_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-summary")
    (tmp / "home").mkdir()
    (tmp / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    definitions = tmp / "summary_definitions.py"
    definitions.write_text(DEFINITIONS)
    env = subprocess_env(DAGSTER_HOME=str(tmp / "home"), MARIN_PREFIX=str(tmp / "outputs"))
    made = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-f", str(definitions), "--select",
                           "*reports/ui-sweep"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]
    with dagster_dev_page(definitions, env, tmp / "dagster-dev.log") as (base, page):
        page.goto(f"{base}/assets/reports/ui-sweep")
        yield page


def test_the_summary_page_shows_its_table_and_plots(summary_page):
    page = summary_page
    page.get_by_text("Metadata", exact=True).first.wait_for()
    for label in ["result.rows", "result.eval_loss_vs_lr", "result.train_loss_curves", "result.varied"]:
        page.get_by_text(label, exact=True).first.wait_for()
    plot = page.locator('.dagster-markdown img[alt="eval loss vs learning rate"]').first
    plot.wait_for()
    assert plot.evaluate("img => img.complete && img.naturalWidth") == 360  # the SVG rendered inline
    page.get_by_text("checkpoints/ui-h48-lr0.01", exact=True).first.wait_for()  # a row of the table
    page.get_by_text("result.eval_loss_vs_lr", exact=True).first.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "experiment-summary.png"))
    # 4 overlaid curves do not fit Dagster's inline limit: the button opens them, rendered
    page.get_by_text("[Show Markdown]").first.click()
    curves = page.locator('[role="dialog"] img[alt$="loss"]').first
    curves.wait_for()
    assert curves.evaluate("img => img.complete && img.naturalWidth") == 360
    assert re.search(r"loss", curves.get_attribute("alt") or "")
