"""KV offloading in the simulator (engine.kv_offloading_size_gib; sim/kv_offload_loads.py).

Prefixes the GPU's cache lost are loaded back from host memory for exactly the link's time, the loaded tokens
are not computed again, every request still runs to its length, every block is free at the end, and the
configurations the loop cannot run are refused by field.
"""

from __future__ import annotations

import math

import pytest
import simpy

from engine.core import EngineCore, Scheduler
from sim.engine_setup import SetupError, build_setup
from sim.kv_offload_loads import HOST_LINK_EFFICIENCY, HOST_LOAD_LATENCY_S, HostLinkSetup, offload_capacity_blocks
from sim.run_pipeline import run_simulation
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from tests.sim.test_cluster import tables
from workloads import WorkloadError, example_path, load_workload

# Llama-3-8B in bfloat16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes.
LLAMA3_8B_KV_BYTES_PER_TOKEN = 131_072


def offloading(*overrides):
    return load_workload(example_path("kv_offloading"), overrides=[
        "workload.num_requests=300", "workload.arrival.rate=6", "sweep=null", *overrides])


def simulate(workload):
    setup = build_setup(workload)
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
    requests, steps = tables(Simulation(engine, setup.requests, host_link=setup.host_link).run())
    return setup, engine, requests, steps


def test_prefixes_the_gpu_lost_load_from_the_host_instead_of_being_recomputed():
    _, _, without, without_steps = simulate(offloading())
    setup, engine, requests, steps = simulate(offloading("engine.kv_offloading_size_gib=64"))
    assert setup.cache_config.num_offload_blocks == offload_capacity_blocks(64, 16 * LLAMA3_8B_KV_BYTES_PER_TOKEN)
    assert (requests["finish_reason"] == "length").all() and (without["finish_reason"] == "length").all()
    output_len = {spec.request_id: spec.output_len for spec in setup.requests}
    assert (requests["num_output_tokens"] == requests["request_id"].map(output_len)).all()
    loaded = requests["offload_loaded_tokens"]
    assert loaded.sum() > 0 and (loaded % 16 == 0).all()
    # Loaded tokens are neither recomputed nor counted as GPU hits: the prompt tokens computed fall by them.
    assert "offload_loaded_tokens" not in without.columns
    computed = steps["num_prefill_tokens"].sum()
    assert computed < without_steps["num_prefill_tokens"].sum()
    # Each loaded request's cached tokens count what it loaded (at its first admission).
    first_admission = requests["num_preemptions"] == 0
    assert (requests.loc[first_admission, "num_cached_tokens"] >= loaded[first_admission]).all()
    manager = engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks and not engine.scheduler.kv_transfers.loading
    assert 0 < len(manager.offload) <= manager.offload.capacity_blocks


def test_a_load_takes_the_links_time_and_the_request_is_scheduled_when_it_is_done():
    # A GPU cache of 800 blocks holds 6 of the 48 prefixes: most come back from the host, and at one request a
    # second each load has the link to itself.
    workload = offloading("engine.kv_offloading_size_gib=64", "engine.num_gpu_blocks=800", "workload.num_requests=60",
                          "workload.arrival.rate=1")
    setup, _, requests, _ = simulate(workload)
    loaded = requests[requests["offload_loaded_tokens"] > 0]
    assert len(loaded) > 0
    link = setup.host_link.link(simpy.Environment())
    assert setup.host_link.bandwidth_gbps == pytest.approx(64.0 * HOST_LINK_EFFICIENCY)
    assert setup.host_link.bytes_per_token == LLAMA3_8B_KV_BYTES_PER_TOKEN
    for row in loaded.itertuples():
        # Never shorter than the transfer; at this rate each load has the link to itself.
        assert row.offload_load_s == pytest.approx(link.duration(row.offload_loaded_tokens), rel=1e-9)
        assert row.first_token_time - row.arrival_time > row.offload_load_s


def test_tensor_parallel_gpus_each_load_their_own_shard():
    setup = build_setup(offloading("engine.kv_offloading_size_gib=64", "engine.tensor_parallel_size=2"))
    assert setup.host_link.bytes_per_token == LLAMA3_8B_KV_BYTES_PER_TOKEN / 2
    assert setup.host_link.link(simpy.Environment()).duration(1000) == pytest.approx(
        HOST_LOAD_LATENCY_S + 1000 * LLAMA3_8B_KV_BYTES_PER_TOKEN / 2 / (64e9 * HOST_LINK_EFFICIENCY))


