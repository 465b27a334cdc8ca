"""An autoscaled cluster (cluster.autoscaling, sim/autoscaler.py).

The autoscaler decides which replicas serve; it must never change what a replica does with the requests it
gets. So: requests reach only ready replicas, a replica stops only once it holds none, every request
finishes, the bill is exactly the powered stretches, an autoscaler that may not move gives the static
cluster's traces, and the decode fast-forward (which stops at each decision) changes nothing.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import requests_table, steps_table
from analysis.dashboard.build import write_run_dashboard
from analysis.replica_stats import billed_replicas
from sim.autoscaler import DRAINING, OFF, READY, STARTING, desired_replicas
from sim.engine_setup import build_setup
from sim.run_pipeline import run_simulation, simulate
from workloads import WorkloadError, example_path, load_workload, load_workload_text
from workloads.autoscaling_section import AutoscalingSection

# Quiet, a peak five times busier, quiet again: replicas start at the peak and stop after it.
RAMP = """
name: ramp
seed: 1
model: llama-3-8b
hardware: l4
engine: {{max_num_seqs: 32}}
cluster:
  num_replicas: 4
  router: {router}
  autoscaling: {{metric: {metric}, target: {target}, interval_s: 5, startup_s: 10, scale_down_delay_s: 20}}
workload:
  duration_s: 30
  arrival: {{type: poisson, rate: 1}}
  prompt_len: {{type: uniform, min: 200, max: 1200}}
  output_len: {{type: uniform, min: 20, max: 200}}
  phases:
    - {{duration_s: 60, arrival: {{type: poisson, rate: 6}}, prompt_len: {{type: uniform, min: 200, max: 1200}},
       output_len: {{type: uniform, min: 20, max: 200}}}}
    - {{duration_s: 60, arrival: {{type: poisson, rate: 1}}, prompt_len: {{type: uniform, min: 200, max: 1200}},
       output_len: {{type: uniform, min: 20, max: 200}}}}
slo: {{ttft_ms: 2000}}
"""


def ramp(router="least_loaded", metric="outstanding", target=8, overrides=()):
    return load_workload_text(RAMP.format(router=router, metric=metric, target=target), overrides=list(overrides))


def section(**fields):
    return AutoscalingSection(**{"target": 8.0, **fields})


def run(workload, fast_forward=True):
    trace = simulate(build_setup(workload), fast_forward=fast_forward)
    return (trace, requests_table(trace.request_columns()).to_pandas(),
            steps_table(trace.step_columns()).to_pandas())


def states_at(transitions, num_replicas, time, inclusive):
    """Each replica's state at ``time``: after the transitions at ``time`` (inclusive) or before them."""
    state = [OFF] * num_replicas
    for when, index, new in transitions:
        if when < time or (inclusive and when == time):
            state[index] = new
    return state


def test_desired_count_follows_hpa():
    # ceil(sum / target), clamped; within the tolerance of the current count, the current count.
    assert desired_replicas(40, section(), current=2, max_replicas=8) == 5
    assert desired_replicas(17, section(), current=2, max_replicas=8) == 2  # 17 / 16 within 10%
    assert desired_replicas(18, section(), current=2, max_replicas=8) == 3
    assert desired_replicas(0, section(min_replicas=2), current=3, max_replicas=8) == 2
    assert desired_replicas(1000, section(), current=3, max_replicas=6) == 6
    # A sum that is a whole multiple of the target asks for that many, whatever the float rounding.
    assert desired_replicas(0.1 + 0.2, section(target=0.1, tolerance=0), current=1, max_replicas=8) == 3


@pytest.mark.parametrize("router", ["least_loaded", "round_robin", "prefix_aware"])
def test_requests_reach_ready_replicas_and_replicas_stop_empty(router):
    workload = ramp(router)
    trace, requests, _ = run(workload)
    stats = trace.autoscaling
    num_replicas = workload.cluster.num_replicas
    assert (requests["finish_reason"] == "length").all()  # every request finished
    transitions = stats.transitions
    for row in requests.itertuples():
        before = states_at(transitions, num_replicas, row.arrival_time, inclusive=False)
        after = states_at(transitions, num_replicas, row.arrival_time, inclusive=True)
        assert READY in (before[row.replica], after[row.replica]), row.request_id
        # No stop while it holds the request.
        assert not any(index == row.replica and new == OFF and row.arrival_time < when < row.finish_time
                       for when, index, new in transitions), row.request_id
    # A ready replica at every instant; starts become ready exactly startup_s later, unless cancelled.
    for when, _, _ in transitions:
        assert READY in states_at(transitions, num_replicas, when, inclusive=True)
    pending: dict[int, float] = {}
    for when, index, new in transitions:
        if new == STARTING:
            pending[index] = when
        elif index in pending:
            started = pending.pop(index)
            assert new == OFF or when == pytest.approx(started + workload.cluster.autoscaling.startup_s)
    # It scaled both ways, within its bounds.
    assert stats.scale_ups > 0 and stats.scale_downs > 0
    assert 1 < stats.peak_powered <= num_replicas
    # The bill is the powered stretches, to the run's end.
    billed, powered_since = 0.0, {index: 0.0 for index in range(workload.cluster.autoscaling.replicas_at_start)}
    for when, index, new in transitions[num_replicas:]:
        if new == OFF and index in powered_since:
            billed += when - powered_since.pop(index)
        elif new in (STARTING, READY, DRAINING) and index not in powered_since:
            powered_since[index] = when
    billed += sum(stats.end_s - since for since in powered_since.values())
    assert stats.replica_seconds == pytest.approx(billed)
    assert stats.end_s == pytest.approx(requests["finish_time"].max())


