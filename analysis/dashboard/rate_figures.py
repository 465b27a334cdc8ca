"""Rates over time, from events counted in round-width time bins: throughput, goodput, prefix hits.

Binning is the honest reduction for a rate (a count per bin divided by the bin width) and gives every
run the same bins, so runs overlay bin for bin. The bin width is chosen once for all runs shown.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.downsample import binned_sum, time_bin_edges
from analysis.dashboard.figure_style import DashboardFigure, new_figure, note_no_data, style
from analysis.dashboard.run_inputs import DashboardRun
from analysis.metrics import flatten_token_times

TIME_AXIS_TITLE = "time since start (s)"


def common_time_edges(runs: Sequence[DashboardRun]) -> np.ndarray:
    """Bin edges covering every run's requests and steps."""
    starts, stops = [], []
    for run in runs:
        for times in (run.requests["arrival_time"], run.requests["finish_time"], run.steps["start_time"]):
            values = times.to_numpy(dtype=np.float64)
            values = values[np.isfinite(values)]
            if values.size:
                starts.append(values.min())
                stops.append(values.max())
    if not starts:
        return np.array([0.0, 1.0])
    return time_bin_edges(min(starts), max(stops))


def throughput_figure(runs: Sequence[DashboardRun]) -> DashboardFigure:
    edges = common_time_edges(runs)
    width = float(edges[1] - edges[0])
    centers = (edges[:-1] + edges[1:]) / 2.0
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                           subplot_titles=["completed requests per second (solid) and goodput (dotted)",
                                           "output tokens per second"])
    any_slo = False
    for run in runs:
        finish = run.requests["finish_time"].to_numpy(dtype=np.float64)[run.completed]
        figure.add_trace(go.Scatter(
            x=centers, y=binned_sum(finish, None, edges) / width, mode="lines", name=run.label,
            legendgroup=run.label, line={"color": run.color, "width": 2, "shape": "hv"},
            hovertemplate=f"{run.label}<br>t=%{{x:.1f}} s<br>%{{y:.2f}} req/s<extra></extra>",
        ), row=1, col=1)
        if run.summary.get("slo"):
            any_slo = True
            figure.add_trace(go.Scatter(
                x=centers, y=binned_sum(finish[run.meets_slo], None, edges) / width, mode="lines",
                name=f"{run.label} goodput", legendgroup=run.label, showlegend=False,
                line={"color": run.color, "width": 2, "dash": "dot", "shape": "hv"},
                hovertemplate=f"{run.label} goodput<br>t=%{{x:.1f}} s<br>%{{y:.2f}} req/s<extra></extra>",
            ), row=1, col=1)
        token_times, _ = flatten_token_times(run.requests["token_times"])
        figure.add_trace(go.Scatter(
            x=centers, y=binned_sum(token_times, None, edges) / width, mode="lines", name=run.label,
            legendgroup=run.label, showlegend=False, line={"color": run.color, "width": 2, "shape": "hv"},
            hovertemplate=f"{run.label}<br>t=%{{x:.1f}} s<br>%{{y:,.0f}} tok/s<extra></extra>",
        ), row=2, col=1)
    figure.update_yaxes(title_text="requests/s", rangemode="tozero", row=1, col=1)
    figure.update_yaxes(title_text="tokens/s", rangemode="tozero", row=2, col=1)
    figure.update_xaxes(title_text=TIME_AXIS_TITLE, row=2, col=1)
    style(figure, f"Throughput and goodput over time ({_format_width(width)} bins)", height=620)
    slo_note = ("Goodput counts only requests that met every SLO of the run." if any_slo
                else "No run has an SLO, so goodput equals throughput and is not drawn.")
    return DashboardFigure(
        "throughput-over-time", "Throughput and goodput over time", figure,
        f"Requests counted when they finish, tokens when they are emitted. {slo_note}",
    )


def prefix_hit_figure(runs: Sequence[DashboardRun]) -> DashboardFigure:
    edges = common_time_edges(runs)
    width = float(edges[1] - edges[0])
    centers = (edges[:-1] + edges[1:]) / 2.0
    figure = new_figure(f"Prefix-cache hit rate over time ({_format_width(width)} bins; dashed: whole run)")
    drawn = False
    for run in runs:
        steps = run.steps
        if "prefix_query_tokens" not in steps.columns or not len(steps):
            continue
        start = steps["start_time"].to_numpy(dtype=np.float64)
        queries = binned_sum(start, steps["prefix_query_tokens"].to_numpy(), edges)
        hits = binned_sum(start, steps["prefix_hit_tokens"].to_numpy(), edges)
        # A bin where no request looked up the cache has no hit rate: leave a gap, don't draw 0.
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(queries > 0, hits / queries, np.nan)
        overall = run.summary.get("prefix_cache_hit_rate")
        if overall is None:
            total = queries.sum()
            overall = float(hits.sum() / total) if total > 0 else 0.0
        figure.add_trace(go.Scatter(
            x=centers, y=rate, mode="lines+markers", name=f"{run.label} (whole run {overall:.1%})",
            legendgroup=run.label, line={"color": run.color, "width": 1.5}, marker={"size": 4},
            connectgaps=False,
            hovertemplate=f"{run.label}<br>t=%{{x:.1f}} s<br>hit rate %{{y:.1%}}<extra></extra>",
        ))
        figure.add_hline(y=overall, line={"color": run.color, "dash": "dash", "width": 1.5})
        drawn = True
    if not drawn:
        note_no_data(figure, "no prefix-cache lookups recorded")
    figure.update_xaxes(title_text=TIME_AXIS_TITLE)
    figure.update_yaxes(title_text="hit rate (% of looked-up prompt tokens)", tickformat=".0%",
                        rangemode="tozero")
    return DashboardFigure(
        "prefix-cache-hit-rate", "Prefix-cache hit rate", figure,
        "Prompt tokens found in the prefix cache divided by prompt tokens looked up, by requests first "
        "scheduled in each bin. Gaps are bins where no request was first scheduled.",
    )


def _format_width(width: float) -> str:
    return f"{width:g} s"
