"""A pipelined engine's overlapping step rows: busy time is their union, and batches in flight their sum over it."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import compute_summary
from analysis.pipeline_stats import busy_seconds, pipeline_stats
from sim.run_pipeline import run_simulation
from workloads import example_path, load_workload


def steps_frame(intervals, replica=None):
    frame = pd.DataFrame({"start_time": [start for start, _ in intervals],
                          "duration": [end - start for start, end in intervals]})
    if replica is not None:
        frame["replica"] = replica
    return frame


def test_busy_time_is_the_union_of_the_rows_and_exactly_their_sum_when_none_overlap():
    assert busy_seconds(steps_frame([(0.0, 2.0), (1.0, 3.0), (2.5, 2.75), (5.0, 6.0)])) == pytest.approx(4.0)
    # Out of order, nested, and touching rows.
    assert busy_seconds(steps_frame([(4.0, 5.0), (0.0, 10.0), (10.0, 11.0)])) == pytest.approx(11.0)
    apart = steps_frame([(0.1, 0.3), (0.3, 0.7), (1.0, 1.1)])
    assert busy_seconds(apart) == float(apart["duration"].sum())
    assert busy_seconds(steps_frame([])) == 0.0


def test_the_pipeline_entry_counts_batches_in_flight_per_replica_only_for_pipelines():
    config = {"workload": {"engine": {"pipeline_parallel_size": 2}}}
    # Two replicas, each with two overlapping batches over 2 s of a 4 s run.
    steps = pd.concat([steps_frame([(0.0, 2.0), (0.0, 2.0)], replica=0), steps_frame([(1.0, 3.0), (2.0, 3.0)], 1)])
    stats = pipeline_stats(steps, 4.0, config)
    assert stats == {"stages": 2, "busy_fraction": pytest.approx(0.5), "batches_in_flight_mean": pytest.approx(7 / 4)}
    assert pipeline_stats(steps, 4.0, {"workload": {"engine": {"pipeline_parallel_size": 1}}}) is None
    assert pipeline_stats(steps, 4.0, {}) is None


def test_a_pipelined_clusters_replicas_are_never_busier_than_the_whole_run(tmp_path):
    workload = load_workload(example_path("chat"), overrides=[
        "workload.num_requests=200", "workload.arrival.rate=60", "cluster.num_replicas=2",
        "engine.pipeline_parallel_size=3"])
    result = run_simulation(workload, tmp_path / "run")
    summary = result.summary
    assert summary["pipeline"]["stages"] == 3
    assert 1.0 < summary["pipeline"]["batches_in_flight_mean"] <= 3.0
    assert all(0.0 < replica["busy_fraction"] <= 1.0 for replica in summary["by_replica"].values())
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    again = compute_summary(requests, steps, name="again", mode="sim", config=summary["config"])
    assert again["pipeline"] == summary["pipeline"]
