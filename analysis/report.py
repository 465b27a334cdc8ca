"""Human-readable tables of run summaries, for the end of a CLI run and for sweeps.

Input is always a summary dictionary (analysis.metrics.compute_summary, or a loaded summary.json), so
the same tables print for a run just finished and for a directory read back months later. Missing
numbers print as "-".
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from analysis.replica_stats import billed_replicas
from analysis.spec_decode_stats import spec_decoding_rows

LATENCY_ROWS = (
    ("TTFT", "ttft_ms"),
    ("TPOT", "tpot_ms"),
    ("ITL", "itl_ms"),
    ("E2E", "e2e_ms"),
    ("Queue", "queue_ms"),
)

REPORT_WIDTH = 100


def summary_value(summary: Mapping[str, Any], path: str) -> Any:
    """Look up a dotted key such as "ttft_ms.p50"; None when any part is missing."""
    value: Any = summary
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def format_number(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def format_percent(value: Any) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _slo_text(summary: Mapping[str, Any]) -> str:
    slo = summary.get("slo") or {}
    if not slo:
        return "no SLO"
    return ", ".join(f"{key.removesuffix('_ms')}<={value:g}ms" for key, value in slo.items())


def _finished_text(summary: Mapping[str, Any]) -> str:
    return f"{format_number(summary.get('num_finished'))}/{format_number(summary.get('num_requests'))}"


def _latency_reader(path: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda summary: format_number(summary_value(summary, path))


# (label, how to read it from a summary): the rows of a comparison across runs (sweeps).
COMPARISON_ROWS: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("requests finished", _finished_text),
    ("duration (s)", lambda s: format_number(s.get("duration_s"))),
    ("throughput (req/s)", lambda s: format_number(s.get("request_throughput"))),
    ("output (tok/s)", lambda s: format_number(s.get("output_token_throughput"), 1)),
    ("goodput (req/s)", lambda s: format_number(s.get("goodput"))),
    ("SLO attainment", lambda s: format_percent(s.get("slo_attainment"))),
    *(
        (f"{label} p{percentile} (ms)", _latency_reader(f"{key}.p{percentile}"))
        for label, key in LATENCY_ROWS
        for percentile in (50, 90, 99)
    ),
    ("KV usage mean", lambda s: format_percent(s.get("kv_usage_mean"))),
    ("KV usage max", lambda s: format_percent(s.get("kv_usage_max"))),
    ("preemptions", lambda s: format_number(s.get("num_preemptions"))),
    ("prefix-cache hit rate", lambda s: format_percent(s.get("prefix_cache_hit_rate"))),
    # KV offloading: the share of prompt tokens loaded from host memory ("-" without it).
    ("loaded from host", lambda s: format_percent((s.get("kv_offload") or {}).get("loaded_token_fraction"))),
    # Multi-LoRA serving: adapter loads and the share of step time they took ("-" without it).
    ("LoRA adapter loads", lambda s: format_number((s.get("lora") or {}).get("adapter_loads"))),
    ("LoRA load share", lambda s: format_percent((s.get("lora") or {}).get("load_share_of_step_time"))),
    # Multi-turn sessions: the share of later turns' prompts the prefix cache still held ("-" without sessions).
    ("later turns cached", lambda s: format_percent(((s.get("sessions") or {}).get("later_turns") or {})
                                                    .get("cached_fraction"))),
    # Images: the share of the shown images' tokens the vision encoder did not compute ("-" without images).
    ("encoder tokens saved", lambda s: format_percent((s.get("multimodal") or {}).get("encoder_tokens_saved_fraction"))),
    # Speculative decoding: tokens per verification, accepted drafts plus one ("-" without it).
    ("acceptance length", lambda s: format_number((s.get("spec_decoding") or {}).get("mean_acceptance_length"), 2)),
    # A cluster's busiest replica over its mean one ("-" for one engine): what a sweep over routers compares.
    ("replica load imbalance", lambda s: format_number(s.get("replica_load_imbalance"), 2)),
)


def billing_rows(summaries: Sequence[Mapping[str, Any]]) -> list[tuple[str, Callable[[Mapping[str, Any]], str]]]:
    """Where any run was autoscaled: what each run bills (an autoscaled cluster's powered replicas, else every
    configured replica all along), to set beside its SLO attainment."""
    if not any(summary.get("autoscaling") for summary in summaries):
        return []
    return [("replica-hours", lambda s: format_number(billed_replicas(s)[0], 2)),
            ("mean replicas", lambda s: format_number(billed_replicas(s)[1], 2))]


def summary_renderable(summary: Mapping[str, Any]) -> RenderableType:
    """The rich tables of one summary: headline numbers beside a latency table."""
    title = f"{summary.get('name') or 'run'} ({summary.get('mode') or '?'})"
    headline = Table(title=title, show_header=False, box=None, padding=(0, 1))
    headline.add_column("metric", style="bold")
    headline.add_column("value", justify="right")
    not_completed = [
        f"{summary[key]} {word}"
        for key, word in (
            ("num_aborted", "aborted"),
            ("num_ignored", "ignored"),
            ("num_errored", "errored"),
            ("num_unfinished", "unfinished"),
        )
        if summary.get(key)
    ]
    finished = _finished_text(summary)
    if not_completed:
        finished += f" ({', '.join(not_completed)})"
    headline.add_row("requests finished", finished)
    headline.add_row("duration", f"{format_number(summary.get('duration_s'))} s")
    headline.add_row("throughput", f"{format_number(summary.get('request_throughput'))} req/s")
    headline.add_row("output throughput", f"{format_number(summary.get('output_token_throughput'), 1)} tok/s")
    headline.add_row("goodput", f"{format_number(summary.get('goodput'))} req/s ({_slo_text(summary)})")
    headline.add_row("SLO attainment", format_percent(summary.get("slo_attainment")))
    headline.add_row(
        "KV usage mean / max",
        f"{format_percent(summary.get('kv_usage_mean'))} / {format_percent(summary.get('kv_usage_max'))}",
    )
    headline.add_row("preemptions", format_number(summary.get("num_preemptions")))
    headline.add_row("prefix-cache hit rate", format_percent(summary.get("prefix_cache_hit_rate")))
    offload = summary.get("kv_offload")
    if offload:
        headline.add_row("loaded from host (KV offloading)",
                         f"{format_percent(offload.get('loaded_token_fraction'))} of prompt tokens, "
                         f"load p50 {format_number((offload.get('load_ms') or {}).get('p50'))} ms")
    lora = summary.get("lora")
    if lora:
        headline.add_row(f"LoRA ({format_number(lora.get('num_adapters_used'))} adapters used)",
                         f"{format_percent(lora.get('lora_token_fraction'))} of tokens on adapters, "
                         f"{format_number(lora.get('adapter_loads'))} loads ({format_number(lora.get('disk_loads'))} "
                         f"from disk), {format_percent(lora.get('load_share_of_step_time'))} of step time loading")
    for label, value in spec_decoding_rows(summary.get("spec_decoding"), format_percent, format_number):
        headline.add_row(label, value)
    client_wait = summary.get("client_wait_ms")
    if client_wait:
        headline.add_row("waited at the client (max_concurrency)",
                         f"{format_number(summary.get('num_client_waited'))} requests, p50 "
                         f"{format_number(client_wait.get('p50'))} ms, p90 {format_number(client_wait.get('p90'))} ms")
    sessions = summary.get("sessions")
    if sessions:
        later = sessions.get("later_turns") or {}
        headline.add_row(f"sessions ({format_number(sessions.get('num_sessions'))})",
                         f"{format_number(sessions.get('mean_turns'), 2)} turns each, later turns' prompts "
                         f"{format_percent(later.get('cached_fraction'))} cached, session p50 "
                         f"{format_number(sessions.get('session_duration_s_p50'))} s")
    pipeline = summary.get("pipeline")
    if pipeline:
        headline.add_row(f"pipeline ({pipeline['stages']} stages)",
                         f"{format_number(pipeline.get('batches_in_flight_mean'), 2)} batches in flight while busy "
                         f"({format_percent(pipeline.get('busy_fraction'))} of the time)")
    autoscaling = summary.get("autoscaling")
    if autoscaling:
        headline.add_row(f"autoscaling ({autoscaling['metric']}, target {format_number(autoscaling['target'])})",
                         f"{format_number(autoscaling.get('mean_replicas'), 2)} replicas on average, peak "
                         f"{autoscaling.get('peak_replicas')}; {format_number(autoscaling.get('replica_hours'), 2)} "
                         f"replica-hours, {format_percent(autoscaling.get('saved_fraction'))} fewer than all "
                         f"{format_number(autoscaling.get('static_replica_hours'), 2)} of the static cluster")
    data_parallel = summary.get("data_parallel")
    if data_parallel:
        headline.add_row(f"data-parallel ranks ({data_parallel['engines']} x {data_parallel['ranks_per_engine']})",
                         f"waiting for the slowest rank {format_percent(data_parallel.get('rank_wait_share'))} of "
                         f"their time; routed experts {format_percent(data_parallel.get('routed_experts_share'))} "
                         "of step time")
    if summary.get("by_replica"):
        headline.add_row("replicas (load imbalance)",
                         f"{len(summary['by_replica'])} ({format_number(summary.get('replica_load_imbalance'), 2)})")

    latency = Table(title="latency (ms)", padding=(0, 1))
    latency.add_column("metric", style="bold")
    for column in ("mean", "p50", "p90", "p99", "count"):
        latency.add_column(column, justify="right")
    for label, key in LATENCY_ROWS:
        stats = summary.get(key) or {}
        latency.add_row(
            label,
            *(format_number(stats.get(column)) for column in ("mean", "p50", "p90", "p99")),
            format_number(stats.get("count")),
        )
    parts: list[RenderableType] = [headline]
    for key, what in (("ignored_examples", "ignored"), ("errored_examples", "errored")):
        examples = summary.get(key)
        if examples:
            # The engine (or server) never serves these: the reason says what to change, the workload or the engine.
            parts.append(Text(f"{what} requests, the first: {examples[0]['request_id']}: {examples[0]['reason']}",
                              style="yellow"))
    parts += [Text(""), latency]
    request_classes = summary.get("by_class")
    if request_classes:
        parts += [Text(""), request_class_table(request_classes)]
    classes = summary.get("by_priority")
    if classes:
        parts += [Text(""), priority_class_table(classes)]
    replicas = summary.get("by_replica")
    if replicas:
        parts += [Text(""), replica_table(replicas)]
    disaggregation = summary.get("disaggregation")
    if disaggregation:
        parts += [Text(""), ttft_parts_table(disaggregation)]
    if sessions and sessions.get("by_turn"):
        parts += [Text(""), turn_table(sessions["by_turn"])]
    return Group(*parts)


def turn_table(by_turn: list[Mapping[str, Any]]) -> Table:
    """A sessions run turn by turn (analysis.session_stats): how much of each turn's history the cache held."""
    table = Table(title="sessions by turn", padding=(0, 1))
    for column in ("turn", "requests", "mean prompt", "cached", "TTFT p50 (ms)", "TTFT p90 (ms)"):
        table.add_column(column, justify="right", style="bold" if column == "turn" else None)
    for row in by_turn:
        table.add_row(str(row["turn"]), format_number(row.get("num_requests")),
                      format_number(row.get("mean_prompt_tokens"), 0), format_percent(row.get("cached_fraction")),
                      format_number(row.get("ttft_ms_p50")), format_number(row.get("ttft_ms_p90")))
    return table


