"""A cluster run's steps as one engine-like time series: the replicas' state summed at every step.

A cluster's steps table holds each replica's steps one replica after another (sim/cluster_trace.py),
so drawn as it is, a line would run to the end of the run and back for each replica. Here every step
becomes an instant at which one replica's state changes, and the cluster's state is each replica's
latest state summed (KV usage: averaged, as every replica has the same number of blocks). A run of
one engine comes back unchanged.
"""

from __future__ import annotations

import pandas as pd

# Columns summed over replicas; kv_usage is averaged instead.
SUMMED = ("num_waiting", "num_running", "num_scheduled_tokens", "kv_blocks_used")


def is_cluster(steps: pd.DataFrame) -> bool:
    return "replica" in steps.columns and steps["replica"].nunique() > 1


def cluster_step_view(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps in time order, with SUMMED columns (and kv_usage) replaced by the cluster's state after
    each step: Invariant: at each row, every replica contributes its value from its latest step at or
    before that row (0 before its first step)."""
    if not is_cluster(steps):
        return steps
    ordered = steps.sort_values(["start_time", "replica"], kind="stable").reset_index(drop=True)
    by_replica = ordered.groupby("replica", sort=False)
    num_replicas = ordered["replica"].nunique()
    view = ordered.copy()
    for column in (*SUMMED, "kv_usage"):
        if column not in ordered.columns:
            continue
        values = ordered[column].astype("float64")
        # Each replica's change since its previous step; their running sum is the cluster's total.
        change = values - by_replica[column].shift(1).astype("float64").fillna(0.0)
        total = change.fillna(0.0).cumsum()
        view[column] = total / num_replicas if column == "kv_usage" else total
    return view
