"""Per-replica figures of a cluster run: how the router shared the load, and what each replica made of it.

A cluster's traces carry a ``replica`` column in both tables (sim/cluster_trace.py). The whole-run
metrics mix the replicas; these set them side by side, so that a router that piles requests (or one
hot prefix) onto one replica shows as that replica's longer queue, fuller cache or lower attainment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from analysis.pipeline_stats import busy_seconds
from analysis.step_aggregates import kv_usage_max, num_preemptions, prefix_cache_hit_rate, time_weighted_kv_usage


def replica_stats(requests: pd.DataFrame, steps: pd.DataFrame, slo_thresholds: Mapping[str, float],
                  duration_s: float, num_replicas: int | None = None,
                  num_prefill_replicas: int | None = None,
                  class_thresholds: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any] | None:
    """``{"0": {...}, "1": {...}, ...}`` for a run of two or more replicas, else None. ``num_replicas``
    (the run's ``cluster.num_replicas``) counts the replicas the router never chose too. Each replica:
    num_requests, num_finished, slo_attainment, busy_fraction (its steps' total duration over the run's
    duration_s), kv_usage_mean, kv_usage_max, num_preemptions, prefix_cache_hit_rate, and ttft_ms, e2e_ms,
    queue_ms as for the whole run; with LoRA adapters, lora_adapters (distinct adapters of its requests) and
    lora_adapter_loads (its slots' loads). A disaggregated run's replicas also get their ``role``, prefill or
    decode; a prefill replica's requests are those whose prompts it ran (``prefill_replica``). A request
    meets the SLO of its own request class (``class_thresholds``, else ``slo_thresholds``), as for the run."""
    from analysis.metrics import completed_mask, count_meeting_class_slos, latency_stats, request_latencies
    from analysis.trace_schema import request_classes

    if "replica" not in requests.columns and "replica" not in steps.columns:
        # Not traces of a simulated cluster (a server run of a cluster workload records no replicas).
        return None
    replicas: set[int] = set(range(num_replicas or 0))
    if "replica" in requests.columns:
        replicas |= {int(value) for value in requests["replica"].dropna().unique()}
    if "replica" in steps.columns:
        replicas |= {int(value) for value in steps["replica"].dropna().unique()}
    if len(replicas) < 2:
        return None
    stats: dict[str, Any] = {}
    # The roles are the configuration's (cluster.prefill_replicas): a prefill replica the router never
    # chose has no request naming it, and must not pass for a decode replica.
    if num_prefill_replicas is not None:
        prefill_replicas = set(range(num_prefill_replicas))
    else:
        prefill_replicas = ({int(value) for value in requests["prefill_replica"].unique() if value >= 0}
                            if "prefill_replica" in requests.columns else set())
    for replica in sorted(replicas):
        column = "prefill_replica" if replica in prefill_replicas else "replica"
        members = requests.loc[requests[column] == replica] if column in requests.columns else requests.iloc[:0]
        replica_steps = steps.loc[steps["replica"] == replica] if "replica" in steps.columns else steps.iloc[:0]
        latencies = request_latencies(members)
        num_finished = int(completed_mask(members).sum())
        busy_s = busy_seconds(replica_steps)  # a pipelined replica's rows overlap: their union
        stats[str(replica)] = {
            "num_requests": int(len(members)),
            "num_finished": num_finished,
            "slo_attainment": (count_meeting_class_slos(latencies, request_classes(members)[completed_mask(members)],
                                                        class_thresholds or {}, slo_thresholds) / num_finished
                               if num_finished and (slo_thresholds or any((class_thresholds or {}).values()))
                               else None),
            "busy_fraction": busy_s / duration_s if duration_s > 0 else None,
            "kv_usage_mean": time_weighted_kv_usage(replica_steps),
            "kv_usage_max": kv_usage_max(replica_steps),
            "num_preemptions": num_preemptions(members, replica_steps),
            "prefix_cache_hit_rate": prefix_cache_hit_rate(replica_steps),
            **{key: latency_stats(latencies[key].to_numpy() / 1000.0) for key in ("ttft_ms", "e2e_ms", "queue_ms")},
        }
        if "lora_name" in members.columns and requests["lora_name"].notna().any():
            # Multi-LoRA: how many adapters the router gave it, and how often its slots loaded one.
            stats[str(replica)]["lora_adapters"] = int(members["lora_name"].nunique())
            if "num_lora_loads" in replica_steps.columns:
                stats[str(replica)]["lora_adapter_loads"] = int(replica_steps["num_lora_loads"].sum())
        if "prefill_replica" in requests.columns:
            stats[str(replica)]["role"] = "prefill" if replica in prefill_replicas else "decode"
    return stats


def load_imbalance(by_replica: Mapping[str, Any]) -> float | None:
    """The busiest replica's busy time over the mean replica's: 1.0 is an even split; N (of N replicas)
    is all the work on one. A disaggregated run's prefill and decode replicas do different work, so each
    pool is measured on its own and the larger imbalance is the run's."""
    pools: dict[Any, list[float]] = {}
    for entry in by_replica.values():
        if entry.get("busy_fraction") is not None:
            pools.setdefault(entry.get("role"), []).append(entry["busy_fraction"])
    imbalances = [max(busy) / (sum(busy) / len(busy)) for busy in pools.values() if sum(busy) > 0]
    return max(imbalances) if imbalances else None


def configured_prefill_replicas(config: Mapping[str, Any] | None) -> int | None:
    """``cluster.prefill_replicas`` of the workload a run's summary config holds, where it says."""
    cluster = ((config or {}).get("workload") or {}).get("cluster") or {}
    value = cluster.get("prefill_replicas")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def configured_replicas(config: Mapping[str, Any] | None) -> int | None:
    """``cluster.num_replicas`` of the workload a run's summary config holds, where it says."""
    cluster = ((config or {}).get("workload") or {}).get("cluster") or {}
    value = cluster.get("num_replicas")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def billed_replicas(summary: Mapping[str, Any]) -> tuple[float | None, float | None, int | None]:
    """(replica-hours, mean replicas, peak replicas) a run bills: an autoscaled cluster's (sim/autoscaler.py),
    else every configured replica (one engine: 1) for the whole run. What a sweep sets beside SLO attainment."""
    autoscaling = summary.get("autoscaling")
    if autoscaling:
        return autoscaling.get("replica_hours"), autoscaling.get("mean_replicas"), autoscaling.get("peak_replicas")
    replicas = configured_replicas(summary.get("config")) or 1
    duration_s = summary.get("duration_s")
    return (None if duration_s is None else replicas * duration_s / 3600), replicas, replicas
