"""Where the time to first token goes in a disaggregated run, beside the runs whose replicas do both.

A disaggregated run's summary splits each request's TTFT into prefill, the wait for the KV load, the
load and the first decode step (analysis.disaggregation_stats); one stacked bar per run shows their
means. A run whose replicas both prefill and decode gets one bar of its whole mean TTFT, so a sweep over
``cluster.prefill_replicas`` reads as one figure. Without a disaggregated run the figure is absent.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from analysis.dashboard.figure_style import QUEUE_COLOR, DashboardFigure, style
from analysis.dashboard.run_inputs import DashboardRun
from analysis.disaggregation_stats import TTFT_PARTS

PART_NAMES = {"prefill_ms": "prefill (queue and prompt)", "kv_wait_ms": "wait for the KV load",
              "kv_load_ms": "KV load", "first_token_ms": "first decode step"}
PART_COLORS = {"prefill_ms": "#2563eb", "kv_wait_ms": "#f59e0b", "kv_load_ms": "#dc2626",
               "first_token_ms": "#16a34a"}
COLOCATED_NAME = "TTFT, prefill and decode on one replica"


def ttft_parts_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    if not any(run.summary.get("disaggregation") for run in runs):
        return None
    labels = [run.label for run in runs]
    figure = go.Figure()
    for key, _, _ in TTFT_PARTS:
        means = [((run.summary.get("disaggregation") or {}).get(key) or {}).get("mean") for run in runs]
        figure.add_trace(go.Bar(
            y=labels, x=means, orientation="h", name=PART_NAMES[key], marker={"color": PART_COLORS[key]},
            hovertemplate=f"%{{y}}<br>{PART_NAMES[key]}: mean %{{x:,.1f}} ms<extra></extra>"))
    colocated = [None if run.summary.get("disaggregation") else (run.summary.get("ttft_ms") or {}).get("mean")
                 for run in runs]
    if any(value is not None for value in colocated):
        figure.add_trace(go.Bar(y=labels, x=colocated, orientation="h", name=COLOCATED_NAME,
                                marker={"color": QUEUE_COLOR},
                                hovertemplate="%{y}<br>TTFT: mean %{x:,.1f} ms<extra></extra>"))
    figure.update_layout(barmode="stack", legend={"orientation": "h", "y": -0.25})
    figure.update_xaxes(title_text="mean time to first token (ms)", rangemode="tozero")
    figure.update_yaxes(type="category", autorange="reversed")
    style(figure, "Time to first token, part by part", height=max(260, 90 + 60 * len(runs)))
    return DashboardFigure(
        "ttft-parts",
        "Time to first token, part by part",
        figure,
        "Disaggregated runs: the mean of each part of TTFT (the parts add up to the mean TTFT). Runs whose "
        "replicas both prefill and decode: their mean TTFT, in grey.",
    )
