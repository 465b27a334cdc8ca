"""The dashboard's tables, as HTML: runs, summary (with differences vs the first run), configuration,
and the sim-vs-real error table. Every value from a run is escaped: names and configs are user text.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.dashboard.run_inputs import DashboardRun
from analysis.dashboard.sweep_figures import differing_fields
from analysis.fidelity import DEFAULT_TOLERANCE, compare_runs
from analysis.report import summary_value

# (row label, dotted summary key, how to print it, which direction is better)
HEADLINE_ROWS: tuple[tuple[str, str, str, str | None], ...] = (
    ("requests finished", "num_finished", "count", None),
    ("requests in trace", "num_requests", "count", None),
    ("duration (s)", "duration_s", "number", None),
    ("throughput (req/s)", "request_throughput", "number", "higher"),
    ("output throughput (tok/s)", "output_token_throughput", "number", "higher"),
    ("goodput (req/s)", "goodput", "number", "higher"),
    ("SLO attainment", "slo_attainment", "percent", "higher"),
    ("KV usage mean", "kv_usage_mean", "percent", None),
    ("KV usage max", "kv_usage_max", "percent", None),
    ("preemptions", "num_preemptions", "count", "lower"),
    ("prefix-cache hit rate", "prefix_cache_hit_rate", "percent", "higher"),
    ("engine steps", "num_steps", "count", None),
)
# Shown when some run offloads KV to host memory (analysis/offload_stats.py).
OFFLOAD_ROWS: tuple[tuple[str, str, str, str | None], ...] = (
    ("prompt tokens loaded from host", "kv_offload.loaded_token_fraction", "percent", "higher"),
    ("host load p50 (ms)", "kv_offload.load_ms.p50", "number", None),
)
# Shown when some run speculates (analysis/spec_decode_stats.py).
SPEC_DECODING_ROWS: tuple[tuple[str, str, str, str | None], ...] = (
    ("draft tokens accepted", "spec_decoding.acceptance_rate", "percent", "higher"),
    ("tokens per verification", "spec_decoding.mean_acceptance_length", "number", "higher"),
)
# Shown when some run serves LoRA adapters (analysis/lora_stats.py).
LORA_ROWS: tuple[tuple[str, str, str, str | None], ...] = (
    ("tokens on LoRA adapters", "lora.lora_token_fraction", "percent", None),
    ("LoRA adapter loads", "lora.adapter_loads", "count", "lower"),
    ("LoRA loads from disk", "lora.disk_loads", "count", "lower"),
    ("step time loading adapters", "lora.load_share_of_step_time", "percent", "lower"),
    ("adapters per batch (mean)", "lora.mean_active_loras", "number", None),
)
LATENCY_ROWS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"), ("queue", "queue_ms"))
LATENCY_STATISTICS = ("mean", "p50", "p90", "p99")


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def format_value(value: Any, kind: str) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else escape(value)
    if kind == "percent":
        return f"{100.0 * value:.1f}%"
    if kind == "count":
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def run_list_html(runs: Sequence[DashboardRun]) -> str:
    """One line per run: its colour (the colour it has in every figure), label, mode and source."""
    items = []
    for run in runs:
        source = escape(run.run.path) if run.run.path is not None else "(in memory)"
        items.append(
            f'<li><span class="swatch" style="background:{run.color}"></span>'
            f"<b>{escape(run.label)}</b> <span class=mode>{escape(run.mode)}</span> "
            f"{format_value(run.summary.get('num_requests'), 'count')} requests, "
            f"{format_value(run.summary.get('duration_s'), 'number')} s &middot; <code>{source}</code></li>"
        )
    return f'<ul class="runs">{"".join(items)}</ul>'


def summary_table_html(runs: Sequence[DashboardRun]) -> str:
    """Headline metrics and latencies, side by side. With several runs: one column per run, and every
    run after the first shows its relative difference from the first."""
    if len(runs) == 1:
        latency = _single_run_latency_table(runs[0])
    else:
        rows = [(f"{name} {statistic} (ms)", f"{key}.{statistic}", "number", "lower")
                for name, key in LATENCY_ROWS for statistic in LATENCY_STATISTICS]
        latency = _by_run_table(runs, rows, "latency (ms)")
    offloading = any(run.summary.get("kv_offload") for run in runs)
    speculating = any(run.summary.get("spec_decoding") for run in runs)
    serving_lora = any(run.summary.get("lora") for run in runs)
    headline = _by_run_table(runs, HEADLINE_ROWS + (OFFLOAD_ROWS if offloading else ())
                             + (SPEC_DECODING_ROWS if speculating else ()) + (LORA_ROWS if serving_lora else ()),
                             "headline")
    base = runs[0].summary
    slo = ", ".join(f"{escape(key.removesuffix('_ms'))} &le; {value:g} ms"
                    for key, value in (base.get("slo") or {}).items() if value is not None) or "none"
    note = f"SLO of {escape(runs[0].label)}: {slo}."
    if len(runs) > 1:
        note += f" In brackets: difference from {escape(runs[0].label)} (green better, red worse)."
    return f'<p class="note">{note}</p><div class="tables">{headline}{latency}</div>'


def _by_run_table(runs: Sequence[DashboardRun], rows: Sequence[tuple[str, str, str, str | None]],
                  caption: str) -> str:
    header = "".join(f'<th><span class="swatch" style="background:{run.color}"></span>{escape(run.label)}</th>'
                     for run in runs)
    base = runs[0].summary
    body = []
    for label, key, kind, better in rows:
        cells = [f"<td>{format_value(summary_value(base, key), kind)}</td>"]
        for run in runs[1:]:
            value = summary_value(run.summary, key)
            cells.append(f"<td>{format_value(value, kind)}{_difference(summary_value(base, key), value, better)}</td>")
        body.append(f"<tr><th>{escape(label)}</th>{''.join(cells)}</tr>")
    return (f'<table class="metrics"><caption>{escape(caption)}</caption><thead><tr><th>metric</th>{header}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _single_run_latency_table(run: DashboardRun) -> str:
    header = "".join(f"<th>{statistic}</th>" for statistic in (*LATENCY_STATISTICS, "count"))
    body = []
    for name, key in LATENCY_ROWS:
        stats = run.summary.get(key) or {}
        cells = "".join(f"<td>{format_value(stats.get(statistic), 'number')}</td>" for statistic in LATENCY_STATISTICS)
        body.append(f"<tr><th>{name}</th>{cells}<td>{format_value(stats.get('count'), 'count')}</td></tr>")
    return (f'<table class="metrics"><caption>latency (ms)</caption><thead><tr><th>metric</th>{header}</tr>'
            f"</thead><tbody>{''.join(body)}</tbody></table>")


def _difference(base: Any, value: Any, better: str | None) -> str:
    numbers = all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in (base, value))
    if not numbers or base == value:
        return ""
    if base == 0:
        return ' <span class="delta">(new)</span>'
    change = (value - base) / abs(base)
    tone = ""
    if better is not None:
        improved = change > 0 if better == "higher" else change < 0
        tone = " better" if improved else " worse"
    return f' <span class="delta{tone}">({100.0 * change:+.1f}%)</span>'


def config_html(runs: Sequence[DashboardRun]) -> str:
    """The configuration: the fields that differ between runs first, then each run's full tree."""
    parts = []
    if len(runs) > 1:
        differing = differing_fields(runs)
        if differing:
            header = "".join(f"<th>{escape(run.label)}</th>" for run in runs)
            rows = "".join(
                f"<tr><th><code>{escape(key)}</code></th>"
                + "".join(f"<td><code>{escape(_readable(json.loads(value)))}</code></td>" for value in values)
                + "</tr>"
                for key, values in differing.items()
            )
            parts.append(f'<table class="metrics"><caption>Configuration fields that differ between runs'
                         f"</caption><thead><tr><th>field</th>{header}</tr></thead><tbody>{rows}</tbody></table>")
        else:
            parts.append("<p>All runs have the same configuration.</p>")
    for position, run in enumerate(runs):
        text = escape(config_text(run.summary.get("config") or {})) or "(no configuration recorded)"
        opened = " open" if position == 0 and len(runs) == 1 else ""
        parts.append(f"<details{opened}><summary>configuration of <b>{escape(run.label)}</b></summary>"
                     f'<pre class="config">{text}</pre></details>')
    return "".join(parts)