def ttft_parts_table(disaggregation: Mapping[str, Any]) -> Table:
    """A disaggregated run's time to first token, part by part (analysis.disaggregation_stats)."""
    table = Table(title=f"time to first token, disaggregated: {format_number(disaggregation.get('num_kv_loads'))} "
                        f"KV loads of {format_number(disaggregation.get('kv_load_tokens'))} tokens (ms)", padding=(0, 1))
    table.add_column("part", style="bold")
    for column in ("mean", "p50", "p90", "p99"):
        table.add_column(column, justify="right")
    for label, key in (("prefill (queue and prompt)", "prefill_ms"), ("wait for the KV load", "kv_wait_ms"),
                       ("KV load", "kv_load_ms"), ("first decode step", "first_token_ms")):
        stats = disaggregation.get(key) or {}
        table.add_row(label, *(format_number(stats.get(column)) for column in ("mean", "p50", "p90", "p99")))
    return table


# A cluster of hundreds of replicas would print a screen of rows; the first ones and the busiest say enough.
MAX_REPLICA_ROWS = 16


def replica_table(replicas: Mapping[str, Any]) -> Table:
    """One row per replica of a cluster: the share the router gave it and what it made of it (fits 80
    columns). Past MAX_REPLICA_ROWS replicas, the busiest ones."""
    shown = list(replicas.items())
    title = "by replica (ms)"
    if len(shown) > MAX_REPLICA_ROWS:
        shown = sorted(shown, key=lambda item: -(item[1].get("busy_fraction") or 0.0))[:MAX_REPLICA_ROWS]
        shown.sort(key=lambda item: int(item[0]))
        title = f"by replica, the {MAX_REPLICA_ROWS} busiest of {len(replicas)} (ms)"
    if any(stats.get("role") for stats in replicas.values()):
        title = title.replace(" (ms)", " (ms; P: prefill, D: decode)")
    table = Table(title=title, padding=(0, 1), caption=_replica_adapters_caption(shown))
    for column in ("replica", "requests", "SLO met", "busy", "KV mean", "hits", "TTFT p90", "E2E p90"):
        table.add_column(column, justify="right", style="bold" if column == "replica" else None, no_wrap=True)
    for replica, stats in shown:
        role = stats.get("role")  # disaggregated: "0 P" prefills, "1 D" decodes (the title says so)
        table.add_row(
            f"{replica} {role[0].upper()}" if role else replica, format_number(stats.get("num_requests")), format_percent(stats.get("slo_attainment")),
            format_percent(stats.get("busy_fraction")), format_percent(stats.get("kv_usage_mean")),
            format_percent(stats.get("prefix_cache_hit_rate")),
            *(format_number(summary_value(stats, path), 1) for path in ("ttft_ms.p90", "e2e_ms.p90")))
    return table


