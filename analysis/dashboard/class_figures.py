"""The workload's request classes side by side: what each concurrent stream got, under its own SLO.

A workload of several classes (``workload.classes``) is judged class by class: interactive chat's TTFT
beside batch summarization's end-to-end time, each against its own target. Two figures:

- the classes' TTFT and E2E distributions (CDFs from the requests table's ``request_class`` column), one
  colour per run as everywhere on the page and one dash per class;
- bars of each class's SLO attainment, TTFT p90 and E2E p90, read from the summary's ``by_class``
  (analysis.class_stats), so they are the printed report's numbers; one bar per run, as the replica
  section draws them.

Runs of one class are left out, and without a run of several classes the section is absent. Load a sweep
over a class's rate, or over ``engine.scheduling_policy``, to set the points beside each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.downsample import cdf_points
from analysis.dashboard.figure_style import DashboardFigure, log_linear_buttons, style
from analysis.dashboard.grouped_bars import grouped_bar_panels, percent
from analysis.dashboard.run_inputs import DashboardRun
from analysis.trace_schema import request_classes

# One dash per class, in the workload's order (a class past the list reuses them from the start).
CLASS_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")

# (panel title, metric column of DashboardRun.latencies)
DISTRIBUTION_PANELS = (("TTFT by class", "ttft_ms"), ("E2E by class", "e2e_ms"))

# (panel title, axis title, read one class's statistics, hover format)
CLASS_PANELS = (
    ("SLO attainment (own SLO)", "%", lambda stats: percent(stats.get("slo_attainment")), "%{y:.1f}%"),
    ("TTFT p90", "ms", lambda stats: (stats.get("ttft_ms") or {}).get("p90"), "%{y:,.1f} ms"),
    ("E2E p90", "ms", lambda stats: (stats.get("e2e_ms") or {}).get("p90"), "%{y:,.0f} ms"),
    ("throughput", "req/s", lambda stats: stats.get("request_throughput"), "%{y:.2f} req/s"),
)


def _classed(runs: Sequence[DashboardRun]) -> list[DashboardRun]:
    return [run for run in runs if run.summary.get("by_class")]


def class_distribution_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    classed = _classed(runs)
    if not classed:
        return None
    names = list(dict.fromkeys(name for run in classed for name in run.summary["by_class"]))
    figure = make_subplots(rows=1, cols=len(DISTRIBUTION_PANELS), horizontal_spacing=0.08,
                           subplot_titles=[title for title, _ in DISTRIBUTION_PANELS])
    for column, (title, metric) in enumerate(DISTRIBUTION_PANELS, start=1):
        for run in classed:
            # The latencies' rows are the completed requests, in the requests table's order.
            classes = request_classes(run.requests)[run.completed]
            values = run.latencies[metric].to_numpy(dtype=np.float64)
            for position, name in enumerate(names):
                points = cdf_points(values[classes == name])
                label = f"{run.label}: {name}" if len(classed) > 1 else name
                figure.add_trace(go.Scatter(
                    x=points.values, y=points.fractions, mode="lines", name=label, legendgroup=label,
                    showlegend=column == 1,
                    line={"color": run.color, "width": 2, "dash": CLASS_DASHES[position % len(CLASS_DASHES)]},
                    hovertemplate=f"{label}<br>{title.split()[0]} %{{x:,.1f}} ms<br>%{{y:.1%}} of "
                                  f"{points.count:,} requests<extra></extra>",
                ), row=1, col=column)
        figure.update_xaxes(title_text="latency (ms)", type="log", row=1, col=column)
        figure.update_yaxes(title_text="fraction of the class's requests", tickformat=".0%", range=[0, 1.02],
                            row=1, col=column)
    style(figure, "Latency distributions by request class (CDF)", height=440)
    figure.update_layout(updatemenus=log_linear_buttons(["xaxis", "xaxis2"], start_log=True))
    return DashboardFigure(
        "class-distributions",
        "Latency by request class",
        figure,
        "One curve per request class (its dash) of each run (its colour): read across at 90% for a class's "
        "p90. The x axes are logarithmic; 'linear x' switches.",
    )


def class_bar_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    classed = _classed(runs)
    if not classed:
        return None
    figure = grouped_bar_panels(classed, "by_class", CLASS_PANELS, "request class", lambda run, stats: (
        f"<br>{stats.get('num_finished'):,} of {stats.get('num_requests'):,} requests finished"
        if stats.get("num_finished") is not None and stats.get("num_requests") is not None else ""))
    style(figure, "Request classes, each under its own SLO", height=420)
    return DashboardFigure(
        "request-classes",
        "Request classes",
        figure,
        "One group of bars per request class, one bar per run. Each class's attainment is judged by its own "
        "SLO (the workload's classes[i].slo, else the top-level slo).",
    )
