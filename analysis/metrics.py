"""Headline metrics of a run, computed from its request and step traces.

Latency definitions follow vLLM's `benchmark_serving.py`, so numbers from this testbed can be set
beside numbers from a real vLLM benchmark:

- TTFT  (time to first token) = first_token_time - arrival_time, per request.
- TPOT  (time per output token) = (finish_time - first_token_time) / (num_output_tokens - 1), per
  request with at least 2 output tokens; it excludes the first token, which TTFT already covers.
  (Vidur's normalized decode time divides by num_output_tokens instead, which reads (n-1)/n lower for
  the same request: set such figures side by side with that in mind.)
- ITL   (inter-token latency) = every gap between consecutive distinct times of a request's
  token_times, pooled over all requests (so a long request weighs more than a short one, unlike TPOT).
  Tokens that arrived together (one streamed chunk carrying several, when a server merges the deltas of
  a lagging client) share a time and count one gap, as vLLM's benchmark records one ITL per chunk.
- E2E   (end-to-end latency) = finish_time - arrival_time, per request.
- queue = scheduled_time - arrival_time (time waiting before the first schedule), per request.

Only requests that completed (finish reason "stop" or "length") enter latency and throughput
metrics: an aborted request's latency measures the client, not the server. Aborted, ignored, errored
and unfinished requests are counted apart. Percentiles use numpy's default linear interpolation, as
vLLM does. Every statistic of an empty set is null (None), never an exception.

Everything is vectorized: 10,000 requests with ~200 token timestamps each summarize in a fraction of a
second, because the token timestamps are flattened once and differenced with numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analysis.json_safe import json_safe
from analysis.step_aggregates import kv_usage_max, num_preemptions, prefix_cache_hit_rate, time_weighted_kv_usage
from analysis.trace_schema import (
    COMPLETED_FINISH_REASONS,
    check_requests_frame,
    check_steps_frame,
    empty_steps_frame,
    request_classes,
)

RUN_MODES = ("sim", "real", "replay")
LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
# The SLOs goodput can be judged against (as in vLLM's --goodput option), in milliseconds.
SLO_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
PERCENTILES = (50, 90, 99)
# A run under a client concurrency limit (workload.max_concurrency) records each request's wait to be sent.
CLIENT_WAIT_COLUMN = "client_wait_s"


def latency_stats(values_seconds: np.ndarray | pd.Series | list[float]) -> dict[str, Any]:
    """{count, mean, p50, p90, p99} in milliseconds of the finite values; null stats when none."""
    values = np.asarray(values_seconds, dtype=np.float64)
    values = values[np.isfinite(values)] * 1000.0
    if values.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, PERCENTILES)
    return {
        "count": int(values.size),
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
    }


def completed_mask(requests: pd.DataFrame) -> np.ndarray:
    """True for requests that finished with "stop" or "length"."""
    return requests["finish_reason"].isin(COMPLETED_FINISH_REASONS).to_numpy(dtype=bool)


def request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per completed request: request_id, ttft_ms, tpot_ms, e2e_ms, queue_ms (NaN where undefined)."""
    check_requests_frame(requests)
    completed = requests.loc[completed_mask(requests)]
    arrival = completed["arrival_time"].to_numpy(dtype=np.float64)
    first_token = completed["first_token_time"].to_numpy(dtype=np.float64)
    finish = completed["finish_time"].to_numpy(dtype=np.float64)
    num_output = completed["num_output_tokens"].to_numpy(dtype=np.float64)
    if "scheduled_time" in completed.columns:
        scheduled = completed["scheduled_time"].to_numpy(dtype=np.float64)
    else:
        scheduled = np.full(len(completed), np.nan)
    # TPOT is undefined with fewer than two output tokens: there is no decode interval to average.
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(num_output >= 2, (finish - first_token) / (num_output - 1), np.nan)
    return pd.DataFrame(
        {
            "request_id": completed["request_id"].to_numpy(),
            "ttft_ms": (first_token - arrival) * 1000.0,
            "tpot_ms": tpot * 1000.0,
            "e2e_ms": (finish - arrival) * 1000.0,
            "queue_ms": (scheduled - arrival) * 1000.0,
        }
    )


