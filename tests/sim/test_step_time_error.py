"""The profile's error on a real run's own steps (sim/step_time_error.py), on a shipped recording."""

from pathlib import Path

import pandas as pd
import pytest

from sim.cost_models import CalibratedCostModel
from sim.step_time_error import describe_step_time_error, predicted_step_times, step_time_error

DATA = Path(__file__).resolve().parents[2] / "sim" / "data"
RUN = DATA / "runs" / "cpu-small-float32" / "cpu-overload"


@pytest.fixture(scope="module")
def model():
    return CalibratedCostModel.from_file(DATA / "profiles" / "cpu-small-float32.json")


def test_predictions_are_the_cost_models_step_times(model):
    steps = pd.read_parquet(RUN / "steps.parquet")
    predicted, features = predicted_step_times(model, steps)
    assert len(predicted) == len(features) == int((steps["num_scheduled_tokens"] > 0).sum())
    first = features.iloc[0]
    from sim.cost_models import StepFeatures

    expected = model.step_time_from_features(StepFeatures(**{name: int(first[name]) for name in StepFeatures.__slots__}))
    assert predicted[0] == pytest.approx(expected)


def test_a_machine_running_slower_shows_in_the_total(model):
    steps = pd.read_parquet(RUN / "steps.parquet")
    report = step_time_error(model, steps)
    assert report["num_steps"] == len(steps)
    assert {"total", "median_abs", "decode_only_total", "with_prefill_total"} <= set(report)
    slower = steps.assign(duration=steps["duration"] * 1.1)  # every step measured 10% longer
    assert step_time_error(model, slower)["total"] == pytest.approx((1 + report["total"]) / 1.1 - 1)
    only_decodes = steps[steps["num_prefill_reqs"] == 0]
    assert "with_prefill_total" not in step_time_error(model, only_decodes)
    assert "decode-only" in describe_step_time_error(report)
    assert step_time_error(model, steps.iloc[:0]) == {"num_steps": 0}
    assert describe_step_time_error({"num_steps": 0}) is None
