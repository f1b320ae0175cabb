"""Sweeps and what is read across runs: learning-rate × model grids, IsoFLOP ladders and the scaling laws
fitted to them, experiment summaries, run costs and speedrun leaderboards.

As Marin's `marin.experiment.sweep`: builders that return many training steps, and the report steps that
compare them.
"""

from marin_assets.pipeline.reports.experiment_summary import experiment_summary_step
from marin_assets.pipeline.reports.optimal_run import optimal_run_step
from marin_assets.pipeline.reports.run_costs import run_costs_step
from marin_assets.pipeline.reports.scaling_analysis import scaling_laws_step
from marin_assets.pipeline.reports.speedrun import Author, leaderboard_step, speedrun_step
from marin_assets.pipeline.sweeps import lr_model_sweep
from marin_assets.pipeline.training.pretrain.isoflop import IsoFlopScale, budget_label
from marin_assets.pipeline.training.pretrain.isoflop_sweep import IsoFlopSweep, isoflop_sweep

__all__ = [
    # grids and ladders
    "lr_model_sweep", "isoflop_sweep", "IsoFlopSweep", "IsoFlopScale", "budget_label",
    # scaling laws
    "scaling_laws_step", "optimal_run_step",
    # reports across runs
    "experiment_summary_step", "run_costs_step", "speedrun_step", "leaderboard_step", "Author",
]
