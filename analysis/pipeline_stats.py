"""How full a pipeline-parallel engine kept its pipeline: busy time and batches in flight.

A pipelined engine's step rows overlap (each lasts from its scheduling until its outputs are back; see
sim/pipeline_stages.py), so the time an engine was busy is the union of its rows' intervals, not their sum,
and the sum over the union is how many batches were in flight on average while it was busy. A pipeline of
P stages kept full has about P in flight; fewer means bubbles (every running request's token in flight,
and nothing new to schedule).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd


def busy_seconds(steps: pd.DataFrame) -> float:
    """The time covered by at least one step row. Rows that never overlap (one batch at a time) give
    exactly the sum of their durations."""
    if steps.empty:
        return 0.0
    starts = steps["start_time"].to_numpy(dtype=np.float64)
    durations = np.nan_to_num(steps["duration"].to_numpy(dtype=np.float64))
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], starts[order] + durations[order]
    if np.all(starts[1:] >= ends[:-1]):
        return float(np.sum(durations))
    # Merge: an interval extends the current run when it starts before the run's end.
    run_ends = np.maximum.accumulate(ends)
    new_run = np.concatenate(([True], starts[1:] > run_ends[:-1]))
    run_ids = np.cumsum(new_run) - 1
    run_starts = starts[new_run]
    run_stops = np.zeros(len(run_starts))
    np.maximum.at(run_stops, run_ids, ends)
    return float(np.sum(run_stops - run_starts))


def configured_stages(config: Mapping[str, Any] | None) -> int | None:
    """``engine.pipeline_parallel_size`` of the workload a run's summary config holds, where it says."""
    engine = ((config or {}).get("workload") or {}).get("engine") or {}
    value = engine.get("pipeline_parallel_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pipeline_stats(steps: pd.DataFrame, duration_s: float, config: Mapping[str, Any] | None) -> dict | None:
    """For a run whose engines have two or more pipeline stages: {stages, busy_fraction (of each engine's
    time, over the run's duration, averaged over replicas), batches_in_flight_mean (while busy)}; else None."""
    stages = configured_stages(config)
    if stages is None or stages < 2:
        return None
    groups = [group for _, group in steps.groupby("replica")] if "replica" in steps.columns else [steps]
    busy = [busy_seconds(group) for group in groups]
    total_busy = sum(busy)
    step_seconds = float(np.nansum(steps["duration"].to_numpy(dtype=np.float64))) if not steps.empty else 0.0
    return {
        "stages": stages,
        "busy_fraction": (total_busy / len(busy)) / duration_s if duration_s > 0 and busy else None,
        "batches_in_flight_mean": step_seconds / total_busy if total_busy > 0 else None,
    }
