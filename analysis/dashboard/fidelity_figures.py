"""A real run beside its simulation: how far the simulator's predictions are from what was measured.

When the simulation replays the real run's scheduler decisions (a replay, or a cost model good
enough that the decisions coincide), step k of one is step k of the other, and each step's predicted
duration can be set against its measured one. When the step counts differ the runs diverged, and
steps are only comparable as distributions. Requests correspond by request_id in either case: the
workload is the same.

Errors are relative to the measured value, (sim - real) / real, as in analysis.fidelity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.downsample import cdf_points, extreme_indices, sample_indices
from analysis.dashboard.figure_style import REFERENCE_LINE_COLOR, DashboardFigure, note_no_data, style
from analysis.dashboard.run_inputs import DashboardRun

SIMULATED_MODES = ("sim", "replay")
MAX_SCATTER_POINTS = 3000
MAX_PAIRS = 4


@dataclass
class FidelityPair:
    simulated: DashboardRun
    real: DashboardRun
    position: int = 0

    @property
    def suffix(self) -> str:
        """"" for the first pair shown, "-2", "-3"... after, so figure ids stay unique and stable."""
        return "" if self.position == 0 else f"-{self.position + 1}"


# Arrival times of the same request in a real run and its simulation: equal up to float rounding.
ARRIVAL_TOLERANCE_S = 1e-6


def same_request_stream(simulated: DashboardRun, real: DashboardRun) -> bool:
    """Whether the two runs served the same requests: the same ids, prompt lengths and arrival times.

    Only then is a row of one the same request as a row of the other, and their difference the
    simulator's error; two runs of different workloads would pair unrelated requests that share an id
    (and report errors of thousands of percent)."""
    columns = ["request_id", "num_prompt_tokens", "arrival_time"]
    sim_requests, real_requests = simulated.requests[columns], real.requests[columns]
    if len(sim_requests) != len(real_requests) or not len(real_requests):
        return False
    joined = real_requests.merge(sim_requests, on="request_id", suffixes=("_real", "_sim"))
    return (len(joined) == len(real_requests)
            and bool((joined["num_prompt_tokens_real"] == joined["num_prompt_tokens_sim"]).all())
            and bool(np.allclose(joined["arrival_time_real"], joined["arrival_time_sim"], rtol=0,
                                 atol=ARRIVAL_TOLERANCE_S)))


def find_pairs(runs: Sequence[DashboardRun]) -> list[FidelityPair]:
    """Every real run with every simulated or replayed run of the same request stream (at most
    MAX_PAIRS pairs)."""
    reals = [run for run in runs if run.mode == "real"]
    simulated = [run for run in runs if run.mode in SIMULATED_MODES]
    pairs = [FidelityPair(sim, real) for real in reals for sim in simulated
             if same_request_stream(sim, real)][:MAX_PAIRS]
    for position, pair in enumerate(pairs):
        pair.position = position
    return pairs


def steps_correspond(pair: FidelityPair) -> bool:
    """True when both runs have the same step numbers, so step k of one is step k of the other."""
    sim_steps, real_steps = pair.simulated.steps["step"], pair.real.steps["step"]
    return len(sim_steps) == len(real_steps) > 0 and bool(
        np.array_equal(np.sort(sim_steps.to_numpy()), np.sort(real_steps.to_numpy())))


def joined_steps(pair: FidelityPair) -> pd.DataFrame:
    """step, measured_ms (real), predicted_ms (sim), relative_error per step."""
    real = pair.real.steps[["step", "duration"]].rename(columns={"duration": "measured"})
    sim = pair.simulated.steps[["step", "duration"]].rename(columns={"duration": "predicted"})
    joined = real.merge(sim, on="step", how="inner")
    joined["measured_ms"] = joined["measured"].to_numpy(dtype=np.float64) * 1000.0
    joined["predicted_ms"] = joined["predicted"].to_numpy(dtype=np.float64) * 1000.0
    joined["relative_error"] = _relative_error(joined["predicted_ms"].to_numpy(), joined["measured_ms"].to_numpy())
    return joined


def joined_requests(pair: FidelityPair) -> pd.DataFrame:
    """Per request completed in both runs: {ttft,e2e}_ms_{real,sim} and their relative errors."""
    real = pair.real.latencies[["request_id", "ttft_ms", "e2e_ms"]]
    sim = pair.simulated.latencies[["request_id", "ttft_ms", "e2e_ms"]]
    joined = real.merge(sim, on="request_id", suffixes=("_real", "_sim"))
    for metric in ("ttft_ms", "e2e_ms"):
        joined[f"{metric}_error"] = _relative_error(joined[f"{metric}_sim"].to_numpy(),
                                                    joined[f"{metric}_real"].to_numpy())
    return joined


def step_duration_figure(pair: FidelityPair) -> DashboardFigure:
    sim, real = pair.simulated, pair.real
    if not steps_correspond(pair):
        return _step_duration_distributions(pair)
    joined = joined_steps(pair)
    keep = sample_indices(len(joined), MAX_SCATTER_POINTS,
                          always_keep=extreme_indices(np.abs(joined["relative_error"].to_numpy()), 100))
    shown = joined.iloc[keep]
    figure = go.Figure(go.Scatter(
        x=shown["measured_ms"], y=shown["predicted_ms"], mode="markers", name=f"{sim.label} vs {real.label}",
        marker={"color": sim.color, "size": 5, "opacity": 0.6},
        customdata=np.column_stack([shown["step"], 100.0 * shown["relative_error"]]),
        hovertemplate="step %{customdata[0]}<br>measured %{x:.2f} ms<br>predicted %{y:.2f} ms"
                      "<br>error %{customdata[1]:+.1f}%<extra></extra>",
    ))
    _add_identity_line(figure, np.r_[joined["measured_ms"], joined["predicted_ms"]])
    median_error = np.nanmedian(np.abs(joined["relative_error"])) if len(joined) else float("nan")
    style(figure, f"Step duration: predicted by {sim.label} vs measured on {real.label} "
                  f"(median |error| {100 * median_error:.1f}%)", height=640)
    figure.update_xaxes(title_text=f"measured step duration on {real.label} (ms)")
    figure.update_yaxes(title_text=f"predicted step duration by {sim.label} (ms)")
    sample_note = f" {len(shown):,} of {len(joined):,} steps drawn, the worst errors always." \
        if len(shown) < len(joined) else ""
    return DashboardFigure(
        f"fidelity-step-duration{pair.suffix}", "Step duration: predicted vs measured", figure,
        "Each point is one engine step, joined on its step number (the runs made the same scheduling "
        f"decisions). On the dashed line the prediction is exact; above it the simulator predicts too long a "
        f"step. Both axes are logarithmic.{sample_note}",
    )


def _step_duration_distributions(pair: FidelityPair) -> DashboardFigure:
    figure = go.Figure()
    for run in (pair.real, pair.simulated):
        points = cdf_points(run.steps["duration"].to_numpy(dtype=np.float64) * 1000.0)
        figure.add_trace(go.Scatter(
            x=points.values, y=points.fractions, mode="lines", name=f"{run.label} ({run.mode})",
            line={"color": run.color, "width": 2},
            hovertemplate=f"{run.label}<br>%{{x:.2f}} ms<br>%{{y:.2%}} of steps<extra></extra>",
        ))
    counts = f"{len(pair.real.steps):,} vs {len(pair.simulated.steps):,} steps"
    style(figure, f"Step duration distributions: {pair.real.label} vs {pair.simulated.label} ({counts})", height=460)
    figure.update_xaxes(title_text="step duration (ms)")
    figure.update_yaxes(title_text="fraction of steps", tickformat=".0%")
    return DashboardFigure(
        f"fidelity-step-duration{pair.suffix}", "Step duration distributions", figure,
        f"The runs have different steps ({counts}): their scheduling decisions diverged, so steps are "
        "compared as distributions rather than one by one.",
    )


def error_histogram_figure(pair: FidelityPair) -> DashboardFigure:
    panels = ["step duration error", "request E2E latency error"]
    figure = make_subplots(rows=1, cols=2, subplot_titles=panels, horizontal_spacing=0.1)
    step_errors = joined_steps(pair)["relative_error"].to_numpy() if steps_correspond(pair) else np.empty(0)
    request_errors = joined_requests(pair)["e2e_ms_error"].to_numpy()
    for column, (errors, unit) in enumerate(((step_errors, "steps"), (request_errors, "requests")), start=1):
        errors = errors[np.isfinite(errors)] * 100.0
        if errors.size:
            figure.add_trace(go.Histogram(
                x=errors, nbinsx=80, marker={"color": pair.simulated.color}, name=panels[column - 1],
                showlegend=False, hovertemplate=f"error %{{x}}%<br>%{{y:,}} {unit}<extra></extra>",
            ), row=1, col=column)
            figure.add_vline(x=0, line={"color": REFERENCE_LINE_COLOR, "dash": "dash"}, row=1, col=column)
        else:
            why = "steps do not correspond one to one" if unit == "steps" else "no request completed in both runs"
            figure.add_annotation(text=why, x=0.5, y=0.5, showarrow=False, font={"color": "#6b7280"},
                                  xref=f"x{column} domain" if column > 1 else "x domain",
                                  yref=f"y{column} domain" if column > 1 else "y domain")
        figure.update_xaxes(title_text="relative error, (sim - real) / real (%)", row=1, col=column)
        figure.update_yaxes(title_text=unit, row=1, col=column)
    style(figure, f"Error distributions: {pair.simulated.label} vs {pair.real.label}", height=440)
    return DashboardFigure(
        f"fidelity-error-histogram{pair.suffix}", "Error distributions", figure,
        "Relative error of each prediction; right of zero the simulator overestimates.",
    )


def request_latency_figure(pair: FidelityPair) -> DashboardFigure:
    joined = joined_requests(pair)
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                           subplot_titles=["E2E latency per request", "TTFT per request"])
    for column, metric in enumerate(("e2e_ms", "ttft_ms"), start=1):
        errors = np.abs(joined[f"{metric}_error"].to_numpy())
        keep = sample_indices(len(joined), MAX_SCATTER_POINTS, always_keep=extreme_indices(errors, 50))
        shown = joined.iloc[keep]
        figure.add_trace(go.Scatter(
            x=shown[f"{metric}_real"], y=shown[f"{metric}_sim"], mode="markers", showlegend=False,
            marker={"color": pair.simulated.color, "size": 5, "opacity": 0.6}, text=shown["request_id"],
            name=metric, hovertemplate="%{text}<br>real %{x:.1f} ms<br>sim %{y:.1f} ms<extra></extra>",
        ), row=1, col=column)
        _add_identity_line(figure, np.r_[joined[f"{metric}_real"], joined[f"{metric}_sim"]], row=1, col=column)
        name = "E2E" if metric == "e2e_ms" else "TTFT"
        figure.update_xaxes(title_text=f"{name} measured on {pair.real.label} (ms)", row=1, col=column)
        figure.update_yaxes(title_text=f"{name} simulated by {pair.simulated.label} (ms)", row=1, col=column)
    if not len(joined):
        note_no_data(figure, "no request completed in both runs")
    style(figure, f"Per-request latency: {pair.simulated.label} vs {pair.real.label} "
                  f"({len(joined):,} requests joined on request_id)", height=500)
    return DashboardFigure(
        f"fidelity-request-latency{pair.suffix}", "Per-request latency: simulated vs measured", figure,
        "Each point is one request completed in both runs; on the dashed line the simulation is exact. "
        "Both axes are logarithmic.",
    )


def _add_identity_line(figure: go.Figure, values: np.ndarray, row: int | None = None, col: int | None = None) -> None:
    """Draw y = x and give both axes the same logarithmic range, so distance from the line reads as
    the same relative error everywhere (durations and latencies span orders of magnitude)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values) & (values > 0)]
    if not values.size:
        return
    low, high = float(values.min()), float(values.max())
    trace = go.Scatter(x=[low, high], y=[low, high], mode="lines", name="y = x (exact)", showlegend=row is None,
                       line={"color": REFERENCE_LINE_COLOR, "dash": "dash", "width": 1}, hoverinfo="skip")
    padding = 0.05 * max(np.log10(high / low), 0.1)
    axis_range = [np.log10(low) - padding, np.log10(high) + padding]
    # Same range and scale on both axes: the plot is square and the y = x line runs at 45 degrees.
    x_axis = {"type": "log", "range": axis_range, "constrain": "domain"}
    y_axis = {"type": "log", "range": axis_range, "scaleratio": 1}
    if row is None:
        figure.add_trace(trace)
        figure.update_xaxes(**x_axis)
        figure.update_yaxes(**y_axis, scaleanchor="x")
    else:
        figure.add_trace(trace, row=row, col=col)
        figure.update_xaxes(**x_axis, row=row, col=col)
        figure.update_yaxes(**y_axis, scaleanchor="x" if col == 1 else f"x{col}", row=row, col=col)


def _relative_error(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(measured != 0, (predicted - measured) / np.abs(measured), np.nan)
