"""Whole-run figures summed or averaged over a steps table (one engine's, or a cluster's replicas' together).

Each takes the steps frame of the trace schema (analysis/trace_schema.py); the definitions are the ones
compute_summary documents for summary.json.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def num_preemptions(requests: pd.DataFrame, steps: pd.DataFrame) -> int:
    if len(steps):
        return int(steps["num_preemptions"].sum())
    return int(requests["num_preemptions"].sum())


def prefix_cache_hit_rate(steps: pd.DataFrame) -> float:
    if "prefix_query_tokens" not in steps.columns:
        return 0.0
    queries = float(steps["prefix_query_tokens"].sum())
    return float(steps["prefix_hit_tokens"].sum()) / queries if queries > 0 else 0.0


def time_weighted_kv_usage(steps: pd.DataFrame) -> float | None:
    if "kv_usage" not in steps.columns:
        return None
    usage = steps["kv_usage"].to_numpy(dtype=np.float64)
    duration = steps["duration"].to_numpy(dtype=np.float64)
    known = np.isfinite(usage) & np.isfinite(duration) & (duration >= 0)
    if not known.any():
        return None
    total_time = duration[known].sum()
    if total_time <= 0:
        # Steps without durations (e.g. a replay with no timing) still have usage; weigh them alike.
        return float(usage[known].mean())
    return float((usage[known] * duration[known]).sum() / total_time)


def kv_usage_max(steps: pd.DataFrame) -> float | None:
    if "kv_usage" not in steps.columns:
        return None
    usage = steps["kv_usage"].to_numpy(dtype=np.float64)
    usage = usage[np.isfinite(usage)]
    return float(usage.max()) if usage.size else None
