"""Latency distributions: TTFT, TPOT, ITL and E2E as CDFs, one curve per run, percentiles marked.

A CDF shows the whole distribution at once, and runs overlay cleanly; the p50/p90/p99 markers sit
on the curves (same interpolation as the summary) and the maximum is always drawn, because the tail
is what an SLO is about.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.downsample import cdf_points, percentile
from analysis.dashboard.figure_style import DashboardFigure, log_linear_buttons, style
from analysis.dashboard.run_inputs import DashboardRun

# (panel title, what one sample is, how to get the samples in ms from a run)
LATENCY_PANELS = (
    ("TTFT: time to first token", "requests", lambda run: run.latencies["ttft_ms"].to_numpy()),
    ("TPOT: time per output token", "requests", lambda run: run.latencies["tpot_ms"].to_numpy()),
    ("ITL: inter-token latency", "token gaps", lambda run: run.inter_token_ms),
    ("E2E: end-to-end latency", "requests", lambda run: run.latencies["e2e_ms"].to_numpy()),
)
MARKED_PERCENTILES = (50, 90, 99)


def latency_cdf_figure(runs: Sequence[DashboardRun]) -> DashboardFigure:
    figure = make_subplots(rows=2, cols=2, subplot_titles=[panel[0] for panel in LATENCY_PANELS],
                           horizontal_spacing=0.09, vertical_spacing=0.16)
    label_markers = len(runs) <= 2
    for panel_index, (panel_title, unit_name, read_samples) in enumerate(LATENCY_PANELS):
        row, column = divmod(panel_index, 2)
        for run in runs:
            samples = np.asarray(read_samples(run), dtype=np.float64)
            for trace in _cdf_traces(run, samples, panel_title.split(":")[0], unit_name,
                                     show_legend=panel_index == 0, label_markers=label_markers):
                figure.add_trace(trace, row=row + 1, col=column + 1)
        figure.update_xaxes(title_text="latency (ms)", row=row + 1, col=column + 1)
        figure.update_yaxes(title_text=f"fraction of {unit_name}", tickformat=".0%", range=[0, 1.02],
                            row=row + 1, col=column + 1)
    style(figure, "Latency distributions (CDF; markers at p50, p90, p99 and max)", height=760)
    # Log x by default: latency tails span orders of magnitude, and a linear axis squeezes the body
    # of every curve against zero to make room for the maximum.
    figure.update_xaxes(type="log")
    figure.update_layout(updatemenus=log_linear_buttons(["xaxis", "xaxis2", "xaxis3", "xaxis4"], start_log=True))
    return DashboardFigure(
        "latency-cdf",
        "Latency distributions",
        figure,
        "Each curve is a cumulative distribution: read across at 90% to get p90. The tail beyond p99 "
        "is drawn from the exact slowest samples. The x axes are logarithmic; 'linear x' switches.",
    )


def _cdf_traces(run: DashboardRun, samples: np.ndarray, metric: str, unit_name: str, *, show_legend: bool,
                label_markers: bool) -> list[go.Scatter]:
    points = cdf_points(samples)
    if points.count == 0:
        return [go.Scatter(x=[], y=[], name=run.label, legendgroup=run.label, showlegend=show_legend,
                           line={"color": run.color})]
    curve = go.Scatter(
        x=points.values,
        y=points.fractions,
        mode="lines",
        name=run.label,
        legendgroup=run.label,
        showlegend=show_legend,
        line={"color": run.color, "width": 2, "shape": "linear"},
        hovertemplate=f"{run.label}<br>{metric} %{{x:.2f}} ms<br>%{{y:.2%}} of {unit_name}<extra></extra>",
    )
    marks = [(f"p{level}", percentile(samples, level), level / 100.0) for level in MARKED_PERCENTILES]
    marks.append(("max", float(points.values[-1]), 1.0))
    markers = go.Scatter(
        x=[value for _, value, _ in marks],
        y=[fraction for _, _, fraction in marks],
        mode="markers+text" if label_markers else "markers",
        text=[name for name, _, _ in marks],
        # Percentile labels left of their marker (the empty side of a CDF), the maximum's right of it:
        # p99 and max sit at almost the same height and would otherwise print over each other.
        textposition=["middle left"] * len(MARKED_PERCENTILES) + ["middle right"],
        cliponaxis=False,
        textfont={"size": 10, "color": run.color},
        marker={"color": run.color, "size": 8, "symbol": "diamond", "line": {"color": "white", "width": 1}},
        name=f"{run.label} percentiles",
        legendgroup=run.label,
        showlegend=False,
        customdata=[name for name, _, _ in marks],
        hovertemplate=f"{run.label}<br>{metric} %{{customdata}} = %{{x:.2f}} ms"
                      f"<br>({points.count:,} {unit_name})<extra></extra>",
    )
    return [curve, markers]
