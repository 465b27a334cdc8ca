"""What images did to a run: the vision encoder's work over time, and how long requests with images waited for
their first token against text-only ones.

Top: encoder tokens computed per second of the run (steps' ``num_encoder_tokens``, summed in time bins), one
colour per run: an image repeated while its output is still cached, or whose KV is a prefix-cache hit, costs
nothing here. Bottom: the CDF of TTFT of completed requests that showed images (solid) and of text-only ones
(dotted): an image's encoder runs in the step its prefill reaches it, within the step's encoder budget, so
requests with images wait longer. Absent without a run with images (analysis/multimodal_stats.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.figure_style import DashboardFigure, style
from analysis.dashboard.run_inputs import DashboardRun
from analysis.multimodal_stats import MULTIMODAL_REQUEST_COLUMNS, MULTIMODAL_STEP_COLUMNS

# Time bins of the encoder-work panel.
NUM_BINS = 60


def multimodal_figure(runs: Sequence[DashboardRun]) -> DashboardFigure | None:
    with_images = [run for run in runs if run.summary.get("multimodal")
                   and all(column in run.steps.columns for column in MULTIMODAL_STEP_COLUMNS)
                   and all(column in run.requests.columns for column in MULTIMODAL_REQUEST_COLUMNS)]
    if not with_images:
        return None
    figure = make_subplots(rows=2, cols=1, vertical_spacing=0.2,
                           subplot_titles=("vision encoder tokens computed per second",
                                           "TTFT: requests with images (solid) and text only (dotted)"))
    for run in with_images:
        steps = run.steps
        starts = steps["start_time"].to_numpy(dtype=np.float64)
        tokens = steps["num_encoder_tokens"].to_numpy(dtype=np.float64)
        end = float(starts.max()) if starts.size else 0.0
        edges = np.linspace(0.0, max(end, 1e-9), NUM_BINS + 1)
        per_bin, _ = np.histogram(starts, bins=edges, weights=tokens)
        width = edges[1] - edges[0]
        figure.add_trace(go.Scatter(
            x=(edges[:-1] + edges[1:]) / 2, y=per_bin / width, mode="lines", line={"color": run.color, "shape": "hv"},
            name=run.label, legendgroup=run.label,
            hovertemplate=f"{run.label}<br>t %{{x:,.1f}} s<br>%{{y:,.0f}} encoder tokens/s<extra></extra>"),
            row=1, col=1)
        latencies = run.latencies
        shown = set(run.requests.loc[run.requests["num_images"].to_numpy() > 0, "request_id"])
        images_mask = latencies["request_id"].isin(shown).to_numpy()
        for mask, dash, kind in ((images_mask, "solid", "with images"), (~images_mask, "dot", "text only")):
            ttft = np.sort(latencies["ttft_ms"].to_numpy(dtype=np.float64)[mask])
            ttft = ttft[np.isfinite(ttft)]
            if not ttft.size:
                continue
            figure.add_trace(go.Scatter(
                x=ttft, y=np.arange(1, ttft.size + 1) / ttft.size, mode="lines",
                line={"color": run.color, "dash": dash}, name=f"{run.label} {kind}", legendgroup=run.label,
                showlegend=False,
                hovertemplate=f"{run.label} {kind}<br>TTFT %{{x:,.0f}} ms<br>%{{y:.0%}} of requests<extra></extra>"),
                row=2, col=1)
    figure.update_xaxes(title_text="time (s)", row=1, col=1)
    figure.update_yaxes(title_text="encoder tokens / s", rangemode="tozero", row=1, col=1)
    figure.update_xaxes(title_text="TTFT (ms)", type="log", row=2, col=1)
    figure.update_yaxes(title_text="share of requests", range=[0, 1], row=2, col=1)
    style(figure, "Images", height=640)
    return DashboardFigure(
        "multimodal",
        "Images",
        figure,
        "The vision encoder's work over the run (images served from the encoder cache or the prefix cache cost "
        "nothing here), and the TTFT of requests that showed images against text-only ones.",
    )
