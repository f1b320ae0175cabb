"""Pretraining: Levanter's `train_lm` on a weighted mixture of token caches (`step`: `train_step`), and the
IsoFLOP ladders built from it (`isoflop`: the grid; `isoflop_sweep`: its training steps).

The method's module was `training/pretrain.py` before 0.2.0: its names still import from here for one release, warning.
"""

from marin_assets.core.renames import moved_names

__getattr__ = moved_names(__name__, "marin_assets.pipeline.training.pretrain.step")
