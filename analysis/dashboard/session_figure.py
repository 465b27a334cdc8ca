"""Multi-turn sessions turn by turn: how much of each turn's history the prefix cache held, and its TTFT.

A later turn resends the whole conversation; whether the blocks of the earlier turns are still cached when it
arrives is what its time to first token depends on. One line per run over the turns (analysis.session_stats'
``by_turn``, the last point pooling the turns from its label on): the share of the prompt served from the cache
on the left, TTFT p50 (solid) and p90 (dotted) on the right, on a log axis. Without a sessions run the figure is absent.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.figure_style import DashboardFigure, style
from analysis.dashboard.run_inputs import DashboardRun


def session_turns_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    with_sessions = [run for run in runs if (run.summary.get("sessions") or {}).get("by_turn")]
    if not with_sessions:
        return None
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                           subplot_titles=("prompt served from the prefix cache", "time to first token"))
    for run in with_sessions:
        rows = run.summary["sessions"]["by_turn"]
        turns = [str(row["turn"]) for row in rows]
        cached = [100.0 * row["cached_fraction"] for row in rows]
        requests = [row["num_requests"] for row in rows]
        figure.add_trace(go.Scatter(
            x=turns, y=cached, mode="lines+markers", name=run.label, legendgroup=run.label,
            line={"color": run.color}, customdata=requests,
            hovertemplate=f"{run.label}<br>turn %{{x}} (%{{customdata:,}} requests)<br>%{{y:.1f}}% cached<extra></extra>"),
            row=1, col=1)
        for stat, dash in (("p50", "solid"), ("p90", "dot")):
            figure.add_trace(go.Scatter(
                x=turns, y=[row[f"ttft_ms_{stat}"] for row in rows], mode="lines+markers", name=f"{run.label} {stat}",
                legendgroup=run.label, showlegend=False, line={"color": run.color, "dash": dash},
                hovertemplate=f"{run.label}<br>turn %{{x}}<br>TTFT {stat} %{{y:,.1f}} ms<extra></extra>"),
                row=1, col=2)
    figure.update_xaxes(title_text="turn", type="category")
    figure.update_yaxes(title_text="cached share of the prompt (%)", range=[0, 100], row=1, col=1)
    # Log: a pool that holds the history and one that does not differ by orders of magnitude in the tail.
    figure.update_yaxes(title_text="TTFT (ms, log): p50 solid, p90 dotted", type="log", row=1, col=2)
    style(figure, "Sessions turn by turn")
    return DashboardFigure(
        "session-turns",
        "Sessions turn by turn",
        figure,
        "Each later turn resends its conversation: the share of its prompt the prefix cache still held when it "
        "arrived (left) and its time to first token (right, p50 solid, p90 dotted), turn by turn.",
    )
