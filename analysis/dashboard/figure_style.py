"""The look shared by every dashboard figure, and the record a figure builder hands to the page.

Every figure gets the same lean template, font and margins, so that the page reads as one report;
the template is built once without plotly's per-trace-type defaults, which would otherwise be
repeated in every figure's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
import plotly.io as plotly_io

FONT_FAMILY = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
FIGURE_HEIGHT = 420
GRID_COLOR = "#e5e7eb"

# Phases of a request in the timeline; decode is drawn in the run's own colour.
QUEUE_COLOR = "#c7c7c7"
REFERENCE_LINE_COLOR = "#444444"
SLO_COLOR = "#b91c1c"


@dataclass
class DashboardFigure:
    """A figure and where it goes: `figure_id` is the div id in the page (stable, for tests and
    links), `title` its heading; `note` a sentence under the heading saying how to read it."""

    figure_id: str
    title: str
    figure: go.Figure
    note: str = ""


def _lean_template() -> go.layout.Template:
    layout = plotly_io.templates["plotly_white"].layout.to_plotly_json()
    layout.update(
        font={"family": FONT_FAMILY, "size": 13, "color": "#1f2937"},
        margin={"l": 70, "r": 30, "t": 90, "b": 60},
        # A vertical legend right of the plots never collides with titles, however many runs.
        legend={"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.01,
                "font": {"size": 12}},
        hoverlabel={"namelength": -1},
    )
    for axis in ("xaxis", "yaxis"):
        layout[axis] = {**layout.get(axis, {}), "gridcolor": GRID_COLOR, "zerolinecolor": GRID_COLOR,
                        "showline": True, "linecolor": "#9ca3af", "ticks": "outside"}
    return go.layout.Template(layout=layout)


LEAN_TEMPLATE = _lean_template()


def new_figure(title: str, height: int = FIGURE_HEIGHT) -> go.Figure:
    """An empty figure in the dashboard's style."""
    figure = go.Figure()
    style(figure, title, height)
    return figure


def style(figure: go.Figure, title: str, height: int = FIGURE_HEIGHT) -> go.Figure:
    """Apply the dashboard's template, title and height to a figure made elsewhere (make_subplots)."""
    figure.update_layout(
        template=LEAN_TEMPLATE,
        title={"text": title, "x": 0.0, "xanchor": "left", "xref": "paper", "y": 0.985, "yanchor": "top",
               "yref": "container", "font": {"size": 16}},
        height=height,
    )
    return figure


def note_no_data(figure: go.Figure, message: str) -> go.Figure:
    """Say so in the plot area when a run has nothing to draw, rather than show empty axes."""
    figure.add_annotation(text=message, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                          font={"size": 14, "color": "#6b7280"})
    return figure


def translucent(hex_color: str, alpha: float) -> str:
    """"#rrggbb" -> "rgba(r, g, b, alpha)": a lighter shade of a run's colour (e.g. its prefill bars)."""
    red, green, blue = (int(hex_color[offset:offset + 2], 16) for offset in (1, 3, 5))
    return f"rgba({red}, {green}, {blue}, {alpha})"


def log_linear_buttons(axis_names: list[str], start_log: bool = False) -> list[dict]:
    """A two-button menu switching the given axes between linear and log scale.

    Latency tails span orders of magnitude: log shows the tail, linear the body.
    """
    def relayout(kind: str) -> dict:
        return {f"{name}.type": kind for name in axis_names}

    return [
        {
            "type": "buttons",
            "direction": "left",
            "x": 1.0,
            "xanchor": "right",
            "y": 1.06,
            "yanchor": "bottom",
            "showactive": True,
            "active": 1 if start_log else 0,
            "buttons": [
                {"label": "linear x", "method": "relayout", "args": [relayout("linear")]},
                {"label": "log x", "method": "relayout", "args": [relayout("log")]},
            ],
            "pad": {"r": 0, "t": 0},
            "font": {"size": 11},
        }
    ]
