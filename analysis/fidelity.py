"""Simulation fidelity: how far a simulated run's metrics are from the real run of the same workload.

A fidelity report runs one workload twice (real executor, then simulator with a cost model calibrated
on the real steps) and sets the two summaries side by side. The error of a metric is signed and
relative to the real value, (sim - real) / |real|, so +0.10 reads "the simulator says 10% more".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from analysis.report import format_number, render_text, summary_value

# Dotted summary keys compared by default: throughputs, then latency percentiles.
FIDELITY_METRICS: tuple[str, ...] = (
    "request_throughput",
    "output_token_throughput",
    *(
        f"{metric}.p{percentile}"
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
        for percentile in (50, 90, 99)
    ),
    "kv_usage_mean",
)

# Compared too when both runs hold multi-turn sessions (analysis.session_stats): how much of the later turns'
# history the cache held, what that did to their time to first token, and how long a conversation took.
SESSION_METRICS: tuple[str, ...] = (
    "sessions.later_turns.cached_fraction",
    "sessions.later_turns.ttft_ms_p50",
    "sessions.later_turns.ttft_ms_p90",
    "sessions.session_duration_s_p50",
)

# A metric within this relative error of the real value is marked as matching in the printed report.
DEFAULT_TOLERANCE = 0.10


def relative_error(simulated: Any, real: Any) -> float | None:
    """(simulated - real) / |real|; 0 when both are 0; None when undefined."""
    if not _is_number(simulated) or not _is_number(real):
        return None
    if real == 0:
        return 0.0 if simulated == 0 else None
    return (float(simulated) - float(real)) / abs(float(real))


def compare_runs(
    sim_summary: Mapping[str, Any],
    real_summary: Mapping[str, Any],
    metrics: Sequence[str] = FIDELITY_METRICS,
) -> dict[str, Any]:
    """Metric-by-metric comparison of a simulated and a real summary (JSON-safe); runs of multi-turn sessions
    add SESSION_METRICS to the default metrics.

    Returns {"sim_name", "real_name", "metrics": {key: {"sim", "real", "relative_error"}},
    "mean_abs_relative_error", "max_abs_relative_error", "worst_metric"}; the aggregates cover the
    metrics whose error is defined.
    """
    rows: dict[str, dict[str, Any]] = {}
    if sim_summary.get("sessions") and real_summary.get("sessions") and metrics is FIDELITY_METRICS:
        metrics = (*metrics, *SESSION_METRICS)
    for key in metrics:
        simulated = summary_value(sim_summary, key)
        real = summary_value(real_summary, key)
        rows[key] = {"sim": simulated, "real": real, "relative_error": relative_error(simulated, real)}
    defined = {
        key: abs(row["relative_error"]) for key, row in rows.items() if row["relative_error"] is not None
    }
    worst = max(defined, key=defined.get) if defined else None
    return {
        "sim_name": sim_summary.get("name"),
        "real_name": real_summary.get("name"),
        "metrics": rows,
        "mean_abs_relative_error": sum(defined.values()) / len(defined) if defined else None,
        "max_abs_relative_error": defined[worst] if worst else None,
        "worst_metric": worst,
    }


def within_tolerance(error: float, tolerance: float) -> bool:
    """Whether a relative error is within ``tolerance``, judged on the figure the table prints (0.1%
    steps): a row reading -5.0% is ok within 5% and one reading -5.1% is off, so the mark never
    contradicts the number beside it (nor float noise, 1.05 / 1 - 1 = 0.0500000000000000044, a 5.0%)."""
    return round(abs(100.0 * error), 1) <= round(100.0 * tolerance, 1)


def fidelity_table(comparison: Mapping[str, Any], tolerance: float = DEFAULT_TOLERANCE) -> Table:
    title = f"fidelity: {comparison.get('sim_name') or 'sim'} vs {comparison.get('real_name') or 'real'}"
    table = Table(title=title, padding=(0, 1))
    table.add_column("metric", style="bold")
    for column in ("sim", "real", "rel. error", ""):
        table.add_column(column, justify="right")
    for key, row in comparison["metrics"].items():
        error = row["relative_error"]
        if error is None:
            error_text, verdict = "-", ""
        else:
            error_text = f"{100.0 * error:+.1f}%"
            verdict = "ok" if within_tolerance(error, tolerance) else "off"
        table.add_row(key, format_number(row["sim"]), format_number(row["real"]), error_text, verdict)
    mean_error = comparison.get("mean_abs_relative_error")
    if mean_error is not None:
        table.caption = (
            f"mean |error| {100.0 * mean_error:.1f}%, worst {comparison['worst_metric']} "
            f"{100.0 * comparison['max_abs_relative_error']:.1f}%; rows marked ok are within "
            f"{100.0 * tolerance:g}% of the real value"
        )
    return table


def format_fidelity_report(comparison: Mapping[str, Any], tolerance: float = DEFAULT_TOLERANCE) -> str:
    return render_text(fidelity_table(comparison, tolerance))


def print_fidelity_report(
    comparison: Mapping[str, Any], console: Console | None = None, tolerance: float = DEFAULT_TOLERANCE
) -> None:
    (console or Console()).print(fidelity_table(comparison, tolerance))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