def test_an_autoscaler_that_cannot_move_is_the_static_cluster():
    static = ramp(overrides=["cluster.autoscaling=null"])
    pinned = ramp(overrides=["cluster.autoscaling.min_replicas=4"])
    static_trace, static_requests, static_steps = run(static)
    pinned_trace, pinned_requests, pinned_steps = run(pinned)
    pd.testing.assert_frame_equal(static_requests, pinned_requests)
    pd.testing.assert_frame_equal(static_steps, pinned_steps)
    assert pinned_trace.autoscaling.replica_seconds == pytest.approx(4 * pinned_trace.autoscaling.end_s)
    assert pinned_trace.autoscaling.scale_ups == pinned_trace.autoscaling.scale_downs == 0


@pytest.mark.parametrize("metric,target", [("outstanding", 8), ("waiting", 1), ("kv_cache_usage", 0.2)])
def test_fast_forward_changes_nothing(metric, target):
    workload = ramp(metric=metric, target=target)
    fast_trace, fast_requests, fast_steps = run(workload, fast_forward=True)
    slow_trace, slow_requests, slow_steps = run(workload, fast_forward=False)
    pd.testing.assert_frame_equal(fast_requests, slow_requests)
    pd.testing.assert_frame_equal(fast_steps, slow_steps)
    assert fast_trace.autoscaling.transitions == slow_trace.autoscaling.transitions
    assert fast_trace.autoscaling.scale_ups > 0


def test_summary_bills_and_compares_with_the_static_cluster(tmp_path):
    result = run_simulation(ramp(), tmp_path / "run")
    scaling = result.summary["autoscaling"]
    # The static cluster: all 4 replicas from t = 0 (the first arrival) to the last finish.
    assert scaling["static_replica_hours"] == pytest.approx(4 * result.summary["duration_s"] / 3600)
    duration_h = scaling["static_replica_hours"] / 4
    assert scaling["mean_replicas"] == pytest.approx(scaling["replica_hours"] / duration_h)
    assert scaling["saved_fraction"] == pytest.approx(1 - scaling["replica_hours"] / scaling["static_replica_hours"])
    assert 0 < scaling["saved_fraction"] < 1
    timeline = scaling["timeline"]
    assert len(timeline["time_s"]) == len(timeline["ready"]) == len(timeline["powered"]) == len(timeline["desired"])
    assert all(ready <= powered for ready, powered in zip(timeline["ready"], timeline["powered"]))
    assert billed_replicas(result.summary)[0] == scaling["replica_hours"]
    # The run directory's dashboard draws it.
    page = write_run_dashboard(tmp_path / "run").read_text()
    assert 'id="autoscaling-timeline"' in page


@pytest.mark.parametrize("override,field", [
    ("cluster.autoscaling.min_replicas=5", "cluster.autoscaling.min_replicas"),
    ("cluster.autoscaling.initial_replicas=9", "cluster.autoscaling.initial_replicas"),
    ("cluster.num_replicas=1", "cluster.num_replicas"),
    ("cluster.prefill_replicas=1", "cluster.autoscaling"),
    ("cluster.autoscaling.target=0", "cluster.autoscaling.target"),
])
def test_impossible_settings_are_named(override, field):
    with pytest.raises(WorkloadError) as error:
        ramp(overrides=[override])
    assert field in str(error.value)


def test_a_usage_target_is_a_share():
    with pytest.raises(WorkloadError, match="cluster.autoscaling.target"):
        ramp(metric="kv_cache_usage", target=2)


def test_initial_replicas_below_min_is_refused():
    with pytest.raises(WorkloadError, match="initial_replicas"):
        ramp(overrides=["cluster.autoscaling.min_replicas=3", "cluster.autoscaling.initial_replicas=2"])


def test_the_example_compares_static_and_autoscaled():
    workload = load_workload(example_path("autoscaling"))
    labels = [label for label, _ in workload.sweep_points()]
    assert len(labels) == 4
    assert workload.sweep_points()[0][1].cluster.autoscaling is None
    assert all(point.cluster.autoscaling is not None for _, point in workload.sweep_points()[1:])
    assert math.isfinite(workload.sweep_points()[1][1].cluster.autoscaling.startup_s)


def test_replicas_with_batches_in_flight_drain_and_stop():
    # Async scheduling keeps two batches in flight (sim/pipeline_stages.py's loop): its replicas drain too.
    trace, requests, _ = run(ramp(overrides=["engine.async_scheduling=true"]))
    assert (requests["finish_reason"] == "length").all()
    offs = [(when, index) for when, index, new in trace.autoscaling.transitions if new == OFF and when > 0]
    assert offs
    for when, index in offs:
        held = requests[(requests["replica"] == index) & (requests["arrival_time"] < when)]
        assert (held["finish_time"] <= when).all()
