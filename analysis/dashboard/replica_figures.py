"""A cluster's replicas side by side: the share of the traffic the router gave each, and what came of it.

A router is judged by its replicas: an even share of requests can still leave one replica busier (longer
prompts, fewer cache hits), and a cache-aware router trades some balance for hits. The bars read the
summary's ``by_replica`` (analysis.replica_stats), the printed report's numbers; runs of one engine are
left out, and without a cluster run the section is absent. Load a sweep over ``cluster.router`` to set
the routers beside each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.figure_style import DashboardFigure, style
from analysis.dashboard.run_inputs import DashboardRun

# (panel title, axis title, read one replica's statistics, hover format)
REPLICA_PANELS = (
    ("requests routed", "requests", lambda stats: stats.get("num_requests"), "%{y:,}"),
    ("busy (share of the run stepping)", "%", lambda stats: _percent(stats.get("busy_fraction")), "%{y:.1f}%"),
    ("prefix-cache hit rate", "%", lambda stats: _percent(stats.get("prefix_cache_hit_rate")), "%{y:.1f}%"),
    ("TTFT p90", "ms", lambda stats: (stats.get("ttft_ms") or {}).get("p90"), "%{y:.1f} ms"),
)


def _percent(value: float | None) -> float | None:
    return None if value is None else value * 100.0


def replica_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    clustered = [run for run in runs if run.summary.get("by_replica")]
    if not clustered:
        return None
    figure = make_subplots(rows=1, cols=len(REPLICA_PANELS), horizontal_spacing=0.06,
                           subplot_titles=[panel[0] for panel in REPLICA_PANELS])
    for column, (title, axis_title, read, value_format) in enumerate(REPLICA_PANELS, start=1):
        for run in clustered:
            replicas = run.summary["by_replica"]
            imbalance = run.summary.get("replica_load_imbalance")
            figure.add_trace(go.Bar(
                x=list(replicas), y=[read(stats) for stats in replicas.values()],
                name=run.label, legendgroup=run.label, showlegend=column == 1, marker={"color": run.color},
                hovertemplate=f"{run.label}<br>replica %{{x}}: {title} {value_format}"
                              + (f"<br>load imbalance {imbalance:.2f}" if imbalance is not None else "")
                              + "<extra></extra>",
            ), row=1, col=column)
        figure.update_xaxes(title_text="replica", type="category", row=1, col=column)
        figure.update_yaxes(title_text=axis_title, rangemode="tozero", row=1, col=column)
    figure.update_layout(barmode="group")
    style(figure, "Replicas of the cluster", height=420)
    return DashboardFigure(
        "replicas",
        "Replicas of the cluster",
        figure,
        "One group of bars per replica, one bar per run. Load imbalance (hover) is the busiest replica's "
        "stepping time over the mean replica's: 1.00 is an even split.",
    )
