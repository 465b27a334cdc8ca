"""Whether a sweep point meets its SLO (the sweep dashboard's marker), and the fidelity report's headline
error when a metric has no value: missing values are neither passed nor hidden."""

from analysis.dashboard.sweep_figures import meets_slo
from sim.validate_report import describe_headline_error, headline_error, undefined_headline_metrics
from sim.validate_report import HEADLINE_METRICS


def summary(ttft_p90, tpot_p90, num_finished=10):
    return {"slo": {"ttft_ms": 500, "tpot_ms": 50, "e2e_ms": None}, "num_finished": num_finished,
            "ttft_ms": {"p90": ttft_p90}, "tpot_ms": {"p90": tpot_p90}}


def test_one_token_outputs_have_no_tpot_and_do_not_miss_its_slo():
    assert meets_slo(summary(ttft_p90=200, tpot_p90=None)) is True
    assert meets_slo(summary(ttft_p90=900, tpot_p90=None)) is False
    assert meets_slo(summary(ttft_p90=200, tpot_p90=60)) is False
    # Nothing finished: no values at all, and that misses.
    assert meets_slo(summary(ttft_p90=None, tpot_p90=None, num_finished=0)) is False
    assert meets_slo({"slo": None}) is None


def test_an_undefined_error_is_named_not_counted_as_zero():
    metrics = {key: {"relative_error": 0.02} for key in HEADLINE_METRICS}
    metrics[HEADLINE_METRICS[0]]["relative_error"] = -0.07
    comparison = {"metrics": metrics}
    assert headline_error(comparison) == 0.07 and undefined_headline_metrics(comparison) == []
    tpot = next(key for key in HEADLINE_METRICS if key.startswith("tpot"))
    metrics[tpot]["relative_error"] = None
    assert headline_error(comparison) == 0.07
    assert undefined_headline_metrics(comparison) == [tpot]
    assert f"no error for {tpot}" in describe_headline_error(comparison)
