"""A simulation against the mean of several recordings, and the recordings' spread about it."""

import pytest

from analysis.repeated_runs import compare_with_mean, mean_metrics, spread_about_mean, standard_error_of_mean

METRICS = ("request_throughput", "ttft_ms.p50")
REALS = [{"request_throughput": 2.0, "ttft_ms": {"p50": 100.0}},
         {"request_throughput": 2.2, "ttft_ms": {"p50": 140.0}},
         {"request_throughput": 2.1, "ttft_ms": {"p50": 120.0}}]


def test_mean_and_spread_of_three_recordings():
    assert mean_metrics(REALS, METRICS) == pytest.approx({"request_throughput": 2.1, "ttft_ms.p50": 120.0})
    spread = spread_about_mean(REALS, METRICS)
    assert spread["ttft_ms.p50"] == pytest.approx(20 / 120) and spread["request_throughput"] == pytest.approx(0.1 / 2.1)
    compared = compare_with_mean({"request_throughput": 2.1, "ttft_ms": {"p50": 132.0}}, REALS, METRICS)
    assert compared["ttft_ms.p50"] == {"sim": 132.0, "real": 120.0, "relative_error": pytest.approx(0.1)}
    assert compared["request_throughput"]["relative_error"] == pytest.approx(0.0)


def test_a_metric_one_recording_lacks_has_no_mean():
    reals = [*REALS[:2], {"request_throughput": 2.1}]
    assert mean_metrics(reals, METRICS)["ttft_ms.p50"] is None
    assert spread_about_mean(reals, METRICS)["ttft_ms.p50"] is None
    assert standard_error_of_mean(reals, METRICS)["ttft_ms.p50"] is None
    assert compare_with_mean(REALS[0], reals, METRICS)["ttft_ms.p50"]["relative_error"] is None


def test_standard_error_of_the_mean():
    # TTFT p50 100, 140, 120: standard deviation 20, over sqrt(3), relative to the mean 120.
    errors = standard_error_of_mean(REALS, METRICS)
    assert errors["ttft_ms.p50"] == pytest.approx(20 / 3 ** 0.5 / 120)
    assert errors["request_throughput"] == pytest.approx(0.1 / 3 ** 0.5 / 2.1)
    assert standard_error_of_mean(REALS[:1], METRICS) == {"request_throughput": None, "ttft_ms.p50": None}