def _replica_adapters_caption(shown: Sequence[tuple[str, Mapping[str, Any]]]) -> str | None:
    """Multi-LoRA: the adapters each replica served and its slots' loads (what a LoRA-aware router changes), as a
    caption, since another column would not fit 80."""
    if not any("lora_adapters" in stats for _, stats in shown):
        return None
    return "adapters (loads): " + ", ".join(
        f"{replica}: {format_number(stats.get('lora_adapters'))} ({format_number(stats.get('lora_adapter_loads'))})"
        for replica, stats in shown)


def request_class_table(classes: Mapping[str, Any]) -> Table:
    """One row per request class of the workload, each judged by its own SLO, which the caption names (fits
    100 columns)."""
    slos = "; ".join(f"{name} {_slo_text(stats)}" for name, stats in classes.items())
    table = Table(title="by request class (each under its own SLO; ms)", caption=f"SLOs: {slos}", padding=(0, 1))
    for column in ("class", "finished", "req/s", "SLO met", "TTFT p50", "TTFT p90", "TPOT p90", "E2E p90"):
        # A class name is an identifier of up to 64 characters: fold a long one rather than cut it.
        table.add_column(column, justify="left" if column == "class" else "right",
                         style="bold" if column == "class" else None, no_wrap=column != "class",
                         overflow="fold" if column == "class" else "ellipsis")
    for name, stats in classes.items():
        table.add_row(
            name, f"{stats.get('num_finished')}/{stats.get('num_requests')}",
            format_number(stats.get("request_throughput")), format_percent(stats.get("slo_attainment")),
            *(format_number(summary_value(stats, path), 1)
              for path in ("ttft_ms.p50", "ttft_ms.p90", "tpot_ms.p90", "e2e_ms.p90")))
    return table