def inter_token_latencies(requests: pd.DataFrame) -> np.ndarray:
    """Seconds between consecutive distinct token times of each completed request, pooled over requests."""
    check_requests_frame(requests)
    flat_times, lengths = flatten_token_times(requests.loc[completed_mask(requests), "token_times"])
    if flat_times.size < 2:
        return np.empty(0)
    # Label each timestamp with its request; a gap is real only where both ends share a label.
    owner = np.repeat(np.arange(lengths.size), lengths)
    gaps = np.diff(flat_times)
    # A zero gap is a token that came in the same chunk as the one before it: no latency of its own.
    return gaps[(owner[1:] == owner[:-1]) & (gaps > 0)]


def flatten_token_times(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate a column of per-request token-time lists: (all times, number of times per row)."""
    if isinstance(column.dtype, pd.ArrowDtype):
        array = pa.array(column)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy().astype(np.int64)
        return array.flatten().to_numpy(zero_copy_only=False).astype(np.float64), lengths
    rows = [_as_times(row) for row in column.to_numpy()]
    lengths = np.fromiter((row.size for row in rows), dtype=np.int64, count=len(rows))
    flat = np.concatenate(rows) if rows else np.empty(0)
    return flat.astype(np.float64, copy=False), lengths


def _as_times(row: Any) -> np.ndarray:
    if row is None or (isinstance(row, float) and np.isnan(row)):
        return np.empty(0)
    return np.asarray(row, dtype=np.float64).reshape(-1)


def run_duration(requests: pd.DataFrame) -> float:
    """Seconds from the first arrival to the last finish (of any request); 0.0 when undefined."""
    arrival = requests["arrival_time"].to_numpy(dtype=np.float64)
    finish = requests["finish_time"].to_numpy(dtype=np.float64)
    arrival = arrival[np.isfinite(arrival)]
    finish = finish[np.isfinite(finish)]
    if arrival.size == 0 or finish.size == 0:
        return 0.0
    return max(float(finish.max() - arrival.min()), 0.0)


def compute_summary(
    requests: pd.DataFrame,
    steps: pd.DataFrame | None,
    *,
    name: str,
    mode: str,
    config: Mapping[str, Any] | None,
    slo: Mapping[str, float] | None = None,
    duration_s: float | None = None,
    class_slos: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """The summary.json dictionary of a run (DESIGN.md "Traces"), JSON-safe.

    - duration_s: given, or from the first arrival to the last finish.
    - request_throughput / output_token_throughput: completed requests / their output tokens per
      second of duration_s.
    - goodput: completed requests per second meeting every SLO in `slo` (keys ttft_ms, tpot_ms,
      e2e_ms, thresholds in ms, a request passes when its value <= the threshold; as in vLLM a
      request with one output token counts TPOT 0). Without SLOs goodput equals request_throughput.
      slo_attainment is the fraction of completed requests meeting the SLOs.
    - class_slos: each request class's thresholds (WorkloadConfig.class_slos), where a class's differ from
      ``slo``; a request of a class it names is judged by them, others by ``slo``. So goodput and
      slo_attainment judge every request by its own class's SLO; ``slo`` in the summary stays the
      top-level one.
    - num_preemptions: summed over steps (over requests when there are no step rows).
    - prefix_cache_hit_rate: sum(prefix_hit_tokens) / sum(prefix_query_tokens) over steps, 0 with
      no queries.
    - kv_usage_mean: mean kv_usage weighted by step duration, i.e. over the time the engine was
      stepping (idle stretches between bursts, when the cache holds nothing, do not count); kv_usage_max:
      its maximum.
    - ttft_ms, tpot_ms, itl_ms, e2e_ms, queue_ms: {count, mean, p50, p90, p99} in milliseconds.
    - ignored_examples / errored_examples (only when requests were ignored / errored and the trace says
      why): the first few, each {request_id, reason}.
    - by_priority (only when the requests carry two or more priorities): priority_class_stats.
    - by_class (only when the run has two or more request classes: the trace's request_class column, or
      class_slos naming them): analysis.class_stats.request_class_stats.
    - by_replica and replica_load_imbalance (only for a simulated cluster run: its tables carry a
      ``replica`` column, and its config names two or more replicas): analysis.replica_stats.
    - disaggregation (a disaggregated cluster run: its requests table has the KV load's columns): the
      parts of TTFT, analysis.disaggregation_stats.
    - kv_offload (a run with KV offloading): the prompt KV loaded from host memory, analysis.offload_stats.
    - lora (a run that serves LoRA adapters): adapter loads, their share of step time, the most requested
      adapters, analysis.lora_stats.
    - multimodal (a run with images): images shown and encoded, the encoder tokens saved, TTFT with and without
      images, analysis.multimodal_stats.
    - pipeline (engines of two or more pipeline stages): busy fraction and batches in flight,
      analysis.pipeline_stats.
    """
    if mode not in RUN_MODES:
        raise ValueError(f"mode must be one of {RUN_MODES}, got {mode!r}")
    slo_thresholds = _check_slo(slo)
    class_thresholds = {str(name): _check_slo(thresholds) for name, thresholds in (class_slos or {}).items()}
    check_requests_frame(requests)
    steps = empty_steps_frame() if steps is None else steps
    check_steps_frame(steps)

    finish_reason = requests["finish_reason"]
    completed = completed_mask(requests)
    num_finished = int(completed.sum())
    if duration_s is None:
        duration_s = run_duration(requests)
    elif not np.isfinite(duration_s) or duration_s < 0:
        raise ValueError(f"duration_s must be a non-negative number, got {duration_s!r}")
    duration_s = float(duration_s)

    latencies = request_latencies(requests)
    output_tokens = requests["num_output_tokens"].to_numpy(dtype=np.int64)
    prompt_tokens = requests["num_prompt_tokens"].to_numpy(dtype=np.int64)
    total_output_tokens = int(output_tokens[completed].sum())
    # Every request judged by its own class's SLO (one class: the run's).
    num_good = count_meeting_class_slos(latencies, request_classes(requests)[completed], class_thresholds,
                                        slo_thresholds)

    summary: dict[str, Any] = {
        "name": name,
        "mode": mode,
        "config": dict(config or {}),
        "num_requests": int(len(requests)),
        "num_finished": num_finished,
        "num_aborted": int((finish_reason == "abort").sum()),
        "num_ignored": int((finish_reason == "ignored").sum()),
        "num_errored": int((finish_reason == "error").sum()),
        "num_unfinished": int(finish_reason.isna().sum()),
        "duration_s": duration_s,
        "request_throughput": rate_per_second(num_finished, duration_s),
        "output_token_throughput": rate_per_second(total_output_tokens, duration_s),
        "total_output_tokens": total_output_tokens,
        "total_prompt_tokens": int(prompt_tokens[completed].sum()),
        "goodput": rate_per_second(num_good, duration_s),
        "slo": dict(slo_thresholds),
        "slo_attainment": num_good / num_finished if num_finished else None,
        "num_preemptions": num_preemptions(requests, steps),
        "prefix_cache_hit_rate": prefix_cache_hit_rate(steps),
        "kv_usage_mean": time_weighted_kv_usage(steps),
        "kv_usage_max": kv_usage_max(steps),
        "num_steps": int(len(steps)),
        "ttft_ms": latency_stats(latencies["ttft_ms"].to_numpy() / 1000.0),
        "tpot_ms": latency_stats(latencies["tpot_ms"].to_numpy() / 1000.0),
        "itl_ms": latency_stats(inter_token_latencies(requests)),
        "e2e_ms": latency_stats(latencies["e2e_ms"].to_numpy() / 1000.0),
        "queue_ms": latency_stats(latencies["queue_ms"].to_numpy() / 1000.0),
    }
    by_priority = priority_class_stats(requests, slo_thresholds, class_thresholds)
    if by_priority is not None:
        summary["by_priority"] = by_priority
    # Imported here: replica_stats and class_stats build on this module's latency helpers.
    from analysis.class_stats import request_class_stats

    by_class = request_class_stats(requests, class_thresholds, slo_thresholds, duration_s)
    if by_class is not None:
        summary["by_class"] = by_class
    from analysis.replica_stats import configured_prefill_replicas, configured_replicas, load_imbalance, replica_stats

    from analysis.disaggregation_stats import disaggregation_stats
    from analysis.offload_stats import offload_stats
    from analysis.pipeline_stats import pipeline_stats

    by_replica = replica_stats(requests, steps, slo_thresholds, duration_s, configured_replicas(config),
                               configured_prefill_replicas(config) or None, class_thresholds)
    if by_replica is not None:
        summary["by_replica"] = by_replica
        summary["replica_load_imbalance"] = load_imbalance(by_replica)
    disaggregation = disaggregation_stats(requests)
    if disaggregation is not None:
        summary["disaggregation"] = disaggregation
    offload = offload_stats(requests)
    if offload is not None:
        summary["kv_offload"] = offload
    from analysis.lora_stats import lora_stats

    lora = lora_stats(requests, steps)
    if lora is not None:
        summary["lora"] = lora
    from analysis.multimodal_stats import multimodal_stats

    multimodal = multimodal_stats(requests, steps)
    if multimodal is not None:
        summary["multimodal"] = multimodal
    from analysis.session_stats import session_stats

    sessions = session_stats(requests)
    if sessions is not None:
        summary["sessions"] = sessions
    if CLIENT_WAIT_COLUMN in requests.columns:
        # A client with a concurrency limit: how long requests waited to be sent (their latencies count from then).
        waits = requests[CLIENT_WAIT_COLUMN].to_numpy(dtype=np.float64)
        summary["client_wait_ms"] = latency_stats(waits)
        summary["num_client_waited"] = int((waits > 0).sum())
    pipeline = pipeline_stats(steps, duration_s, config)
    if pipeline is not None:
        summary["pipeline"] = pipeline
    for finish_reason in ("ignored", "error"):
        examples = _examples(requests, finish_reason)
        if examples:
            summary[EXAMPLES_KEYS[finish_reason]] = examples
    return json_safe(summary)


# How many ignored (or errored) requests the summary names with their reason: enough to see what went wrong.
NUM_IGNORED_EXAMPLES = 3
EXAMPLES_KEYS = {"ignored": "ignored_examples", "error": "errored_examples"}


def _examples(requests: pd.DataFrame, finish_reason: str) -> list[dict[str, str]]:
    """The first requests (by arrival) that ended with ``finish_reason``, with the reason the engine (or
    the server) gave, from traces that record it."""
    if "status_message" not in requests.columns:
        return []
    ended = requests[(requests["finish_reason"] == finish_reason) & requests["status_message"].notna()]
    first = ended.sort_values("arrival_time", kind="stable").head(NUM_IGNORED_EXAMPLES)
    return [{"request_id": str(request_id), "reason": str(reason)}
            for request_id, reason in zip(first["request_id"], first["status_message"])]


def _check_slo(slo: Mapping[str, float] | None) -> dict[str, float]:
    thresholds: dict[str, float] = {}
    for key, value in (slo or {}).items():
        if key not in SLO_METRICS:
            raise ValueError(f"unknown SLO {key!r}; expected some of {SLO_METRICS} (milliseconds)")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not value > 0:
            raise ValueError(f"SLO {key!r} must be a positive number of milliseconds, got {value!r}")
        thresholds[key] = float(value)
    return thresholds


def priority_class_stats(requests: pd.DataFrame, slo_thresholds: Mapping[str, float],
                         class_thresholds: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any] | None:
    """Per priority value, when a run has two or more: what a scheduling policy buys each class, which the
    overall percentiles mix away (run a workload under ``priority`` and ``fcfs`` and set these side by
    side). ``{"0": {num_requests, num_finished, slo_attainment, ttft_ms, tpot_ms, e2e_ms, queue_ms}, ...}``,
    keys in increasing priority (lower is served first, as in vLLM), each statistic defined as for the
    whole run (a request judged by its request class's SLO, ``class_thresholds``, as there)."""
    if "priority" not in requests.columns:
        return None
    priorities = sorted(int(value) for value in requests["priority"].dropna().unique())
    if len(priorities) < 2:
        return None
    classes: dict[str, Any] = {}
    for priority in priorities:
        members = requests.loc[requests["priority"] == priority]
        latencies = request_latencies(members)
        num_finished = int(completed_mask(members).sum())
        classes[str(priority)] = {
            "num_requests": int(len(members)),
            "num_finished": num_finished,
            "slo_attainment": (count_meeting_class_slos(latencies, request_classes(members)[completed_mask(members)],
                                                        class_thresholds or {}, slo_thresholds) / num_finished
                               if num_finished and (slo_thresholds or any((class_thresholds or {}).values()))
                               else None),
            **{key: latency_stats(latencies[key].to_numpy() / 1000.0)
               for key in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms")},
        }
    return classes


def count_meeting_slo(latencies: pd.DataFrame, thresholds: Mapping[str, float]) -> int:
    return int(meets_slo_mask(latencies, thresholds).sum())


def count_meeting_class_slos(latencies: pd.DataFrame, classes: np.ndarray,
                             class_thresholds: Mapping[str, Mapping[str, float]],
                             default_thresholds: Mapping[str, float]) -> int:
    """Completed requests (the rows of ``latencies``; ``classes``: the request class of each) meeting their
    own class's SLO: ``class_thresholds[class]``, or ``default_thresholds`` for a class it does not name."""
    return int(class_slo_mask(latencies, classes, class_thresholds, default_thresholds).sum())


def class_slo_mask(latencies: pd.DataFrame, classes: np.ndarray, class_thresholds: Mapping[str, Mapping[str, float]],
                   default_thresholds: Mapping[str, float]) -> np.ndarray:
    """Per row of ``latencies``: True when the request met its own class's SLO (count_meeting_class_slos)."""
    meets = np.zeros(len(latencies), dtype=bool)
    for name in dict.fromkeys(classes.tolist()):
        rows = classes == name
        meets[rows] = meets_slo_mask(latencies.loc[rows], class_thresholds.get(name, default_thresholds))
    return meets


def meets_slo_mask(latencies: pd.DataFrame, thresholds: Mapping[str, float]) -> np.ndarray:
    """Per row of ``latencies``: True when the request met every threshold (all pass when there are none)."""
    meets = np.ones(len(latencies), dtype=bool)
    for key, threshold in thresholds.items():
        values = latencies[key].to_numpy(dtype=np.float64)
        if key == "tpot_ms":
            # vLLM's goodput treats a single-token request's TPOT as 0: it met any TPOT target.
            values = np.nan_to_num(values, nan=0.0)
        # NaN (e.g. a completed request missing a timestamp) compares False: it fails the SLO.
        meets &= values <= threshold
    return meets


def rate_per_second(count: float, duration_s: float) -> float | None:
    if duration_s > 0:
        return count / duration_s
    # Nothing happened over no time is a rate of zero; something in zero time has no finite rate.
    return 0.0 if count == 0 else None
