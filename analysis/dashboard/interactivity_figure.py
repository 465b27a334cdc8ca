"""A sweep's throughput per GPU against interactivity: the trade-off published serving benchmarks draw.

Each point is one run of the sweep: x the tokens per second one user sees while its answer streams (1000 /
TPOT p50 in ms), y the output tokens per second each GPU of the deployment produces (output throughput over
tensor parallel x pipeline stages x replicas). Raising the concurrency or the load moves points down the
interactivity axis and up the throughput one until the engine saturates; a configuration whose points lie
above and to the right of another's is better at every operating point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from analysis.dashboard.figure_style import REFERENCE_LINE_COLOR, DashboardFigure, style
from analysis.dashboard.sweep_figures import Sweep
from analysis.report import summary_value


def num_gpus(summary: Mapping[str, Any]) -> int:
    """GPUs the run's deployment uses: tensor parallel x pipeline stages per engine, times the replicas."""
    workload = (summary.get("config") or {}).get("workload") or {}
    engine, cluster = workload.get("engine") or {}, workload.get("cluster") or {}
    return (int(engine.get("tensor_parallel_size") or 1) * int(engine.get("pipeline_parallel_size") or 1)
            * int(cluster.get("num_replicas") or 1))


def interactivity_figure(sweep: Sweep) -> DashboardFigure | None:
    """None when no run has a TPOT (every answer a single token) to read interactivity from."""
    points = []
    for run in sweep.runs:
        tpot_ms = summary_value(run.summary, "tpot_ms.p50")
        output = run.summary.get("output_token_throughput")
        if tpot_ms and output is not None:
            points.append((1000.0 / tpot_ms, output / num_gpus(run.summary), run))
    if not points:
        return None
    figure = go.Figure(go.Scatter(
        x=[x for x, _, _ in points], y=[y for _, y, _ in points], mode="lines+markers+text",
        text=[run.label for _, _, run in points], textposition="top center",
        textfont={"size": 11, "color": [run.color for _, _, run in points]},
        line={"color": REFERENCE_LINE_COLOR, "width": 1.5},
        marker={"color": [run.color for _, _, run in points], "size": 11, "line": {"color": "white", "width": 1}},
        hovertemplate="%{text}<br>%{x:.1f} tok/s per user<br>%{y:,.0f} output tok/s per GPU<extra></extra>"))
    figure.update_xaxes(title_text="interactivity: tokens per second per user (1000 / TPOT p50 ms)", rangemode="tozero")
    figure.update_yaxes(title_text="output tokens per second per GPU", rangemode="tozero")
    variable = f" over {sweep.variable}" if sweep.variable else ""
    style(figure, f"Throughput per GPU vs interactivity{variable}")
    return DashboardFigure(
        "throughput-interactivity", "Throughput per GPU vs interactivity", figure,
        "One marker per run: how fast each user's answer streams (x) against what each GPU produces (y). Up and "
        "to the right is better; a concurrency or load sweep traces the trade-off between the two.")