def config_text(config: Any, indent: int = 0) -> str:
    """A nested configuration as indented `key: value` lines (YAML-like, for reading, not parsing)."""
    lines = []
    pad = "  " * indent
    if isinstance(config, Mapping):
        for key, value in config.items():
            if isinstance(value, Mapping) and value:
                lines.append(f"{pad}{key}:")
                lines.append(config_text(value, indent + 1))
            else:
                lines.append(f"{pad}{key}: {_readable(value)}")
    else:
        lines.append(f"{pad}{_readable(config)}")
    return "\n".join(line for line in lines if line)


def _readable(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def fidelity_table_html(simulated: DashboardRun, real: DashboardRun,
                        tolerance: float = DEFAULT_TOLERANCE) -> str:
    """analysis.compare_runs as a table: sim, real, signed relative error, within tolerance or not."""
    comparison = compare_runs(simulated.summary, real.summary)
    rows = []
    for key, row in comparison["metrics"].items():
        error = row["relative_error"]
        if error is None:
            error_text, verdict = "-", ""
        else:
            error_text = f"{100.0 * error:+.1f}%"
            verdict = '<span class="delta better">ok</span>' if abs(error) <= tolerance else \
                '<span class="delta worse">off</span>'
        rows.append(f"<tr><th><code>{escape(key)}</code></th><td>{format_value(row['sim'], 'number')}</td>"
                    f"<td>{format_value(row['real'], 'number')}</td><td>{error_text}</td><td>{verdict}</td></tr>")
    mean_error = comparison.get("mean_abs_relative_error")
    caption = f"Metric by metric: {escape(simulated.label)} (sim) vs {escape(real.label)} (real)."
    if mean_error is not None:
        caption += (f" Mean |error| {100.0 * mean_error:.1f}%, worst {escape(comparison['worst_metric'])} "
                    f"{100.0 * comparison['max_abs_relative_error']:.1f}%; ok means within "
                    f"{100.0 * tolerance:.0f}%.")
    return (f'<table class="metrics fidelity"><caption>{caption}</caption><thead><tr><th>metric</th><th>sim</th>'
            f"<th>real</th><th>relative error</th><th></th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
