"""RL from verifiable rewards (`step`: `rl_step`): environments that check answers (`envs`), RLOO advantages
(`rloo`), the loop on Levanter (`levanter_rl`) and rewards, pass rates and KL from its metrics (`metrics`).

The method's module was `training/rl.py` before 0.2.0: its names still import from here for one release, warning.
"""

from marin_assets.core.renames import moved_names

__getattr__ = moved_names(__name__, "marin_assets.pipeline.training.rl.step")
