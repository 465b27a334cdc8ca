"""Per-request-class figures of a run: what each concurrent stream of the workload got, under its own SLO.

A workload of several classes (``workload.classes``: interactive chat beside batch summarization) is judged
class by class: the run's percentiles mix a strict-SLO class with a loose one, so a scheduling policy that
protects the first at the second's expense reads as little change overall. The trace's ``request_class``
column (analysis.trace_schema) names each request's class; every statistic here is the run-level one
(analysis.metrics) over that class's requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.trace_schema import request_classes


def request_class_stats(requests: pd.DataFrame, class_thresholds: Mapping[str, Mapping[str, float]],
                        default_thresholds: Mapping[str, float], duration_s: float) -> dict[str, Any] | None:
    """``{"interactive": {...}, "batch": {...}}`` for a run of two or more classes, else None.

    The classes are those ``class_thresholds`` names (the workload's, in its order: a class none of whose
    requests reached the trace still gets a row) followed by any other the trace holds. Each: num_requests,
    num_finished, request_throughput, output_token_throughput and goodput (over the whole run's
    ``duration_s``, so that the classes' figures add up to the run's), slo (the thresholds it is judged by:
    ``class_thresholds[name]``, else ``default_thresholds``), slo_attainment (None without thresholds), and
    ttft_ms, tpot_ms, itl_ms, e2e_ms, queue_ms as for the run."""
    from analysis.metrics import (
        completed_mask,
        count_meeting_slo,
        inter_token_latencies,
        latency_stats,
        rate_per_second,
        request_latencies,
    )

    classes = request_classes(requests)
    names = list(dict.fromkeys([*class_thresholds, *classes.tolist()]))
    if len(names) < 2:
        return None
    stats: dict[str, Any] = {}
    for name in names:
        members = requests.loc[classes == name]
        completed = completed_mask(members)
        num_finished = int(completed.sum())
        latencies = request_latencies(members)
        thresholds = dict(class_thresholds.get(name, default_thresholds))
        num_good = count_meeting_slo(latencies, thresholds)
        output_tokens = int(members["num_output_tokens"].to_numpy(dtype=np.int64)[completed].sum())
        stats[name] = {
            "num_requests": int(len(members)),
            "num_finished": num_finished,
            "request_throughput": rate_per_second(num_finished, duration_s),
            "output_token_throughput": rate_per_second(output_tokens, duration_s),
            "goodput": rate_per_second(num_good, duration_s),
            "slo": thresholds,
            "slo_attainment": num_good / num_finished if num_finished and thresholds else None,
            "ttft_ms": latency_stats(latencies["ttft_ms"].to_numpy() / 1000.0),
            "tpot_ms": latency_stats(latencies["tpot_ms"].to_numpy() / 1000.0),
            "itl_ms": latency_stats(inter_token_latencies(members)),
            "e2e_ms": latency_stats(latencies["e2e_ms"].to_numpy() / 1000.0),
            "queue_ms": latency_stats(latencies["queue_ms"].to_numpy() / 1000.0),
        }
    return stats


def class_thresholds_of(summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The SLO each request class of a summary was judged by (its ``by_class``), for readers of a run
    directory that judge requests again (the dashboard); empty for a run of one class."""
    return {name: dict(entry.get("slo") or {}) for name, entry in (summary.get("by_class") or {}).items()}
