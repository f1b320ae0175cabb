"""Direct preference optimization (`step`: `dpo_step`) over a reference model's log-probs, computed once as a step
of their own and shared across β (`reference_logprobs`); Levanter's DPO trainer and data (`levanter_dpo`);
preference accuracy, rewards and margins from its metrics (`metrics`).

The method's module was `training/dpo.py` before 0.2.0: its names still import from here for one release, warning.
"""

from marin_assets.core.renames import moved_names

__getattr__ = moved_names(__name__, "marin_assets.pipeline.training.dpo.step")
