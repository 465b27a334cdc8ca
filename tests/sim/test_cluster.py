"""A cluster of simulated replicas behind a router (cluster.num_replicas > 1).

The cluster must be exactly its replicas: a state-blind router (round-robin) gives traces equal to
each replica's sub-stream simulated alone; a state-reading one gives the same traces with and without
the decode fast-forward (which changes when the core's state is computed, not what it is); every
request is served by one replica and every block is free again at the end.
"""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import requests_table, steps_table
from engine.core import EngineCore, Scheduler
from sim.engine_setup import SetupError, build_setup
from sim.replica_loads import ReplicaLoads
from sim.router import PrefixAwareRouter, make_router
from sim.run_pipeline import run_simulation
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from tests.core.helpers import check_scheduler_invariants
from workloads import ROUTERS, example_path, load_workload
from workloads.cluster_section import LOAD_READING_ROUTERS


def chat(*overrides):
    return load_workload(example_path("chat"), overrides=["workload.num_requests=240", *overrides])


def build_cluster(setup):
    engines = [EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
               for _ in range(setup.workload.cluster.num_replicas)]
    for engine in engines[1:]:
        engine.scheduler.block_hasher = engines[0].scheduler.block_hasher
    return engines


def simulate_cluster(workload, fast_forward=True, router=None):
    """``router``: a router, a function of the run's ReplicaLoads making one, or None for the workload's."""
    setup = build_setup(workload)
    engines = build_cluster(setup)
    loads = ReplicaLoads(engines, workload.cluster.stats_interval_s)
    if router is None:
        router = make_router(workload, loads)
    elif not hasattr(router, "choose"):
        router = router(loads)
    simulation = Simulation(engines, setup.requests, router=router, loads=loads, fast_forward=fast_forward)
    trace = simulation.run()
    return simulation, engines, trace


def tables(trace):
    return (requests_table(trace.request_columns()).to_pandas(), steps_table(trace.step_columns()).to_pandas())


def test_round_robin_replicas_are_exactly_their_substreams_run_alone():
    workload = chat("cluster.num_replicas=3", "cluster.router=round_robin", "workload.arrival.rate=30",
                    "engine.num_gpu_blocks=300", "engine.max_model_len=2048")
    _, _, trace = simulate_cluster(workload)
    requests, steps = tables(trace)
    assert steps["num_preemptions"].sum() > 0  # the replicas are pressed, not idle
    setup = build_setup(workload)
    for replica in range(3):
        alone = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
        recorder = Simulation(alone, setup.requests[replica::3]).run()
        own_requests, own_steps = tables(recorder)
        cluster_requests = requests[requests["replica"] == replica].drop(columns="replica").reset_index(drop=True)
        cluster_steps = steps[steps["replica"] == replica].drop(columns="replica").reset_index(drop=True)
        pd.testing.assert_frame_equal(cluster_requests, own_requests, check_exact=True)
        pd.testing.assert_frame_equal(cluster_steps, own_steps, check_exact=True)


@pytest.mark.parametrize("router", ["least_loaded", "prefix_aware", "least_outstanding", "power_of_two"])
def test_a_state_reading_router_gives_the_same_traces_with_and_without_fast_forward(router):
    workload = chat("cluster.num_replicas=3", f"cluster.router={router}", "workload.arrival.rate=40",
                    "engine.num_gpu_blocks=400", "engine.max_model_len=2048")
    simulation_on, _, trace_on = simulate_cluster(workload, fast_forward=True)
    simulation_off, _, trace_off = simulate_cluster(workload, fast_forward=False)
    assert simulation_on.num_fast_forwarded_steps > 0 and simulation_off.num_fast_forwarded_steps == 0
    assert simulation_on.replica_of_request == simulation_off.replica_of_request
    for on, off in zip(tables(trace_on), tables(trace_off)):
        pd.testing.assert_frame_equal(on, off, check_exact=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_replicas=st.integers(2, 4), router=st.sampled_from(ROUTERS), rate=st.sampled_from([5, 40, 200]),
       num_gpu_blocks=st.sampled_from([200, 2000]), seed=st.integers(0, 3), stats=st.sampled_from([0.0, 0.05]))
