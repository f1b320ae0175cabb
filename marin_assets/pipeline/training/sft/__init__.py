"""Supervised fine-tuning: `train_lm` on chat caches whose loss weights are the assistant tokens (`step`: `sft_step`).

The method's module was `training/sft.py` before 0.2.0: its names still import from here for one release, warning.
"""

from marin_assets.core.renames import moved_names

__getattr__ = moved_names(__name__, "marin_assets.pipeline.training.sft.step")
