"""Sweeps: recognise runs that form one, and draw the latency-throughput curve with its SLO.

Runs form a sweep when they sit in one sweep directory (a parent holding sweep.csv, as `sim.run`
writes it) or when their configurations differ in exactly one field. That field may appear more than
once in the configuration tree (the workload's `engine.max_num_seqs` and the derived
`scheduler.max_num_seqs`), so "one field" means: every differing key has the same last name.

The curve plots p50 and p90 TTFT and E2E against achieved request throughput, one marker per run in
that run's colour. A point meets the SLO when the p90 of every latency the SLO names is within its
threshold (TTFT, TPOT, E2E); the highest throughput that does is marked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.dashboard.figure_style import REFERENCE_LINE_COLOR, SLO_COLOR, DashboardFigure, style
from analysis.dashboard.run_inputs import SWEEP_TABLE_FILE, DashboardRun
from analysis.report import summary_value

SLO_PERCENTILE = 90
CURVE_PANELS = (("ttft_ms", "TTFT"), ("e2e_ms", "E2E"))


@dataclass
class Sweep:
    """Runs in sweep order, and the configuration field that varies (None when only sweep.csv says so)."""

    runs: list[DashboardRun]
    variable: str | None


def flatten_config(config: Any, prefix: str = "") -> dict[str, str]:
    """{"a.b.c": value as JSON text} for every leaf of a nested configuration."""
    if isinstance(config, Mapping):
        flat: dict[str, str] = {}
        for key, value in config.items():
            flat.update(flatten_config(value, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): json.dumps(config, sort_keys=True, default=str)}


def differing_fields(runs: Sequence[DashboardRun]) -> dict[str, list[str]]:
    """Config keys whose values are not all equal across runs -> the value of each run (JSON text)."""
    flat = [flatten_config(run.summary.get("config") or {}) for run in runs]
    keys = sorted(set().union(*flat)) if flat else []
    differing = {}
    for key in keys:
        values = [config.get(key, "null") for config in flat]
        if len(set(values)) > 1:
            differing[key] = values
    return differing


def detect_sweep(runs: Sequence[DashboardRun]) -> Sweep | None:
    if len(runs) < 2:
        return None
    differing = differing_fields(runs)
    leaf_names = {key.rsplit(".", 1)[-1] for key in differing}
    variable = min(differing, key=len) if len(leaf_names) == 1 else None
    if variable is None and not _share_sweep_directory(runs):
        return None
    ordered = list(runs)
    if variable is not None:
        values = [json.loads(value) for value in differing[variable]]
        if all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
            ordered = [run for _, run in sorted(zip(values, runs), key=lambda pair: (pair[0], pair[1].index))]
    return Sweep(ordered, variable)


def _share_sweep_directory(runs: Sequence[DashboardRun]) -> bool:
    parents = {run.run.path.resolve().parent for run in runs if run.run.path is not None}
    return len(parents) == 1 and all(run.run.path is not None for run in runs) and \
        (next(iter(parents)) / SWEEP_TABLE_FILE).is_file()


def meets_slo(summary: Mapping[str, Any], level: int = SLO_PERCENTILE) -> bool | None:
    """True when the run's p`level` of every SLO latency is within its threshold; None with no SLO."""
    slo = {key: value for key, value in (summary.get("slo") or {}).items() if value is not None}
    if not slo:
        return None
    for key, threshold in slo.items():
        value = summary_value(summary, f"{key}.p{level}")
        if value is None and key == "tpot_ms" and summary.get("num_finished"):
            # No finished request had a second token, so none has a TPOT: none misses that SLO (as goodput
            # counts them, after vLLM). No value for TTFT or E2E means nothing finished: that misses.
            continue
        if value is None or value > threshold:
            return False
    return True


def latency_throughput_figure(sweep: Sweep) -> DashboardFigure:
    runs = sweep.runs
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                           subplot_titles=[f"{name} vs throughput" for _, name in CURVE_PANELS])
    throughput = [run.summary.get("request_throughput") for run in runs]
    for column, (metric, name) in enumerate(CURVE_PANELS, start=1):
        for level, dash in ((50, "solid"), (90, "dash")):
            latency = [summary_value(run.summary, f"{metric}.p{level}") for run in runs]
            figure.add_trace(go.Scatter(
                x=throughput, y=latency, mode="lines+markers+text" if level == 90 else "lines+markers",
                name=f"p{level}", legendgroup=f"p{level}", textposition="top center",
                textfont={"size": 11, "color": [run.color for run in runs]},
                showlegend=column == 1, line={"color": REFERENCE_LINE_COLOR, "dash": dash, "width": 1.5},
                marker={"color": [run.color for run in runs], "size": 11 if level == 90 else 9,
                        "symbol": "circle" if level == 50 else "diamond", "line": {"color": "white", "width": 1}},
                text=[run.label for run in runs],
                hovertemplate=f"%{{text}}<br>%{{x:.2f}} req/s<br>{name} p{level} %{{y:.1f}} ms<extra></extra>",
            ), row=1, col=column)
        threshold = (runs[0].summary.get("slo") or {}).get(metric)
        if threshold is not None:
            figure.add_hline(y=threshold, line={"color": SLO_COLOR, "dash": "dot", "width": 2}, row=1, col=column,
                             annotation_text=f"SLO {threshold:g} ms", annotation_position="top left",
                             annotation_font_color=SLO_COLOR)
        figure.update_yaxes(title_text=f"{name} (ms)", rangemode="tozero", row=1, col=column)
        figure.update_xaxes(title_text="achieved request throughput (req/s)", row=1, col=column)
    verdict = _mark_best_point(figure, runs)
    variable = f" over {sweep.variable}" if sweep.variable else ""
    style(figure, f"Latency vs throughput{variable}", height=520)
    figure.update_layout(margin={"b": 90})
    figure.add_annotation(text=verdict, xref="paper", yref="paper", x=0.0, y=-0.2, showarrow=False,
                          xanchor="left", font={"size": 13, "color": SLO_COLOR})
    return DashboardFigure(
        "latency-throughput", "Latency-throughput curve", figure,
        "One marker per run, in the run's colour and labelled with it; solid line p50, dashed p90. "
        f"A point meets the SLO when its p{SLO_PERCENTILE} of every SLO latency (TTFT, TPOT, E2E, as the run "
        "defines them) is within the threshold; the dashed vertical line marks the best such point.",
    )


def best_point(runs: Sequence[DashboardRun]) -> DashboardRun | None:
    """The run with the highest request throughput that meets its SLO, or None."""
    meeting = [run for run in runs if meets_slo(run.summary)]
    meeting = [run for run in meeting if run.summary.get("request_throughput") is not None]
    return max(meeting, key=lambda run: run.summary["request_throughput"]) if meeting else None


def _mark_best_point(figure: go.Figure, runs: Sequence[DashboardRun]) -> str:
    if all(meets_slo(run.summary) is None for run in runs):
        return "The runs have no SLO, so no point is marked."
    best = best_point(runs)
    if best is None:
        return f"No run meets the SLO at p{SLO_PERCENTILE}."
    rate = best.summary["request_throughput"]
    for column in (1, 2):
        figure.add_vline(x=rate, line={"color": SLO_COLOR, "dash": "dash", "width": 1.5}, row=1, col=column)
    return (f"Highest throughput meeting the SLO at p{SLO_PERCENTILE}: {rate:.2f} req/s "
            f"({best.label}).")