def test_every_request_is_served_by_one_replica_and_every_block_comes_back(num_replicas, router, rate,
                                                                          num_gpu_blocks, seed, stats):
    stats = stats if router in LOAD_READING_ROUTERS else 0.0
    workload = chat("workload.num_requests=60", f"cluster.num_replicas={num_replicas}", f"cluster.router={router}",
                    f"workload.arrival.rate={rate}", f"engine.num_gpu_blocks={num_gpu_blocks}",
                    "engine.max_model_len=2048", f"seed={seed}", f"cluster.stats_interval_s={stats}")
    simulation, engines, trace = simulate_cluster(workload)
    requests, steps = tables(trace)
    assert sorted(requests["request_id"]) == sorted(spec.request_id for spec in simulation.requests)
    assert (requests["finish_reason"] == "length").all()
    assert set(requests["replica"]) <= set(range(num_replicas))
    assert (requests["replica"].to_numpy() == [simulation.replica_of_request[r] for r in requests["request_id"]]).all()
    assert (steps["num_scheduled_tokens"] <= workload.engine.max_num_batched_tokens).all()
    assert (steps["num_running"] <= workload.engine.max_num_seqs).all()
    for engine in engines:
        check_scheduler_invariants(engine.scheduler)
        manager = engine.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_usable_blocks
        assert not engine.has_work()


def test_least_loaded_picks_the_lowest_vllm_score_and_ties_go_to_the_lowest_index():
    workload = chat("cluster.num_replicas=3", "cluster.router=least_loaded", "workload.arrival.rate=200")
    chosen_scores = []

    class Watched:
        def __init__(self, loads):
            self.inner = make_router(workload, loads)

        def choose(self, request, replicas):
            # vLLM's score, written out here rather than read from the router under test.
            scores = [4 * len(engine.scheduler.waiting) + len(engine.scheduler.running) for engine in replicas]
            index = self.inner.choose(request, replicas)
            chosen_scores.append((index, scores))
            return index

    simulate_cluster(workload, router=lambda loads: Watched(loads))
    assert chosen_scores[0] == (0, [0, 0, 0]) and chosen_scores[1][0] == 1
    for index, scores in chosen_scores:
        assert scores[index] == min(scores) and index == scores.index(min(scores))
    assert any(min(scores) > 0 for _, scores in chosen_scores)  # the load was read, not always zero


def test_prefix_aware_sends_a_prefix_back_to_its_replica_within_the_load_gap():
    workload = load_workload(example_path("cluster_routing"),
                             overrides=["workload.num_requests=400", "sweep=null", "cluster.router=prefix_aware",
                                        "cluster.max_load_gap=4"])
    decisions = []

    class Watched(PrefixAwareRouter):
        def choose(self, request, replicas):
            scores = [4 * len(e.scheduler.waiting) + len(e.scheduler.running) for e in replicas]
            index = super().choose(request, replicas)
            hits = [engine.scheduler.kv_cache_manager.get_computed_blocks(request)[1] for engine in replicas]
            decisions.append((index, scores, hits))
            return index

    simulate_cluster(workload, router=lambda loads: Watched(4, loads))
    for index, scores, hits in decisions:
        assert scores[index] <= min(scores) + 4
        eligible = [hit for hit, score in zip(hits, scores) if score <= min(scores) + 4]
        assert hits[index] == max(eligible)
    assert sum(max(hits) > 0 for _, _, hits in decisions) > len(decisions) // 2


def test_prefix_aware_routing_finds_more_hits_than_round_robin_under_a_tight_cache(tmp_path):
    summaries = {}
    for router in ("round_robin", "prefix_aware"):
        workload = load_workload(example_path("cluster_routing"),
                                 overrides=["workload.num_requests=800", "sweep=null", f"cluster.router={router}"])
        summaries[router] = run_simulation(workload, tmp_path / router).summary
    assert summaries["prefix_aware"]["prefix_cache_hit_rate"] > summaries["round_robin"]["prefix_cache_hit_rate"] + 0.1
    assert summaries["prefix_aware"]["ttft_ms"]["p90"] < summaries["round_robin"]["ttft_ms"]["p90"]


def test_random_routing_is_seeded_and_reaches_every_replica():
    workload = chat("cluster.num_replicas=4", "cluster.router=random")
    first, _, _ = simulate_cluster(workload)
    second, _, _ = simulate_cluster(workload)
    assert first.replica_of_request == second.replica_of_request
    assert set(first.replica_of_request.values()) == {0, 1, 2, 3}
    other, _, _ = simulate_cluster(chat("cluster.num_replicas=4", "cluster.router=random", "seed=1"))
    assert other.replica_of_request != first.replica_of_request


