"""The page of a capacity search (``sim.capacity``): where the SLO stops holding as the rate grows.

Left, each probe's SLO attainment against its arrival rate, passes and failures marked, with the target
and the capacity drawn in: the boundary the search bisected. Right, the latencies the SLO bounds (p90
TTFT, TPOT and E2E) against the rate, each with its threshold: which one gave way first. Rates are on a
log axis, since the search doubles and halves before it bisects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.figure_style import DashboardFigure, style
from analysis.dashboard.page import Section, render_page

PASS_COLOR, FAIL_COLOR = "#1b9e77", "#d95f02"
# (probe field, SLO key, label)
LATENCY_LINES = (("ttft_p90_ms", "ttft_ms", "TTFT p90"), ("tpot_p90_ms", "tpot_ms", "TPOT p90"),
                 ("e2e_p90_ms", "e2e_ms", "E2E p90"))
LINE_COLORS = ("#386cb0", "#7570b3", "#e7298a")


def capacity_figure(result: Mapping[str, Any]) -> DashboardFigure:
    """``result``: a ``sim.capacity.CapacityResult`` as a dict (what capacity.json holds)."""
    probes = sorted(result["probes"], key=lambda probe: probe["rate"])
    rates = [probe["rate"] for probe in probes]
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                           subplot_titles=["SLO attainment per probe", "latency at p90 per probe"])
    figure.add_trace(go.Scatter(
        x=rates, y=[probe["slo_attainment"] for probe in probes], mode="lines+markers", name="SLO attainment",
        line={"color": "#999999", "width": 1},
        marker={"size": 10, "color": [PASS_COLOR if probe["passed"] else FAIL_COLOR for probe in probes]},
        customdata=[["pass" if probe["passed"] else "fail"] for probe in probes],
        hovertemplate="%{x:.4g} req/s: %{y:.1%} met the SLO (%{customdata[0]})<extra></extra>"), row=1, col=1)
    # Reference lines are traces, not shapes: a shape on a log axis takes log10 coordinates.
    span = [rates[0], rates[-1]]
    target = result["attainment_target"]
    figure.add_trace(_reference_line(span, [target, target], "black", f"target {target * 100:g}%"), row=1, col=1)
    if result.get("max_rate") is not None:
        capacity = result["max_rate"]
        figure.add_trace(_reference_line([capacity, capacity], [0, 1], PASS_COLOR,
                                         f"capacity {capacity:.4g} req/s", dash="dash"), row=1, col=1)
    for (field, slo_key, label), color in zip(LATENCY_LINES, LINE_COLORS):
        values = [probe[field] for probe in probes]
        if all(value is None for value in values):
            continue
        figure.add_trace(go.Scatter(x=rates, y=values, mode="lines+markers", name=label, line={"color": color},
                                    hovertemplate=f"%{{x:.4g}} req/s: {label} %{{y:.1f}} ms<extra></extra>"),
                         row=1, col=2)
        threshold = (result.get("slo") or {}).get(slo_key)
        if threshold is not None:
            figure.add_trace(_reference_line(span, [threshold, threshold], color,
                                             f"{label.split()[0]} SLO {threshold:g} ms"), row=1, col=2)
    figure.update_xaxes(type="log", title_text="arrival rate (req/s)")
    figure.update_yaxes(title_text="share of finished requests", tickformat=".0%", row=1, col=1)
    figure.update_yaxes(title_text="latency (ms)", type="log", row=1, col=2)
    style(figure, f"Capacity search: {result['workload']}", height=460)
    return DashboardFigure("capacity-search", "Capacity search", figure,
                           "Each point is one simulation of the same requests at one rate; green passed, "
                           "orange failed. The capacity is the highest rate that passed.")


def _reference_line(x: list[float], y: list[float], color: str, label: str, dash: str = "dot") -> go.Scatter:
    """A labelled straight line (a threshold, the capacity), named at its end."""
    return go.Scatter(x=x, y=y, mode="lines+text", text=["", label], textposition="top left",
                      textfont={"size": 10, "color": color}, line={"color": color, "dash": dash, "width": 1},
                      name=label, showlegend=False, hoverinfo="skip")


def capacity_page(result: Mapping[str, Any], verdict: str) -> str:
    """A self-contained HTML page of the search, ``verdict`` (sim.capacity's answer line) under its title."""
    return render_page(f"Capacity: {result['workload']}", verdict,
                       [Section("capacity", "Capacity search", [capacity_figure(result)])])
