"""An autoscaled cluster over time: the replicas it powered and served with, and the load it scaled on.

Top: replicas powered (billed: starting, ready or draining; solid) and ready (routable; dotted) as a step
function of time, one colour per run. The gap between the two while load rises is the cold start
(``startup_s``); after it falls, the scale-down window (``scale_down_delay_s``) and the draining replicas.
Bottom: the metric the autoscaler read at each decision, summed over the ready replicas, beside the target
times the ready count (dashed): the autoscaler adds replicas when the first runs above the second by more
than the tolerance. Reads the summary's ``autoscaling`` timeline (sim/autoscaler.py); absent without an
autoscaled run.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.figure_style import DashboardFigure, style
from analysis.dashboard.run_inputs import DashboardRun


def autoscaling_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    scaled = [run for run in runs if (run.summary.get("autoscaling") or {}).get("timeline")]
    if not scaled:
        return None
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                           subplot_titles=("replicas", "the autoscaler's metric at each decision"))
    for run in scaled:
        scaling = run.summary["autoscaling"]
        timeline = scaling["timeline"]
        times = timeline["time_s"]
        for key, dash in (("powered", "solid"), ("ready", "dot")):
            figure.add_trace(go.Scatter(
                x=times, y=timeline[key], mode="lines", line={"color": run.color, "dash": dash, "shape": "hv"},
                name=f"{run.label} {key}", legendgroup=run.label, showlegend=key == "powered",
                hovertemplate=f"{run.label}<br>t %{{x:,.1f}} s<br>%{{y}} {key}<extra></extra>"), row=1, col=1)
        decisions = [index for index, desired in enumerate(timeline["desired"]) if desired is not None]
        decision_times = [times[index] for index in decisions]
        figure.add_trace(go.Scatter(
            x=decision_times, y=[timeline["metric"][index] for index in decisions], mode="lines+markers",
            marker={"size": 4}, line={"color": run.color}, name=f"{run.label} {scaling['metric']}",
            legendgroup=run.label, showlegend=False, customdata=[timeline["desired"][index] for index in decisions],
            hovertemplate=(f"{run.label}<br>t %{{x:,.1f}} s<br>{scaling['metric']} %{{y:,.2f}}"
                           "<br>desired %{customdata} replicas<extra></extra>")), row=2, col=1)
        figure.add_trace(go.Scatter(
            x=decision_times, y=[scaling["target"] * timeline["ready"][index] for index in decisions], mode="lines",
            line={"color": run.color, "dash": "dash", "shape": "hv"}, name=f"{run.label} target x ready",
            legendgroup=run.label, showlegend=False,
            hovertemplate=f"{run.label}<br>t %{{x:,.1f}} s<br>target x ready %{{y:,.2f}}<extra></extra>"),
            row=2, col=1)
    figure.update_xaxes(title_text="time (s)", row=2, col=1)
    figure.update_yaxes(title_text="replicas: powered solid, ready dotted", rangemode="tozero", row=1, col=1)
    figure.update_yaxes(title_text="metric summed over ready (target x ready dashed)", rangemode="tozero", row=2, col=1)
    style(figure, "Autoscaling", height=620)
    return DashboardFigure(
        "autoscaling-timeline",
        "Autoscaling",
        figure,
        "Replicas powered (billed; solid) and ready (routed to; dotted) over time, and the metric the autoscaler "
        "read at each decision against the target times the ready replicas (dashed). A gap between powered and "
        "ready is a cold start.",
    )
