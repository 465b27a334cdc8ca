"""A per-request timeline: where each request spent its time, for a sample of requests.

Each request is one row of three bars: waiting (arrival -> first scheduled), prefill (first
scheduled -> first token) and decode (first token -> finish). Drawing all 10,000 requests of a long
run would be unreadable and slow, so a deterministic sample is drawn: evenly spread over arrival
order, plus always the slowest requests, which are the ones a reader comes to look for.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.dashboard.downsample import extreme_indices, sample_indices
from analysis.dashboard.figure_style import QUEUE_COLOR, DashboardFigure, new_figure, note_no_data, translucent
from analysis.dashboard.rate_figures import TIME_AXIS_TITLE
from analysis.dashboard.run_inputs import DashboardRun

TIMELINE_SAMPLE = 200
SLOWEST_ALWAYS_SHOWN = 20

HOVER = (
    "%{customdata[0]}<br>%{customdata[1]}: %{customdata[2]:.3f} s -> %{customdata[3]:.3f} s"
    "<br>prompt %{customdata[4]:,} tokens (%{customdata[5]:,} cached), output %{customdata[6]:,}"
    "<br>preemptions %{customdata[7]}, finish: %{customdata[8]}<extra></extra>"
)


def sample_requests(requests: pd.DataFrame, limit: int = TIMELINE_SAMPLE,
                    slowest: int = SLOWEST_ALWAYS_SHOWN) -> pd.DataFrame:
    """Up to `limit` requests in arrival order: evenly strided, always including the `slowest` by E2E."""
    ordered = requests.sort_values("arrival_time", kind="stable").reset_index(drop=True)
    e2e = (ordered["finish_time"] - ordered["arrival_time"]).to_numpy(dtype=np.float64)
    keep = sample_indices(len(ordered), limit, always_keep=extreme_indices(e2e, slowest))
    return ordered.iloc[keep].reset_index(drop=True)


def request_phases(requests: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Phase name -> (start, end) seconds per request; NaN where a phase never happened.

    A request never scheduled (aborted while waiting) waits until it finished; one that never got
    its first token has no prefill end, so no prefill or decode bar.
    """
    arrival = requests["arrival_time"].to_numpy(dtype=np.float64)
    scheduled = requests["scheduled_time"].to_numpy(dtype=np.float64) if "scheduled_time" in requests else \
        np.full(len(requests), np.nan)
    first_token = requests["first_token_time"].to_numpy(dtype=np.float64)
    finish = requests["finish_time"].to_numpy(dtype=np.float64)
    # Without a recorded schedule time the wait is unknown: arrival -> first token is drawn as prefill.
    waiting_end = np.where(np.isfinite(scheduled), scheduled, np.where(np.isfinite(first_token), arrival, finish))
    return {
        "waiting": (arrival, waiting_end),
        "prefill": (np.where(np.isfinite(scheduled), scheduled, arrival), first_token),
        "decode": (first_token, finish),
    }


def timeline_figure(runs: Sequence[DashboardRun]) -> DashboardFigure:
    figure = new_figure("Per-request timeline", height=760)
    traces_per_run = []
    for run_position, run in enumerate(runs):
        traces = _run_traces(run, visible=run_position == 0)
        traces_per_run.append(len(traces))
        figure.add_traces(traces)
    if not any(traces_per_run):
        note_no_data(figure, "no requests recorded")
    titles = [_title(run) for run in runs]
    figure.update_layout(title_text=titles[0] if titles else "Per-request timeline", barmode="overlay",
                         bargap=0.15)
    if len(runs) > 1:
        figure.update_layout(updatemenus=[_run_menu(runs, traces_per_run, titles)])
    figure.update_xaxes(title_text=TIME_AXIS_TITLE)
    figure.update_yaxes(title_text="sampled requests, in arrival order", autorange="reversed",
                        showticklabels=False)
    return DashboardFigure(
        "request-timeline", "Per-request timeline", figure,
        f"Up to {TIMELINE_SAMPLE} requests per run, evenly spread over arrival order and always "
        f"including the {SLOWEST_ALWAYS_SHOWN} slowest (end to end). Grey: waiting in the queue; light: "
        "prefill until the first token; solid: decode until the request finished. Hover a bar for details."
        + (" Pick the run with the menu." if len(runs) > 1 else ""),
    )


def _title(run: DashboardRun) -> str:
    shown = min(len(run.requests), TIMELINE_SAMPLE)
    return f"Per-request timeline: {run.label} ({shown:,} of {len(run.requests):,} requests)"


def _run_traces(run: DashboardRun, visible: bool) -> list[go.Bar]:
    sample = sample_requests(run.requests)
    if not len(sample):
        return []
    phases = request_phases(sample)
    colors = {"waiting": QUEUE_COLOR, "prefill": translucent(run.color, 0.45), "decode": run.color}
    traces = []
    for phase, (start, end) in phases.items():
        customdata = np.column_stack([
            sample["request_id"].astype(str).to_numpy(),
            np.full(len(sample), phase),
            start,
            end,
            sample["num_prompt_tokens"].to_numpy(),
            sample["num_cached_tokens"].to_numpy(),
            sample["num_output_tokens"].to_numpy(),
            sample["num_preemptions"].to_numpy(),
            sample["finish_reason"].fillna("unfinished").astype(str).to_numpy(),
        ]).astype(object)
        traces.append(go.Bar(
            y=np.arange(len(sample)), x=end - start, base=start, orientation="h",
            name=phase, legendgroup=phase, marker={"color": colors[phase], "line": {"width": 0}},
            customdata=customdata, hovertemplate=HOVER, visible=visible, showlegend=True,
        ))
    return traces


def _run_menu(runs: Sequence[DashboardRun], traces_per_run: list[int], titles: list[str]) -> dict:
    buttons = []
    for position, run in enumerate(runs):
        visible = [index == position for index, count in enumerate(traces_per_run) for _ in range(count)]
        buttons.append({"label": run.label, "method": "update",
                        "args": [{"visible": visible}, {"title.text": titles[position]}]})
    return {"type": "dropdown", "buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.08,
            "yanchor": "bottom", "showactive": True, "active": 0}