def test_offloading_is_deterministic_and_writes_its_summary(tmp_path):
    first = run_simulation(offloading("engine.kv_offloading_size_gib=16"), tmp_path / "a")
    second = run_simulation(offloading("engine.kv_offloading_size_gib=16"), tmp_path / "b")
    assert (tmp_path / "a" / "requests.parquet").read_bytes() == (tmp_path / "b" / "requests.parquet").read_bytes()
    offload = first.summary["kv_offload"]
    assert offload == second.summary["kv_offload"]
    assert offload["loaded_tokens"] > 0 and 0 < offload["loaded_token_fraction"] < 1
    assert math.isfinite(offload["load_ms"]["p50"])


@pytest.mark.parametrize("override", ["engine.async_scheduling=true", "engine.pipeline_parallel_size=2"])
def test_offloading_with_batches_in_flight_loads_and_runs_every_request_to_its_length(override):
    # The batch-queue loop (async scheduling, pipeline stages) starts loads too, and sleeps while only loads
    # are pending; a request preempted with a token in flight recomputes instead of loading (the core's guard).
    setup, engine, requests, steps = simulate(offloading("engine.kv_offloading_size_gib=64", override))
    output_len = {spec.request_id: spec.output_len for spec in setup.requests}
    assert (requests["finish_reason"] == "length").all()
    assert (requests["num_output_tokens"] == requests["request_id"].map(output_len)).all()
    assert requests["offload_loaded_tokens"].sum() > 0
    manager = engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks and not engine.scheduler.kv_transfers.loading


@pytest.mark.parametrize("override, field", [
    ("hardware=cpu", "engine.kv_offloading_size_gib"),
    ("engine.kv_offloading_size_gib=0.001", "engine.kv_offloading_size_gib"),
])
def test_configurations_the_simulator_cannot_offload_in_are_refused_by_field(override, field):
    workload = offloading("engine.kv_offloading_size_gib=64", override)
    with pytest.raises(SetupError, match=field.replace(".", r"\.")):
        build_setup(workload)


def test_a_disaggregated_cluster_refuses_offloading():
    workload = offloading("engine.kv_offloading_size_gib=64", "cluster.num_replicas=2", "cluster.prefill_replicas=1")
    with pytest.raises(SetupError, match=r"engine\.kv_offloading_size_gib.*disaggregated"):
        build_setup(workload)


def test_offloading_without_prefix_caching_is_a_workload_error():
    with pytest.raises(WorkloadError, match=r"engine\.kv_offloading_size_gib.*enable_prefix_caching"):
        offloading("engine.kv_offloading_size_gib=8", "engine.enable_prefix_caching=false")


def test_a_simulation_without_the_host_link_refuses_an_engine_with_a_host_tier():
    setup = build_setup(offloading("engine.kv_offloading_size_gib=8"))
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
    with pytest.raises(ValueError, match="host_link"):
        Simulation(engine, setup.requests)
    assert HostLinkSetup(1.0, 1.0).link(simpy.Environment()).duration(0) == HOST_LOAD_LATENCY_S


def test_a_real_run_refuses_offloading(capsys):
    from sim.run import main as sim_run_main

    assert sim_run_main(["chat", "--executor", "real", "--set", "engine.kv_offloading_size_gib=8", "--no-progress"]) == 2
    assert "engine.kv_offloading_size_gib: 8 GiB is not recorded in real runs" in capsys.readouterr().err


def test_a_sweep_over_the_host_tier_size_tabulates_what_each_point_loaded(tmp_path):
    import pandas as pd

    from sim.sweep import run_sweep

    workload = load_workload(example_path("kv_offloading"), overrides=[
        "workload.num_requests=200", "sweep={engine.kv_offloading_size_gib: [0, 64]}"])
    run_sweep(workload, tmp_path)
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert table["offload_loaded_token_fraction"].isna().tolist() == [True, False]
    assert table["offload_loaded_token_fraction"].iloc[1] > 0
    # The dashboard's headline table gains the host tier's rows when a run offloads, not otherwise.
    from analysis.dashboard import assemble_dashboard, prepare_runs

    assert "prompt tokens loaded from host" in assemble_dashboard(prepare_runs([tmp_path])).html()
    assert "prompt tokens loaded from host" not in assemble_dashboard(
        prepare_runs([tmp_path / "kv_offloading_size_gib=0"])).html()
