"""The demo until the LLM pipeline lands: numbers → statistics → report."""

from marin_assets import Experiment
from marin_assets.steps import numbers_step, report_step, stats_step

numbers = numbers_step("hello/numbers", n=1000, seed=0)
stats = stats_step("hello/stats", numbers)
report = report_step("hello/report", stats, title="Hello, marin-assets")

steps = [report]
experiment = Experiment("hello", steps, automated=steps, scheduled=False)
"""Hello world materializes itself (automation conditions); the refresh schedule leaves it alone."""
