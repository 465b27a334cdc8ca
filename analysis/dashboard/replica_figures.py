"""A cluster's replicas side by side: the share of the traffic the router gave each, and what came of it.

A router is judged by its replicas: an even share of requests can still leave one replica busier (longer
prompts, fewer cache hits), and a cache-aware router trades some balance for hits. The bars read the
summary's ``by_replica`` (analysis.replica_stats), the printed report's numbers; runs of one engine are
left out, and without a cluster run the section is absent. Load a sweep over ``cluster.router`` to set
the routers beside each other.
"""

from __future__ import annotations

from collections.abc import Sequence


from analysis.dashboard.figure_style import DashboardFigure, style
from analysis.dashboard.grouped_bars import grouped_bar_panels, percent
from analysis.dashboard.run_inputs import DashboardRun

# (panel title, axis title, read one replica's statistics, hover format)
REPLICA_PANELS = (
    ("requests routed", "requests", lambda stats: stats.get("num_requests"), "%{y:,}"),
    ("busy (share of the run stepping)", "%", lambda stats: percent(stats.get("busy_fraction")), "%{y:.1f}%"),
    ("prefix-cache hit rate", "%", lambda stats: percent(stats.get("prefix_cache_hit_rate")), "%{y:.1f}%"),
    ("TTFT p90", "ms", lambda stats: (stats.get("ttft_ms") or {}).get("p90"), "%{y:.1f} ms"),
)


def replica_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    clustered = [run for run in runs if run.summary.get("by_replica")]
    if not clustered:
        return None
    figure = grouped_bar_panels(clustered, "by_replica", REPLICA_PANELS, "replica", lambda run, stats: (
        f"<br>load imbalance {run.summary['replica_load_imbalance']:.2f}"
        if run.summary.get("replica_load_imbalance") is not None else ""))
    style(figure, "Replicas of the cluster", height=420)
    return DashboardFigure(
        "replicas",
        "Replicas of the cluster",
        figure,
        "One group of bars per replica, one bar per run. Load imbalance (hover) is the busiest replica's "
        "stepping time over the mean replica's: 1.00 is an even split.",
    )
