"""Disaggregated prefill and decode in the simulator (cluster.prefill_replicas > 0, sim/disaggregation.py).

Every request runs its prompt on a prefill replica and its decode on a decode replica, once each; its KV
moves in between on the decode replica's link, one load at a time, for exactly the link's time; the
prefill replica holds the blocks until then; every block of every replica is free at the end.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import compute_summary
from sim.engine_setup import build_setup
from sim.run_pipeline import disaggregation_setup, run_simulation
from sim.simulator import Simulation
from tests.core.helpers import check_scheduler_invariants
from tests.sim.test_cluster import build_cluster, chat, tables
from workloads import ROUTERS, WorkloadError
from workloads.cluster_section import LOAD_READING_ROUTERS

# Llama-3-8B in bfloat16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes.
LLAMA3_8B_KV_BYTES_PER_TOKEN = 131_072


def simulate_disaggregated(workload):
    setup = build_setup(workload)
    engines = build_cluster(setup)
    simulation = Simulation(engines, setup.requests, disaggregation=disaggregation_setup(setup, engines))
    return simulation, engines, tables(simulation.run())


def pd_chat(*overrides):
    return chat("cluster.num_replicas=3", "cluster.prefill_replicas=1", "workload.arrival.rate=20",
                "workload.num_requests=120", *overrides)


def test_each_request_prefills_on_a_prefill_replica_then_decodes_on_a_decode_replica():
    simulation, engines, (requests, steps) = simulate_disaggregated(pd_chat())
    assert sorted(requests["request_id"]) == sorted(spec.request_id for spec in simulation.requests)
    assert (requests["finish_reason"] == "length").all()
    output_len = {spec.request_id: spec.output_len for spec in simulation.requests}
    assert (requests["num_output_tokens"] == requests["request_id"].map(output_len)).all()
    assert set(requests["prefill_replica"]) == {0} and set(requests["replica"]) == {1, 2}
    # Time runs forward through the parts of TTFT.
    order = requests[["arrival_time", "prefill_end_time", "kv_load_start_time", "kv_load_end_time",
                      "first_token_time"]].to_numpy()
    assert (np.diff(order, axis=1) >= 0).all()
    assert (requests["scheduled_time"] <= requests["prefill_end_time"]).all()
    # The prefill replica computes each prompt past its prefix-cache hit, once, and never decodes; a decode
    # replica computes each loaded prompt's last token (a one-token query, timed as a decode) and the rest
    # of the output, and no prompt chunk.
    prefill_steps, decode_steps = steps[steps["replica"] == 0], steps[steps["replica"] > 0]
    assert steps["num_preemptions"].sum() == 0
    assert prefill_steps["num_scheduled_tokens"].sum() == (requests["num_prompt_tokens"]
                                                           - requests["num_cached_tokens"]).sum()
    assert decode_steps["num_scheduled_tokens"].sum() == requests["num_output_tokens"].sum()
    assert decode_steps["num_prefill_tokens"].sum() == 0
    for engine in engines:
        check_scheduler_invariants(engine.scheduler)
        manager = engine.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_usable_blocks
        assert not engine.scheduler.has_kv_transfers_in_flight()


def test_a_load_takes_the_links_latency_plus_its_bytes_over_its_bandwidth_one_at_a_time():
    workload = pd_chat("cluster.kv_transfer_bandwidth_gbps=2", "cluster.kv_transfer_latency_s=0.003",
                       "workload.arrival.rate=40")
    _, _, (requests, _) = simulate_disaggregated(workload)
    duration = requests["kv_load_end_time"] - requests["kv_load_start_time"]
    expected = 0.003 + requests["kv_load_tokens"] * LLAMA3_8B_KV_BYTES_PER_TOKEN / 2e9
    assert np.allclose(duration, expected, rtol=1e-9, atol=1e-12)
    # A local prefix hit on the decode replica is not loaded again.
    assert (requests["kv_load_tokens"] <= requests["num_prompt_tokens"]).all()
    assert (requests["kv_load_tokens"] < requests["num_prompt_tokens"]).any()
    # Each link, the receiving decode replica's and the sending prefill replica's, moves one load at a time.
    for column in ("replica", "prefill_replica"):
        for _, on_link in requests.groupby(column):
            spans = on_link.sort_values("kv_load_start_time")[["kv_load_start_time", "kv_load_end_time"]].to_numpy()
            assert (spans[1:, 0] >= spans[:-1, 1] - 1e-12).all(), f"two loads shared a {column}'s link at once"
    # A slow link queues loads: some wait for the link, not for the decode replica's blocks.
    assert ((requests["kv_load_start_time"] - requests["prefill_end_time"]) > 0.05).any()


def test_a_faster_link_gives_a_shorter_time_to_first_token():
    slow = run_simulation(pd_chat("cluster.kv_transfer_bandwidth_gbps=1"), None).summary
    fast = run_simulation(pd_chat("cluster.kv_transfer_bandwidth_gbps=400"), None).summary
    assert fast["disaggregation"]["kv_load_ms"]["p50"] < slow["disaggregation"]["kv_load_ms"]["p50"] / 50
    assert fast["ttft_ms"]["p90"] < slow["ttft_ms"]["p90"]


def test_the_summary_splits_ttft_into_its_parts_and_names_each_replicas_role():
    summary = run_simulation(pd_chat(), None).summary
    parts = summary["disaggregation"]
    assert parts["num_kv_loads"] == 120
    total = sum(parts[key]["mean"] for key in ("prefill_ms", "kv_wait_ms", "kv_load_ms", "first_token_ms"))
    assert total == pytest.approx(summary["ttft_ms"]["mean"], rel=1e-9)
    assert [summary["by_replica"][str(index)]["role"] for index in range(3)] == ["prefill", "decode", "decode"]
    assert summary["by_replica"]["0"]["num_requests"] == 120


def test_a_prompt_no_replica_can_hold_ends_at_its_prefill_replica_with_a_row_of_its_own():
    workload = pd_chat("engine.num_gpu_blocks=40", "engine.max_model_len=4096")
    simulation, engines, (requests, _) = simulate_disaggregated(workload)
    ignored = requests[requests["finish_reason"] == "ignored"]
    assert len(ignored) > 0 and (ignored["replica"] == 0).all() and ignored["kv_load_end_time"].isna().all()
    assert len(requests) == len(simulation.requests)
    for engine in engines:
        manager = engine.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_usable_blocks


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_replicas=st.integers(2, 4), router=st.sampled_from(ROUTERS), rate=st.sampled_from([5, 40, 200]),
       num_gpu_blocks=st.sampled_from([160, 2000]), bandwidth=st.sampled_from([0.5, 50.0]), seed=st.integers(0, 3),
       stats=st.sampled_from([0.0, 0.05]), data=st.data())
def test_every_request_is_served_once_and_every_block_comes_back(num_replicas, router, rate, num_gpu_blocks,
                                                                 bandwidth, seed, stats, data):
    prefill = data.draw(st.integers(1, num_replicas - 1))
    stats = stats if router in LOAD_READING_ROUTERS else 0.0
    workload = chat("workload.num_requests=40", f"cluster.num_replicas={num_replicas}", f"cluster.router={router}",
                    f"cluster.prefill_replicas={prefill}", f"workload.arrival.rate={rate}",
                    f"engine.num_gpu_blocks={num_gpu_blocks}", "engine.max_model_len=2048", f"seed={seed}",
                    f"cluster.kv_transfer_bandwidth_gbps={bandwidth}", f"cluster.stats_interval_s={stats}")
    simulation, engines, (requests, steps) = simulate_disaggregated(workload)
    assert sorted(requests["request_id"]) == sorted(spec.request_id for spec in simulation.requests)
    assert requests["finish_reason"].isin(["length", "ignored"]).all()
    served = requests[requests["finish_reason"] == "length"]
    assert (served["replica"] >= prefill).all() and (served["prefill_replica"] < prefill).all()
    assert (steps["num_scheduled_tokens"] <= workload.engine.max_num_batched_tokens).all()
    for engine in engines:
        check_scheduler_invariants(engine.scheduler)
        manager = engine.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_usable_blocks
        assert not engine.has_work() and not engine.scheduler.has_kv_transfers_in_flight()
    summary = compute_summary(requests, steps, name="pd", mode="sim", config={})
    assert summary["num_finished"] == len(requests)


@pytest.mark.parametrize("overrides, field", [
    (["cluster.num_replicas=2", "cluster.prefill_replicas=2"], "cluster.prefill_replicas"),
    (["cluster.prefill_replicas=1"], "cluster.prefill_replicas"),
    (["cluster.num_replicas=2", "cluster.prefill_replicas=1", "cluster.kv_transfer_bandwidth_gbps=0"],
     "cluster.kv_transfer_bandwidth_gbps"),
    (["cluster.num_replicas=2", "cluster.prefill_replicas=1", "cluster.kv_transfer_bandwidth_gbps=1e-320"],
     "cluster.kv_transfer_bandwidth_gbps"),
    (["cluster.num_replicas=2", "cluster.prefill_replicas=1", "cluster.kv_transfer_latency_s=1e308"],
     "cluster.kv_transfer_latency_s"),
])
def test_an_impossible_disaggregation_is_refused_by_field(overrides, field):
    with pytest.raises(WorkloadError, match=field.replace(".", r"\.")):
        chat(*overrides)


def test_the_dashboard_stacks_the_parts_of_ttft_beside_a_colocated_run(tmp_path):
    from analysis.dashboard.build import assemble_dashboard
    from analysis.dashboard.run_inputs import expand_inputs, label_runs

    run_simulation(pd_chat(), tmp_path / "pd")
    run_simulation(pd_chat("cluster.prefill_replicas=0"), tmp_path / "colocated")
    runs = label_runs(expand_inputs([tmp_path / "pd", tmp_path / "colocated"]))
    dashboard = assemble_dashboard(runs)
    section = next(section for section in dashboard.sections if section.section_id == "disaggregation")
    figure = section.items[0].figure
    parts = {trace.name: trace.x for trace in figure.data}
    pd_summary, colocated_summary = runs[0].summary, runs[1].summary
    stacked = sum(values[0] for name, values in parts.items() if values[0] is not None)
    assert stacked == pytest.approx(pd_summary["ttft_ms"]["mean"], rel=1e-9)
    assert [values[1] for values in parts.values()] == [None] * 4 + [colocated_summary["ttft_ms"]["mean"]]
    # Without a disaggregated run the section is absent.
    assert all(section.section_id != "disaggregation" for section in assemble_dashboard(runs[1:]).sections)


def test_a_routed_capacity_check_grows_a_disaggregated_cluster_by_whole_copies():
    from sim.replica_count import cluster_at, count_replicas

    workload = pd_chat("workload.num_requests=60")
    doubled = cluster_at(workload, 6, 40.0)
    assert (doubled.cluster.num_replicas, doubled.cluster.prefill_replicas) == (6, 2)
    assert doubled.workload.num_requests == 120
    count = count_replicas(workload, 40.0, estimate=3, attainment_target=0.9)
    assert {check.replicas for check in count.checks} <= {3, 6, 9, 12}
    assert count.fewest_passing is None or count.fewest_passing % 3 == 0


def test_a_real_run_of_a_disaggregated_cluster_is_refused_naming_prefill_replicas(capsys):
    from sim.run import main as sim_run_main

    assert sim_run_main(["chat", "--executor", "real", "--set", "cluster.num_replicas=2", "--set",
                         "cluster.prefill_replicas=1", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "cluster.prefill_replicas: 1" in error and "no KV connector" in error
    assert "cluster.prefill_replicas=0" in error


def test_the_capacity_answer_names_the_pools_of_the_replicas_it_counts():
    from sim.capacity import CapacityResult
    from sim.capacity_report import describe
    from sim.replica_count import ReplicaCheck, ReplicaCount

    result = CapacityResult("pd", {}, 0.9, 80.0, 82.5, target_rate=150.0, replicas=6, cluster_size=3,
                            prefill_replicas=1)
    result.replica_count = ReplicaCount("least_loaded", 6, [ReplicaCheck(3, 0.25, False), ReplicaCheck(6, 0.95, True)])
    assert "6 replica(s) (2 prefill + 4 decode) meet it" in describe(result)


def test_a_sweeps_table_carries_the_parts_of_ttft_when_a_point_is_disaggregated(tmp_path):
    from sim.sweep import SweepPointResult, write_sweep_table

    disaggregated = run_simulation(pd_chat(), None).summary
    colocated = run_simulation(pd_chat("cluster.prefill_replicas=0"), None).summary
    table = write_sweep_table([SweepPointResult("pd", disaggregated, tmp_path / "pd"),
                               SweepPointResult("colocated", colocated, tmp_path / "colocated")], tmp_path / "sweep.csv")
    assert table.loc[0, "kv_load_ms_mean"] == pytest.approx(disaggregated["disaggregation"]["kv_load_ms"]["mean"])
    assert table[["prefill_ms_mean", "kv_wait_ms_mean", "kv_load_ms_mean", "first_token_ms_mean"]].iloc[0].sum() \
        == pytest.approx(disaggregated["ttft_ms"]["mean"])
    assert table.loc[1, ["prefill_ms_mean", "kv_load_ms_p90"]].isna().all()
    # A sweep of colocated points only keeps its columns.
    plain = write_sweep_table([SweepPointResult("colocated", colocated, tmp_path / "c")], tmp_path / "plain.csv")
    assert "kv_load_ms_mean" not in plain.columns
