"""The profile's error on a real run's own steps (sim/step_time_error.py), on a shipped recording."""

from pathlib import Path

import pandas as pd
import pytest

from sim.cost_models import CalibratedCostModel
from sim.step_time_error import (describe_step_time_error, predicted_step_times, step_kind_labels, step_time_error,
                                  step_time_error_by_kind, time_sharing_error)

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


def test_the_error_by_kind_of_step_points_at_the_steps_that_are_off(model):
    steps = pd.read_parquet(DATA / "runs" / "cpu-small-float32" / "cpu-long-prompts" / "steps.parquet")
    rows = step_time_error_by_kind(model, steps)
    assert sum(row["num_steps"] for row in rows) == step_time_error(model, steps)["num_steps"]
    assert sum(row["time_share"] for row in rows) == pytest.approx(1.0)
    shares = [row["time_share"] for row in rows]
    assert shares == sorted(shares, reverse=True)
    kinds = {row["kind"]: row for row in rows}
    assert "decode only" in kinds and any(kind.startswith("prefill >512") for kind in kinds)
    # Measure the long chunks 20% slower: only their rows move, by exactly that much.
    long_chunks = steps["num_prefill_tokens"] > 512
    slower = steps.assign(duration=steps["duration"].where(~long_chunks, steps["duration"] * 1.2))
    for row in step_time_error_by_kind(model, slower):
        before = kinds[row["kind"]]["total"]
        expected = (1 + before) / 1.2 - 1 if row["kind"].startswith("prefill >512") else before
        assert row["total"] == pytest.approx(expected), row["kind"]
    assert step_time_error_by_kind(model, steps.iloc[:0]) == []


def test_step_kinds_split_prefill_chunks_by_size_and_context():
    features = pd.DataFrame({"num_prefill_reqs": [0, 1, 1, 2, 1, 1, 2],
                             "num_prefill_tokens": [0, 128, 129, 1024, 600, 1000, 90],
                             "prefill_context_tokens": [0, 0, 300, 0, 16, 1025, 1024]})
    assert list(step_kind_labels(features)) == [
        "decode only", "prefill 1-128, fresh", "prefill 129-512, after context", "prefill >512, fresh",
        "prefill >512, after context", "prefill >512, after >1,024 cached", "prefill 1-128, after context"]


def test_the_sharing_error_ignores_the_machines_speed_and_sees_a_kind_that_is_off(model):
    # Two kinds, equal time: one timed 10% long, one 10% short. The total is right, each kind 10% off.
    assert time_sharing_error([{"time_share": 0.5, "total": 0.1}, {"time_share": 0.5, "total": -0.1}]) == pytest.approx(0.1)
    # Every kind 10% long: only the speed is off, and the sharing is right.
    assert time_sharing_error([{"time_share": 0.3, "total": 0.1}, {"time_share": 0.7, "total": 0.1}]) == pytest.approx(0.0)
    assert time_sharing_error([]) == 0.0
    steps = pd.read_parquet(DATA / "runs" / "cpu-small-float32" / "cpu-long-prompts" / "steps.parquet")
    report = step_time_error(model, steps)
    assert 0 < report["sharing_error"] < 0.05
    slower = steps.assign(duration=steps["duration"] * 1.1)
    assert step_time_error(model, slower)["sharing_error"] == pytest.approx(report["sharing_error"])
    long_chunks = steps["num_prefill_tokens"] > 512
    skewed = steps.assign(duration=steps["duration"].where(~long_chunks, steps["duration"] * 1.2))
    assert step_time_error(model, skewed)["sharing_error"] > report["sharing_error"] + 0.02
    assert "time shared between kinds of step" in describe_step_time_error(report)