def class_comparison_rows(summaries: Sequence[Mapping[str, Any]]
                          ) -> list[tuple[str, Callable[[Mapping[str, Any]], str]]]:
    """Rows of a comparison across runs for each request class any of them has (a sweep of a workload
    with ``workload.classes``): what each class got, which the run-level rows mix away."""
    names = list(dict.fromkeys(name for summary in summaries for name in summary.get("by_class") or {}))
    rows: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = []
    for name in names:
        def read(path: str, percent: bool = False, name: str = name) -> Callable[[Mapping[str, Any]], str]:
            def reader(summary: Mapping[str, Any]) -> str:
                value = summary_value((summary.get("by_class") or {}).get(name) or {}, path)
                return format_percent(value) if percent else format_number(value)
            return reader
        rows += [(f"{name}: SLO attainment", read("slo_attainment", percent=True)),
                 (f"{name}: TTFT p50 (ms)", read("ttft_ms.p50")),
                 (f"{name}: TTFT p90 (ms)", read("ttft_ms.p90")),
                 (f"{name}: TPOT p90 (ms)", read("tpot_ms.p90")),
                 (f"{name}: E2E p90 (ms)", read("e2e_ms.p90"))]
    return rows


def priority_class_table(classes: Mapping[str, Any]) -> Table:
    """One row per priority class (lower is served first): what the policy gave each (fits 80 columns)."""
    table = Table(title="by priority class (lower is served first; ms)", padding=(0, 1))
    for column in ("class", "finished", "SLO met", "TTFT p50", "TTFT p90", "TPOT p90", "E2E p90"):
        # A class is a priority value, any integer: fold a long one rather than cut it to "92233…".
        table.add_column(column, justify="right", style="bold" if column == "class" else None,
                         no_wrap=column != "class", overflow="fold" if column == "class" else "ellipsis")
    for priority, stats in classes.items():
        table.add_row(
            priority, f"{stats.get('num_finished')}/{stats.get('num_requests')}",
            format_percent(stats.get("slo_attainment")),
            *(format_number(summary_value(stats, path), 1)
              for path in ("ttft_ms.p50", "ttft_ms.p90", "tpot_ms.p90", "e2e_ms.p90")))
    return table


