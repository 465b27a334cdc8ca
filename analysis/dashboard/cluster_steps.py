"""A cluster run's steps as one engine-like time series: the replicas' state summed at every step.

A cluster's steps table holds each replica's steps one replica after another (sim/cluster_trace.py),
so drawn as it is, a line would run to the end of the run and back for each replica. Here every step
becomes an instant at which one replica's state changes, and the cluster's state is each replica's
latest state summed: queue, batch and blocks in use as its latest step left them, KV usage averaged over
all of the cluster's replicas (each has the same number of blocks; one the router never chose holds
none), and tokens scheduled counted only while their step runs (a replica gone idle schedules none).
A run of one engine comes back unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.replica_stats import configured_replicas

# State after a step, summed over replicas; kv_usage is averaged instead.
STATE_COLUMNS = ("num_waiting", "num_running", "kv_blocks_used")


def cluster_size(summary: Mapping[str, Any]) -> int:
    """The run's cluster.num_replicas (1 for a run that names none)."""
    return configured_replicas(summary.get("config")) or 1


def is_cluster(steps: pd.DataFrame, num_replicas: int = 1) -> bool:
    return num_replicas > 1 or ("replica" in steps.columns and steps["replica"].nunique() > 1)


def cluster_step_view(steps: pd.DataFrame, num_replicas: int = 1) -> pd.DataFrame:
    """Steps in time order, with STATE_COLUMNS, kv_usage and num_scheduled_tokens replaced by the
    cluster's. Invariant: at each row, every replica contributes its state from its latest step at or
    before that row (0 before its first), and its scheduled tokens only while that step runs."""
    if not is_cluster(steps, num_replicas) or "replica" not in steps.columns:
        return steps
    ordered = steps.sort_values(["start_time", "replica"], kind="stable").reset_index(drop=True)
    by_replica = ordered.groupby("replica", sort=False)
    view = ordered.copy()
    for column in (*STATE_COLUMNS, "kv_usage"):
        if column not in ordered.columns:
            continue
        values = ordered[column].astype("float64")
        # Each replica's change since its previous step; their running sum is the cluster's total.
        change = values - by_replica[column].shift(1).astype("float64").fillna(0.0)
        total = change.fillna(0.0).cumsum()
        view[column] = total / max(num_replicas, ordered["replica"].nunique()) if column == "kv_usage" else total
    if "num_scheduled_tokens" in ordered.columns and "duration" in ordered.columns:
        view["num_scheduled_tokens"] = _tokens_in_flight(ordered)
    return view


def _tokens_in_flight(ordered: pd.DataFrame) -> np.ndarray:
    """At each step's start, the tokens of every step running then: started at or before it (in row
    order) and not yet ended. A step ends at start + duration, when the replica's next may begin."""
    tokens = ordered["num_scheduled_tokens"].to_numpy(dtype=np.float64)
    starts = ordered["start_time"].to_numpy(dtype=np.float64)
    ends = starts + np.nan_to_num(ordered["duration"].to_numpy(dtype=np.float64))
    started = np.cumsum(tokens)
    end_order = np.argsort(ends, kind="stable")
    ended = np.concatenate(([0.0], np.cumsum(tokens[end_order])))
    num_ended = np.searchsorted(ends[end_order], starts, side="right")
    return started - ended[num_ended]
