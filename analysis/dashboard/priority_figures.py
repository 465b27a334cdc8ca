"""Latency by priority class: what a scheduling policy gives each class, run beside run.

A priority workload is judged by its classes, not by its overall percentiles: load the run under
``scheduling_policy: priority`` and the same workload under ``fcfs`` into one dashboard, and each class
shows what the policy bought it (the interactive class) and what it cost (the batch class). The bars
read the summary's ``by_priority`` (analysis.metrics.priority_class_stats), so they are the printed
report's numbers; runs without classes are left out, and without any the section is absent.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.figure_style import DashboardFigure, style
from analysis.dashboard.run_inputs import DashboardRun

# (panel title, summary statistic)
CLASS_PANELS = (
    ("TTFT p50", ("ttft_ms", "p50")),
    ("TTFT p90", ("ttft_ms", "p90")),
    ("TPOT p90", ("tpot_ms", "p90")),
    ("E2E p90", ("e2e_ms", "p90")),
)


def priority_class_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    classed = [run for run in runs if run.summary.get("by_priority")]
    if not classed:
        return None
    figure = make_subplots(rows=1, cols=len(CLASS_PANELS), subplot_titles=[title for title, _ in CLASS_PANELS],
                           horizontal_spacing=0.06)
    for column, (title, (metric, statistic)) in enumerate(CLASS_PANELS, start=1):
        for run in classed:
            classes = run.summary["by_priority"]
            figure.add_trace(go.Bar(
                x=[str(priority) for priority in classes],
                y=[(stats.get(metric) or {}).get(statistic) for stats in classes.values()],
                customdata=[[stats.get("num_finished"), stats.get("num_requests")] for stats in classes.values()],
                name=run.label, legendgroup=run.label, showlegend=column == 1, marker={"color": run.color},
                hovertemplate=f"{run.label}<br>class %{{x}}: {title} %{{y:.2f}} ms"
                              "<br>%{customdata[0]:,} of %{customdata[1]:,} requests finished<extra></extra>",
            ), row=1, col=column)
        figure.update_xaxes(title_text="priority class", row=1, col=column)
        figure.update_yaxes(title_text="latency (ms)", rangemode="tozero", row=1, col=column)
    figure.update_layout(barmode="group")
    style(figure, "Latency by priority class (lower classes are served first)", height=420)
    return DashboardFigure(
        "priority-classes",
        "Latency by priority class",
        figure,
        "One group of bars per class, one bar per run: load the same workload under priority and fcfs "
        "scheduling together to see what the policy gives each class.",
    )