def comparison_renderable(
    summaries: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None
) -> Table:
    """One column per run, one row per metric (COMPARISON_ROWS)."""
    labels = _labels(summaries, labels)
    table = Table(title="runs compared", padding=(0, 1))
    table.add_column("metric", style="bold")
    for label in labels:
        # Sweep labels share their prefix ("tensor_parallel_size=2", "=4", ...): fold, never cut them.
        table.add_column(label, justify="right", overflow="fold")
    for row_label, read in (*COMPARISON_ROWS, *billing_rows(summaries), *class_comparison_rows(summaries)):
        table.add_row(row_label, *(read(summary) for summary in summaries))
    return table


def format_summary(summary: Mapping[str, Any], width: int = REPORT_WIDTH) -> str:
    """The summary as plain text (no colour codes), for logs and tests."""
    return render_text(summary_renderable(summary), width=width)


def print_summary(summary: Mapping[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(summary_renderable(summary))


def format_comparison(
    summaries: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None, width: int = REPORT_WIDTH
) -> str:
    """A table of the same metrics across runs (a sweep), as plain text."""
    return render_text(comparison_renderable(summaries, labels), width=width)


def print_comparison(
    summaries: Sequence[Mapping[str, Any]],
    labels: Sequence[str] | None = None,
    console: Console | None = None,
) -> None:
    (console or Console()).print(comparison_renderable(summaries, labels))


def render_text(renderable: RenderableType, width: int = REPORT_WIDTH) -> str:
    """Render with rich into a string, without colour or terminal codes."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False, highlight=False)
    console.print(renderable)
    return buffer.getvalue()


def _labels(summaries: Sequence[Mapping[str, Any]], labels: Sequence[str] | None) -> list[str]:
    if labels is None:
        return [str(summary.get("name") or f"run {index}") for index, summary in enumerate(summaries)]
    if len(labels) != len(summaries):
        raise ValueError(f"got {len(labels)} labels for {len(summaries)} summaries")
    return [str(label) for label in labels]
