"""Per-step engine state over time: queue length, batch size, scheduled tokens, KV-cache usage.

One engine step is one point, so a long run has tens of thousands; each series is reduced by min/max
decimation (downsample.min_max_indices), which keeps every one-step spike visible. Preemptions are
drawn as markers on the KV-usage curve: they happen when the cache runs out, so that is where to
look for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.cluster_steps import cluster_size, cluster_step_view
from analysis.dashboard.downsample import min_max_indices, sample_indices
from analysis.dashboard.figure_style import DashboardFigure, new_figure, note_no_data, style
from analysis.dashboard.rate_figures import TIME_AXIS_TITLE
from analysis.dashboard.run_inputs import DashboardRun

# (column, panel title, y-axis title)
SCHEDULER_PANELS = (
    ("num_waiting", "queue length: requests waiting", "requests"),
    ("num_running", "batch size: requests running", "requests"),
    ("num_scheduled_tokens", "tokens scheduled per step", "tokens"),
)
# Preemption markers beyond this many are thinned (evenly, keeping the largest bursts).
MAX_PREEMPTION_MARKERS = 2000


def scheduler_state_figure(runs: Sequence[DashboardRun]) -> DashboardFigure:
    figure = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=[panel[1] for panel in SCHEDULER_PANELS])
    for row, (column, panel_title, axis_title) in enumerate(SCHEDULER_PANELS, start=1):
        for run in runs:
            times, values = _decimated(run, column)
            figure.add_trace(go.Scatter(
                x=times, y=values, mode="lines", name=run.label, legendgroup=run.label, showlegend=row == 1,
                line={"color": run.color, "width": 1.2},
                hovertemplate=f"{run.label}<br>t=%{{x:.2f}} s<br>%{{y:,}} {axis_title}<extra></extra>",
            ), row=row, col=1)
        figure.update_yaxes(title_text=axis_title, rangemode="tozero", row=row, col=1)
    figure.update_xaxes(title_text=TIME_AXIS_TITLE, row=3, col=1)
    style(figure, "Scheduler state per engine step", height=760)
    return DashboardFigure(
        "scheduler-state", "Queue, batch and scheduled tokens", figure,
        "One point per engine step at its start time; long runs keep each time bucket's minimum and "
        "maximum, so no spike is lost. A cluster's lines are its replicas' sums.",
    )


def kv_usage_figure(runs: Sequence[DashboardRun]) -> DashboardFigure:
    total_preemptions = sum(int(run.steps["num_preemptions"].sum()) for run in runs if len(run.steps))
    marked = f"{total_preemptions:,} preemptions marked x" if total_preemptions else "no preemptions"
    figure = new_figure(f"KV-cache usage over time ({marked})")
    use_blocks = not any(_has_kv_usage(run) for run in runs)
    column = "kv_blocks_used" if use_blocks else "kv_usage"
    drawn = False
    for run in runs:
        if not len(run.steps):
            continue
        scale = 1.0 if use_blocks else 100.0
        unit = "blocks" if use_blocks else "%"
        times, values = _decimated(run, column)
        figure.add_trace(go.Scatter(
            x=times, y=values * scale, mode="lines", name=run.label, legendgroup=run.label,
            line={"color": run.color, "width": 1.2},
            hovertemplate=f"{run.label}<br>t=%{{x:.2f}} s<br>KV %{{y:.1f}} {unit}<extra></extra>",
        ))
        drawn = True
        steps = cluster_step_view(run.steps, cluster_size(run.summary))
        preempting = np.flatnonzero(steps["num_preemptions"].to_numpy() > 0)
        if preempting.size == 0:
            continue
        counts = steps["num_preemptions"].to_numpy()[preempting]
        keep = sample_indices(preempting.size, MAX_PREEMPTION_MARKERS,
                              always_keep=np.argsort(counts)[-100:])
        rows = preempting[keep]
        figure.add_trace(go.Scatter(
            x=steps["start_time"].to_numpy(dtype=np.float64)[rows],
            y=steps[column].to_numpy(dtype=np.float64)[rows] * scale,
            mode="markers", name=f"{run.label} preemptions ({int(counts.sum()):,})", legendgroup=run.label,
            marker={"color": run.color, "symbol": "x", "size": 9, "line": {"width": 1}},
            customdata=steps["num_preemptions"].to_numpy()[rows],
            hovertemplate=f"{run.label}<br>t=%{{x:.2f}} s<br>%{{customdata}} preempted"
                          f"<br>KV %{{y:.1f}} {unit}<extra></extra>",
        ))
    if not drawn:
        note_no_data(figure, "no engine steps recorded")
    figure.update_xaxes(title_text=TIME_AXIS_TITLE)
    if use_blocks:
        figure.update_yaxes(title_text="KV blocks in use (blocks)", rangemode="tozero")
    else:
        figure.update_yaxes(title_text="KV-cache usage (% of usable blocks)", range=[0, 102])
    return DashboardFigure(
        "kv-cache-usage", "KV-cache usage and preemptions", figure,
        "Share of the usable KV blocks held by requests after each step (a cluster: the mean over its "
        "replicas); an x marks a step that preempted requests to free blocks (hover for how many).",
    )


def _has_kv_usage(run: DashboardRun) -> bool:
    return "kv_usage" in run.steps.columns and bool(np.isfinite(run.steps["kv_usage"].to_numpy(dtype=np.float64)).any())


def _decimated(run: DashboardRun, column: str) -> tuple[np.ndarray, np.ndarray]:
    steps = cluster_step_view(run.steps, cluster_size(run.summary))
    if not len(steps) or column not in steps.columns:
        return np.empty(0), np.empty(0)
    times = steps["start_time"].to_numpy(dtype=np.float64)
    values = steps[column].to_numpy(dtype=np.float64)
    keep = min_max_indices(times, values)
    return times[keep], values[keep]
