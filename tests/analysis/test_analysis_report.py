import io

import pytest
from rich.console import Console

from analysis.fidelity import compare_runs, format_fidelity_report, print_fidelity_report, relative_error
from analysis.metrics import compute_summary
from analysis.report import format_comparison, format_summary, print_summary
from analysis.trace_schema import REQUIRED_REQUEST_COLUMNS, requests_table, steps_table


@pytest.fixture
def summary(request_columns, step_columns):
    return compute_summary(
        requests_table(request_columns).to_pandas(),
        steps_table(step_columns).to_pandas(),
        name="hand",
        mode="sim",
        config={},
        slo={"ttft_ms": 450, "tpot_ms": 300},
    )


def test_format_summary_shows_the_key_numbers(summary):
    text = format_summary(summary)
    assert "hand (sim)" in text
    assert "3/4 (1 aborted)" in text
    assert "1.00 req/s" in text  # request throughput
    assert "2.7 tok/s" in text  # 8 tokens / 3 s
    assert "0.67 req/s" in text and "66.7%" in text  # goodput and SLO attainment
    assert "ttft<=450ms" in text
    assert "36.7% / 60.0%" in text  # KV usage mean / max
    assert "40.0%" in text  # prefix-cache hit rate
    for number in ("400.00", "480.00", "498.00", "350.00", "320.00", "1,490.00", "180.00"):
        assert number in text
    for label in ("TTFT", "TPOT", "ITL", "E2E", "Queue"):
        assert label in text
    assert "\x1b[" not in text  # plain text, no terminal codes


def test_format_summary_of_an_empty_run():
    empty = compute_summary(
        requests_table({name: [] for name in REQUIRED_REQUEST_COLUMNS}).to_pandas(),
        None, name="empty", mode="replay", config={}, slo=None,
    )
    text = format_summary(empty)
    assert "empty (replay)" in text and "0/0" in text and "-" in text
    assert format_summary({}) != ""  # even a bare dictionary prints


def test_print_summary_uses_the_given_console(summary):
    buffer = io.StringIO()
    print_summary(summary, console=Console(file=buffer, width=100, color_system=None))
    assert "TTFT" in buffer.getvalue()


def test_format_comparison_lists_every_run(summary):
    other = dict(summary, name="other", request_throughput=2.5)
    text = format_comparison([summary, other], labels=["baseline", "bigger batch"])
    assert "baseline" in text and "bigger batch" in text
    assert "2.50" in text and "TTFT p99 (ms)" in text
    assert "hand" in format_comparison([summary])  # labels default to run names
    with pytest.raises(ValueError, match="labels"):
        format_comparison([summary], labels=["a", "b"])


def test_relative_error():
    assert relative_error(110.0, 100.0) == pytest.approx(0.1)
    assert relative_error(90, 100) == pytest.approx(-0.1)
    assert relative_error(0.0, 0.0) == 0.0
    assert relative_error(1.0, 0.0) is None
    assert relative_error(None, 1.0) is None


def test_compare_runs_reports_relative_errors(summary):
    simulated = dict(summary, name="simulated", request_throughput=1.2)
    simulated["ttft_ms"] = dict(summary["ttft_ms"], p50=440.0)
    comparison = compare_runs(simulated, summary)
    metrics = comparison["metrics"]
    assert metrics["request_throughput"]["relative_error"] == pytest.approx(0.2)
    assert metrics["ttft_ms.p50"] == {
        "sim": 440.0, "real": pytest.approx(400.0), "relative_error": pytest.approx(0.1)
    }
    assert metrics["tpot_ms.p99"]["relative_error"] == 0.0
    for key in ("ttft_ms.p90", "itl_ms.p99", "e2e_ms.p50", "output_token_throughput"):
        assert key in metrics
    assert comparison["worst_metric"] == "request_throughput"
    assert comparison["max_abs_relative_error"] == pytest.approx(0.2)

    text = format_fidelity_report(comparison)
    assert "simulated vs hand" in text and "+20.0%" in text and "off" in text and "ok" in text
    buffer = io.StringIO()
    print_fidelity_report(comparison, console=Console(file=buffer, width=100, color_system=None))
    assert "+10.0%" in buffer.getvalue()


def test_fidelity_marks_judge_the_printed_figure_and_the_caption_is_a_legend(summary):
    """-5.8% is off within 5%; exactly 5% (which float arithmetic makes 5.0000000000000004%) and 5.04%
    (printed 5.0%) are ok, so a mark never contradicts its row; the caption reads as a legend."""
    simulated = dict(summary, request_throughput=summary["request_throughput"] * 1.05)
    simulated["ttft_ms"] = dict(summary["ttft_ms"], p50=summary["ttft_ms"]["p50"] * (1 - 0.058),
                                p90=summary["ttft_ms"]["p90"] * 1.0504)
    comparison = compare_runs(simulated, summary)
    text = format_fidelity_report(comparison, tolerance=0.05)
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│")}
    assert "-5.8%" in rows["ttft_ms.p50"] and rows["ttft_ms.p50"].rstrip("│ ").endswith("off")
    assert "+5.0%" in rows["request_throughput"] and rows["request_throughput"].rstrip("│ ").endswith("ok")
    assert "+5.0%" in rows["ttft_ms.p90"] and rows["ttft_ms.p90"].rstrip("│ ").endswith("ok")
    caption = " ".join(text.split())
    assert "rows marked ok are within 5% of the real value" in caption and "(ok:" not in caption


def test_runs_of_sessions_also_compare_their_later_turns(summary):
    sessions = {"later_turns": {"cached_fraction": 0.8, "ttft_ms_p50": 100.0, "ttft_ms_p90": 200.0},
                "session_duration_s_p50": 10.0}
    real = dict(summary, sessions=sessions)
    simulated = dict(summary, sessions=dict(sessions, later_turns=dict(sessions["later_turns"], ttft_ms_p90=230.0)))
    metrics = compare_runs(simulated, real)["metrics"]
    assert metrics["sessions.later_turns.ttft_ms_p90"]["relative_error"] == pytest.approx(0.15)
    assert metrics["sessions.later_turns.cached_fraction"]["relative_error"] == 0.0
    assert "sessions.session_duration_s_p50" in metrics
    assert not any(key.startswith("sessions.") for key in compare_runs(summary, summary)["metrics"])
    assert not any(key.startswith("sessions.") for key in compare_runs(simulated, summary)["metrics"])
