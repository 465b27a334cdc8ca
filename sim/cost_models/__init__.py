"""Cost models: how long one engine step takes, in the simulator's virtual time.

``load_cost_model`` picks one from the configuration; see README.md in this folder for the models and
the calibrated profile format.
"""

from sim.cost_models.analytical import AnalyticalCostModel
from sim.cost_models.base import CostModel, load_cost_model
from sim.cost_models.calibrated import (CalibratedCostModel, StepProfile, load_profile, make_provenance,
                                        save_profile)
from sim.cost_models.step_batch import FEATURE_NAMES, StepBatch, StepFeatures, step_features

__all__ = ["AnalyticalCostModel", "CalibratedCostModel", "CostModel", "FEATURE_NAMES", "StepBatch", "StepFeatures",
           "StepProfile", "load_cost_model", "load_profile", "make_provenance", "save_profile", "step_features"]
