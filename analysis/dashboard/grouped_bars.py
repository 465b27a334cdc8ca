"""Bars of a summary's per-group statistics (``by_replica``, ``by_class``): one panel per statistic, one
group of bars per replica or class, one bar per run in the run's colour, as the page's other figures
colour runs. The replica and request-class sections draw their bars with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.run_inputs import DashboardRun

# (panel title, axis title, read one group's statistics, hover format of the value)
Panel = tuple[str, str, Callable[[dict], Any], str]


def percent(value: float | None) -> float | None:
    """A fraction as a percentage for a bar (None stays a gap)."""
    return None if value is None else value * 100.0


def grouped_bar_panels(runs: Sequence[DashboardRun], by_key: str, panels: Sequence[Panel], group_name: str,
                       hover_note: Callable[[DashboardRun, dict], str] = lambda run, stats: "") -> go.Figure:
    """``runs``' ``summary[by_key]`` (group name -> statistics) as grouped bars; ``hover_note(run, stats)``
    adds a line of its own to a bar's hover (an empty string adds nothing)."""
    figure = make_subplots(rows=1, cols=len(panels), horizontal_spacing=0.06,
                           subplot_titles=[panel[0] for panel in panels])
    for column, (title, axis_title, read, value_format) in enumerate(panels, start=1):
        for run in runs:
            groups = run.summary[by_key]
            figure.add_trace(go.Bar(
                x=list(groups), y=[read(stats) for stats in groups.values()],
                customdata=[[hover_note(run, stats)] for stats in groups.values()],
                name=run.label, legendgroup=run.label, showlegend=column == 1, marker={"color": run.color},
                hovertemplate=f"{run.label}<br>{group_name} %{{x}}: {title} {value_format}%{{customdata[0]}}"
                              "<extra></extra>",
            ), row=1, col=column)
        figure.update_xaxes(title_text=group_name, type="category", row=1, col=column)
        figure.update_yaxes(title_text=axis_title, rangemode="tozero", row=1, col=column)
    figure.update_layout(barmode="group")
    return figure