def test_a_cluster_run_directory_says_which_replica_served_each_request(tmp_path):
    from analysis import format_summary, read_run
    from analysis.dashboard import build_dashboard

    workload = chat("cluster.num_replicas=2", "cluster.router=round_robin")
    result = run_simulation(workload, tmp_path / "run")
    run = read_run(tmp_path / "run")
    assert run.requests["replica"].tolist() == [index % 2 for index in range(240)]
    assert set(run.steps["replica"]) == {0, 1}
    by_replica = result.summary["by_replica"]
    assert [entry["num_requests"] for entry in by_replica.values()] == [120, 120]
    assert sum(entry["num_finished"] for entry in by_replica.values()) == result.summary["num_finished"]
    assert 1.0 <= result.summary["replica_load_imbalance"] < 1.2
    assert "by replica" in format_summary(result.summary)
    page = build_dashboard([tmp_path / "run"], tmp_path / "dashboard.html").read_text()
    assert 'id="replicas"' in page or "Replicas of the cluster" in page
    single = run_simulation(chat(), tmp_path / "single").summary
    assert "by_replica" not in single and "replica" not in read_run(tmp_path / "single").requests.columns


def test_a_real_run_of_a_cluster_is_refused_before_any_model_loads(capsys):
    from sim.run import main as sim_run_main

    assert sim_run_main(["chat", "--executor", "real", "--set", "cluster.num_replicas=2", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "cluster.num_replicas: 2" in error and "simulator only" in error


def test_capacity_of_a_cluster_counts_replicas_in_clusters():
    from sim.capacity import describe, find_capacity

    workload = chat("cluster.num_replicas=2", "workload.num_requests=200")
    result = find_capacity(workload, tolerance=0.1, target_rate=100)
    assert result.cluster_size == 2 and result.replicas % 2 == 0
    assert result.replicas == 2 * -(-100 // result.max_rate)
    assert f"{result.replicas // 2} cluster(s) of 2" in describe(result)


def test_the_dashboard_sums_a_clusters_replicas_at_each_step():
    from analysis.dashboard.cluster_steps import cluster_step_view

    steps = pd.DataFrame({"replica": [0, 0, 1, 1], "start_time": [0.0, 2.0, 1.0, 3.0], "duration": [1.5, 0.5, 1.0, 1.0],
                          "num_waiting": [3, 1, 5, 0], "num_running": [1, 2, 1, 1], "num_scheduled_tokens": [8, 4, 2, 1],
                          "kv_blocks_used": [10, 20, 30, 40], "kv_usage": [0.1, 0.2, 0.3, 0.4]})
    view = cluster_step_view(steps, num_replicas=4)
    assert view["start_time"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert view["num_waiting"].tolist() == [3, 8, 6, 1]
    assert view["kv_blocks_used"].tolist() == [10, 40, 50, 60]
    # Averaged over all four replicas: two were never chosen and hold nothing.
    assert view["kv_usage"].tolist() == pytest.approx([0.025, 0.1, 0.125, 0.15])
    # Only steps still running count: replica 1's first ends at 2.0, replica 0's second at 2.5.
    assert view["num_scheduled_tokens"].tolist() == [8, 10, 4, 1]
    one_engine = steps[steps["replica"] == 0]
    assert cluster_step_view(one_engine) is one_engine


def test_the_summed_view_of_a_real_cluster_run_is_what_each_replica_was_doing(tmp_path):
    import numpy as np

    from analysis import read_run
    from analysis.dashboard.cluster_steps import cluster_step_view

    run_simulation(chat("cluster.num_replicas=3", "workload.arrival.rate=40", "workload.num_requests=120"), tmp_path)
    steps = read_run(tmp_path).steps
    view = cluster_step_view(steps, num_replicas=3)
    for row in view.sample(60, random_state=0).itertuples():
        earlier = steps[steps["start_time"] <= row.start_time]
        latest = earlier.sort_values("start_time").groupby("replica").tail(1)
        running = latest[latest["start_time"] + latest["duration"] > row.start_time]
        assert row.num_running == latest["num_running"].sum()
        assert row.num_scheduled_tokens == running["num_scheduled_tokens"].sum()
        assert np.isclose(row.kv_usage, latest["kv_usage"].sum() / 3)

def test_a_recording_of_a_cluster_is_not_replayed_on_one_engine(tmp_path):
    import json
    import shutil
    from pathlib import Path

    from analysis import read_run
    from sim.replay import replay_inputs

    shipped = sorted(path for path in (Path(__file__).parents[2] / "sim/data/runs/cpu-small-float32").iterdir()
                     if (path / "summary.json").exists())[0]
    recording = tmp_path / "recording"
    shutil.copytree(shipped, recording)
    replay_inputs(read_run(recording))  # one engine: accepted
    summary = json.loads((recording / "summary.json").read_text())
    summary["config"]["workload"]["cluster"] = {"num_replicas": 2}
    (recording / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="cluster.num_replicas is 2"):
        replay_inputs(read_run(recording))


def test_replicas_the_router_never_chose_still_count(tmp_path):
    summary = run_simulation(chat("cluster.num_replicas=64", "workload.num_requests=10"), tmp_path).summary
    by_replica = summary["by_replica"]
    assert len(by_replica) == 64 and sum(entry["num_requests"] for entry in by_replica.values()) == 10
    idle = [entry for entry in by_replica.values() if entry["num_requests"] == 0]
    assert len(idle) == 54 and all(entry["busy_fraction"] == 0.0 for entry in idle)
    assert summary["replica_load_imbalance"] > 6  # ten busy replicas of 64
    with pytest.raises(Exception, match="cluster.num_replicas"):
        chat("cluster.num_replicas=100000")


def test_a_router_of_your_own_is_loaded_by_module_and_class(tmp_path):
    module = "tests.sim.custom_router_example"
    simulation, _, _ = simulate_cluster(chat("cluster.num_replicas=3", f"cluster.router={module}:EveryOtherToTheLast"))
    assert list(simulation.replica_of_request.values())[:4] == [0, 2, 0, 2]
    summary = run_simulation(chat("cluster.num_replicas=3", f"cluster.router={module}:FewestWaiting",
                                  "workload.arrival.rate=60"), tmp_path).summary
    assert summary["num_finished"] == 240 and len(summary["by_replica"]) == 3


def test_a_router_of_your_own_may_take_the_workload_by_name_and_answer_with_a_numpy_int():
    module = "tests.sim.custom_router_example"
    keyword, _, _ = simulate_cluster(chat("cluster.num_replicas=3", f"cluster.router={module}:KeywordWorkload"))
    assert set(keyword.replica_of_request.values()) == {2}
    numpy_choice, _, _ = simulate_cluster(chat("cluster.num_replicas=3", f"cluster.router={module}:NumpyArgmin"))
    assert len(set(numpy_choice.replica_of_request.values())) == 3


@pytest.mark.parametrize("router, message", [
    ("tests.sim.custom_router_example:NeedsTwo", "cannot build 'tests.sim.custom_router_example:NeedsTwo'"),
    ("tests.sim.custom_router_example:ChoosesAFloat", "chose 0.0 for request 'req-000000'"),
    ("tests.sim.custom_router_example:OutOfRange", "chose 3 for request 'req-000000'; a replica is an int in 0..2"),
    ("tests.sim.custom_router_example:NoChoose", "has no choose(request, replicas) method"),
    ("tests.sim.custom_router_example:Missing", "cannot load 'tests.sim.custom_router_example:Missing'"),
    ("no_such_module_here:Router", "cannot load 'no_such_module_here:Router': No module named"),
])
def test_a_router_of_your_own_that_cannot_route_is_named(router, message, capsys):
    from sim.run import main as sim_run_main

    assert sim_run_main(["chat", "--set", "cluster.num_replicas=3", "--set", f"cluster.router={router}",
                         "--set", "workload.num_requests=5", "--no-dashboard", "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_power_of_two_choices_takes_the_less_loaded_of_two_random_replicas():
    from sim.router import PowerOfTwoRouter
    from workloads.random_streams import Stream, random_stream

    workload = chat("cluster.num_replicas=4", "cluster.router=power_of_two", "workload.arrival.rate=200")
    draws = random_stream(workload.seed, Stream.ROUTING)  # the router's own draws, replayed here
    checked = []

    class Watched(PowerOfTwoRouter):
        def choose(self, request, replicas):
            first, second = (int(i) for i in draws.choice(len(replicas), size=2, replace=False))
            score = [4 * len(e.scheduler.waiting) + len(e.scheduler.running) for e in replicas]
            index = super().choose(request, replicas)
            checked.append(index == (second if score[second] < score[first] else first))
            return index

    simulation, _, _ = simulate_cluster(workload, router=lambda loads: Watched(workload.seed, loads))
    assert len(checked) == 240 and all(checked)
    assert set(simulation.replica_of_request.values()) == {0, 1, 2, 3}


def test_a_router_sees_the_requests_block_hashes_so_its_prefix_lookups_hit():
    hits = []

    class MostCached:
        def choose(self, request, replicas):
            cached = [engine.scheduler.kv_cache_manager.get_computed_blocks(request)[1] for engine in replicas]
            hits.append(max(cached))
            return cached.index(max(cached))

    simulate_cluster(chat("cluster.num_replicas=2", "workload.arrival.rate=5"), router=MostCached())
    assert sum(hit > 0 for hit in hits) > len(hits) // 4  # chat: half the requests share 8 system prompts


def test_traces_without_replicas_get_no_replica_table_whatever_their_config_says():
    from analysis.replica_stats import replica_stats

    requests = pd.DataFrame({"request_id": ["a"], "arrival_time": [0.0], "finish_reason": ["length"]})
    assert replica_stats(requests, pd.DataFrame({"duration": [0.1]}), {}, 1.0, num_replicas=4) is None


def test_published_loads_lag_the_replicas_by_the_interval_plus_the_routers_own_count():
    workload = chat("cluster.num_replicas=3", "workload.arrival.rate=40")
    engines = build_cluster(build_setup(workload))
    loads = ReplicaLoads(engines, stats_interval_s=0.1)
    assert loads.counts(0) == (0, 0)
    loads.routed(0)
    loads.routed(0)
    loads.routed(2)
    assert [loads.score(index) for index in range(3)] == [8, 0, 4]
    loads.publish()  # the replicas hold nothing yet: the router's own count is replaced by theirs
    assert [loads.counts(index) for index in range(3)] == [(0, 0)] * 3
    live = ReplicaLoads(engines)
    live.routed(1)  # live counts are the replicas' own, with nothing added
    assert live.counts(1) == (0, 0)


def test_with_counts_never_published_least_loaded_balances_by_its_own_count_alone():
    # Published once at t = 0 (all idle) and never again within the run: the router sees only the
    # requests it routed, so least_loaded deals them out in turn, exactly as round_robin does.
    stale, _, _ = simulate_cluster(chat("cluster.num_replicas=3", "cluster.stats_interval_s=10000"))
    in_turn, _, _ = simulate_cluster(chat("cluster.num_replicas=3", "cluster.router=round_robin"))
    assert stale.replica_of_request == in_turn.replica_of_request
    live, _, _ = simulate_cluster(chat("cluster.num_replicas=3", "workload.arrival.rate=40"))
    assert live.replica_of_request != in_turn.replica_of_request


@pytest.mark.parametrize("router", ["least_outstanding", "least_loaded", "power_of_two", "prefix_aware"])
def test_published_loads_give_the_same_traces_with_and_without_fast_forward(router):
    # A publication reads every replica's state, so a fast-forward must stop at it as at an arrival.
    workload = chat("cluster.num_replicas=3", f"cluster.router={router}", "cluster.stats_interval_s=0.1",
                    "workload.arrival.rate=40", "engine.num_gpu_blocks=400", "engine.max_model_len=2048")
    _, _, trace_on = simulate_cluster(workload, fast_forward=True)
    _, _, trace_off = simulate_cluster(workload, fast_forward=False)
    for on, off in zip(tables(trace_on), tables(trace_off)):
        pd.testing.assert_frame_equal(on, off, check_exact=True)


def test_a_stats_interval_is_the_deployments_and_leaves_routers_that_weigh_no_load_alone():
    from workloads import WorkloadError

    published, _, _ = simulate_cluster(chat("cluster.num_replicas=2", "cluster.router=round_robin",
                                            "cluster.stats_interval_s=0.1"))
    live, _, _ = simulate_cluster(chat("cluster.num_replicas=2", "cluster.router=round_robin"))
    assert published.replica_of_request == live.replica_of_request
    for value in ("1e-300", "-1"):  # a vanishing period would publish at one instant forever
        with pytest.raises(WorkloadError, match="cluster.stats_interval_s"):
            chat("cluster.num_replicas=2", f"cluster.stats_interval_s={value}")


def test_a_pool_too_large_for_the_process_is_refused_before_it_is_built():
    # The tiny model on an H100 derives ~18 million blocks per replica (~2 GB of block objects); four replicas
    # would be ~9 GB, and a run would crawl or be killed: refused with the field to set instead.
    with pytest.raises(SetupError, match=r"^cluster.num_replicas: 4 replica\(s\) of [0-9,]+ KV blocks .* past 8 GiB"):
        build_setup(chat("model=tiny", "engine.max_model_len=2048", "cluster.num_replicas=4"))
    assert build_setup(chat("model=tiny", "engine.max_model_len=2048")).cache_config.num_gpu_blocks > 10_000_000
    with pytest.raises(SetupError, match=r"^engine.num_gpu_blocks: 1 replica\(s\) of 100,000,000 KV blocks"):
        build_setup(chat("engine.num_gpu_blocks=100000000"))
