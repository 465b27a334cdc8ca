"""The ``lora_aware`` router: adapter affinity within a load bound (sim/router.py's LoRAAwareRouter).

On a crafted two-replica cluster whose slots and queues are set by hand: a request goes to the replica holding
its adapter (on the device, else in host memory), queued adapters count as held, the bound sends it to the least
loaded replica past ``max_load_ratio``, and base-model requests go to the least loaded. On whole runs: every
decision keeps the bound, the routing is the seed's, and affinity loads fewer adapters than the routers that
ignore them.
"""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import requests_table, steps_table
from engine.core import EngineCore, Scheduler
from sim.engine_requests import make_request
from sim.engine_setup import build_setup
from sim.lora_steps import LoRASteps
from sim.replica_loads import ReplicaLoads
from sim.router import LoRAAwareRouter, adapters_held, make_router
from sim.run_pipeline import run_simulation, simulate
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from workloads import example_path, load_workload
from workloads.errors import WorkloadError

X, Y = 1, 2  # the runner's ids of adapter-0 and adapter-1


def multi_lora(*overrides):
    return load_workload(example_path("multi_lora"), overrides=["workload.num_requests=200", *overrides])


def two_adapters(*overrides):
    """Two equally popular adapters, half the requests on the base model, one slot and one host entry each."""
    return multi_lora("cluster.num_replicas=2", "cluster.router=lora_aware",
                      "workload.lora={adapters: 2, popularity: uniform, base_model_fraction: 0.5}",
                      "engine.max_loras=1", "engine.max_cpu_loras=1", *overrides)


def lora_cluster(setup):
    engines = [EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
               for _ in range(setup.workload.cluster.num_replicas)]
    for engine in engines:
        engine.executor.lora = LoRASteps(setup.lora)
    return engines


class Crafted:
    """A two-replica cluster at rest, its router, and requests of each adapter (None: the base model)."""

    def __init__(self, max_load_ratio: float = 2.0) -> None:
        setup = build_setup(two_adapters())
        self.engines = lora_cluster(setup)
        self.router = LoRAAwareRouter(max_load_ratio, ReplicaLoads(self.engines))
        self.specs = {None: [], X: [], Y: []}
        for spec in setup.requests:
            self.specs[spec.lora_int_id if spec.lora_name is not None else None].append(spec)

    def request(self, adapter):
        return make_request(self.specs[adapter].pop(), {})

    def hold(self, replica: int, adapter: int, on_device: bool = True) -> None:
        slots = self.engines[replica].executor.lora.slots
        slots.host[adapter] = 0
        if on_device:
            slots.device[adapter] = 0

    def queue(self, replica: int, num_waiting: int, adapter=None) -> None:
        """``num_waiting`` more waiting requests on ``replica`` (each adds 4 to its load score)."""
        for _ in range(num_waiting):
            self.engines[replica].add_request(self.request(adapter))

    def choose(self, adapter) -> int:
        return self.router.choose(self.request(adapter), self.engines)


def test_a_request_goes_to_the_replica_holding_its_adapter_on_the_device():
    cluster = Crafted()
    cluster.hold(1, X)
    assert cluster.choose(X) == 1
    assert cluster.choose(Y) == 0  # held nowhere: the least loaded (a tie: the lower index)


def test_the_device_comes_before_host_memory_and_host_memory_before_none():
    cluster = Crafted()
    cluster.hold(0, X, on_device=False)
    assert cluster.choose(X) == 0
    cluster.hold(1, X)
    assert cluster.choose(X) == 1
    cluster = Crafted()
    cluster.hold(1, X, on_device=False)
    cluster.queue(1, 1)  # a little busier, within the bound
    assert cluster.choose(X) == 1


def test_an_adapter_queued_on_a_replica_counts_as_held_so_a_burst_stays_together():
    cluster = Crafted()
    cluster.queue(1, 1, adapter=X)  # no slot holds X yet: its first request waits on replica 1
    assert adapters_held(cluster.engines[1])[0] == {X}
    assert cluster.choose(X) == 1


@pytest.mark.parametrize("least_waiting, holder_waiting, expected", [
    (0, 1, 1),  # scores 0 and 4: within MIN_LOAD_GAP of the lowest
    (0, 2, 0),  # 0 and 8: past max(2 x 0, 0 + 4)
    (3, 6, 1),  # 12 and 24: at 2 x 12
    (3, 7, 0),  # 12 and 28: past it
])
def test_a_holder_busier_than_the_bound_allows_is_passed_over_for_the_least_loaded(least_waiting, holder_waiting,
                                                                                    expected):
    cluster = Crafted(max_load_ratio=2.0)
    cluster.hold(1, X)
    cluster.queue(0, least_waiting)
    cluster.queue(1, holder_waiting)
    assert cluster.choose(X) == expected


def test_a_larger_ratio_keeps_the_adapter_on_a_busier_holder():
    cluster = Crafted(max_load_ratio=4.0)
    cluster.hold(1, X)
    cluster.queue(0, 3)
    cluster.queue(1, 7)
    assert cluster.choose(X) == 1


def test_base_model_requests_go_to_the_least_loaded_replica():
    cluster = Crafted()
    cluster.hold(0, X)
    cluster.queue(0, 1, adapter=X)
    assert cluster.choose(None) == 1
    cluster.queue(1, 2)
    assert cluster.choose(None) == 0


def test_an_adapter_held_nowhere_goes_to_a_free_slot_among_the_least_loaded():
    cluster = Crafted()
    cluster.hold(0, X)
    assert cluster.choose(Y) == 1  # both idle: replica 1's empty slot takes Y without evicting X


def test_every_decision_of_a_run_keeps_the_bound_and_prefers_holders():
    workload = multi_lora("cluster.num_replicas=4", "cluster.router=lora_aware", "workload.num_requests=400")
    setup = build_setup(workload)
    engines = lora_cluster(setup)
    loads = ReplicaLoads(engines)
    decisions = []

    class Watched(LoRAAwareRouter):
        def choose(self, request, replicas):
            # vLLM's score and the replicas' adapters, written out here rather than read from the router under test.
            scores = [4 * len(engine.scheduler.waiting) + len(engine.scheduler.running) for engine in replicas]
            on_device = [set(engine.executor.lora.slots.device)
                         | {queued.lora_request.lora_int_id for queue in (engine.scheduler.running, engine.scheduler.waiting)
                            for queued in queue if queued.lora_request is not None} for engine in replicas]
            index = super().choose(request, replicas)
            decisions.append((index, scores, on_device, request.lora_request))
            return index

    Simulation(engines, setup.requests, router=Watched(2.0, loads), loads=loads).run()
    to_holders = 0
    for index, scores, on_device, lora in decisions:
        limit = max(2 * min(scores), min(scores) + 4)
        assert scores[index] <= limit
        if lora is None:
            assert scores[index] == min(scores)
            continue
        holders = [i for i, held in enumerate(on_device) if lora.lora_int_id in held and scores[i] <= limit]
        if holders:
            assert index in holders and scores[index] == min(scores[i] for i in holders)
            to_holders += 1
    assert to_holders > len(decisions) // 2


def test_the_routing_is_the_seeds():
    def routing(*overrides):
        setup = build_setup(multi_lora("cluster.num_replicas=3", "cluster.router=lora_aware", *overrides))
        engines = lora_cluster(setup)
        loads = ReplicaLoads(engines)
        simulation = Simulation(engines, setup.requests, router=make_router(setup.workload, loads), loads=loads)
        simulation.run()
        return simulation.replica_of_request

    first = routing()
    assert routing() == first
    assert len(set(first.values())) == 3
    assert routing("seed=1") != first


def test_affinity_loads_each_adapter_once_where_spreading_reloads_it():
    # Two adapters, one slot per replica, a light load: lora_aware keeps each adapter on its own replica and loads
    # each once; the routers that ignore adapters send both to both replicas, which evict each other.
    loads = {}
    for router in ("round_robin", "least_loaded", "lora_aware"):
        workload = two_adapters(f"cluster.router={router}", "workload.num_requests=60", "workload.arrival.rate=1",
                                "workload.lora.base_model_fraction=0.1")
        steps = steps_table(simulate(build_setup(workload)).step_columns()).to_pandas()
        loads[router] = int(steps["num_lora_loads"].sum())
    assert loads["lora_aware"] == 2
    assert loads["round_robin"] > 10 and loads["least_loaded"] > 10


def test_on_the_example_affinity_loads_fewer_adapters_and_meets_the_slo_more_often(tmp_path):
    summaries = {}
    for router in ("round_robin", "least_loaded", "lora_aware"):
        workload = multi_lora("cluster.num_replicas=4", f"cluster.router={router}", "workload.num_requests=400")
        summaries[router] = run_simulation(workload, tmp_path / router).summary
    for summary in summaries.values():  # each replica's adapters and loads, which add up to the run's
        by_replica = summary["by_replica"]
        assert sum(stats["lora_adapter_loads"] for stats in by_replica.values()) == summary["lora"]["adapter_loads"]
    aware = summaries.pop("lora_aware")
    for other in summaries.values():
        assert aware["lora"]["adapter_loads"] < other["lora"]["adapter_loads"]
        assert aware["slo_attainment"] > other["slo_attainment"]
        # Kept by adapter, each replica serves fewer of them.
        assert (sum(stats["lora_adapters"] for stats in aware["by_replica"].values())
                < sum(stats["lora_adapters"] for stats in other["by_replica"].values()))
    from analysis.report import replica_table
    from rich.console import Console

    console = Console(record=True, width=80)
    console.print(replica_table(aware["by_replica"]))
    stats = aware["by_replica"]["0"]
    assert f"0: {stats['lora_adapters']} ({stats['lora_adapter_loads']})" in console.export_text()


def test_without_lora_it_routes_as_least_loaded():
    def routing(router):
        setup = build_setup(load_workload(example_path("chat"), overrides=[
            "workload.num_requests=120", "cluster.num_replicas=3", f"cluster.router={router}",
            "workload.arrival.rate=40"]))
        engines = [EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
                   for _ in range(3)]
        loads = ReplicaLoads(engines)
        simulation = Simulation(engines, setup.requests, router=make_router(setup.workload, loads), loads=loads)
        simulation.run()
        return simulation.replica_of_request

    assert routing("lora_aware") == routing("least_loaded")


@pytest.mark.parametrize("overrides, message", [
    (["cluster.router=least_loaded", "cluster.max_load_ratio=3"],
     r"cluster\.max_load_ratio: applies to router 'lora_aware' only, and router is 'least_loaded'.*\(got 3\.0\)"),
    (["cluster.router=lora_aware", "cluster.max_load_ratio=0.5"], r"cluster\.max_load_ratio: .*>= 1 \(got 0\.5\)|"
                                                                  r"cluster\.max_load_ratio: .*equal to 1 \(got 0\.5\)"),
    (["cluster.router=lora_aware", "cluster.max_load_ratio=.inf"], r"cluster\.max_load_ratio: .*finite"),
])
def test_a_bad_max_load_ratio_is_named(overrides, message):
    with pytest.raises(WorkloadError, match=message):
        multi_lora("cluster.num_replicas=2", *overrides)


@pytest.mark.parametrize("overrides", [[], ["cluster.stats_interval_s=0.1"]])
def test_the_same_traces_with_and_without_fast_forward(overrides):
    # The router reads the slots a fast-forward commits ahead: they must be those the ordinary steps leave.
    def run(fast_forward):
        setup = build_setup(multi_lora("cluster.num_replicas=3", "cluster.router=lora_aware", *overrides))
        engines = lora_cluster(setup)
        loads = ReplicaLoads(engines, setup.workload.cluster.stats_interval_s)
        simulation = Simulation(engines, setup.requests, router=make_router(setup.workload, loads), loads=loads,
                                fast_forward=fast_forward)
        trace = simulation.run()
        return (simulation, requests_table(trace.request_columns()).to_pandas(),
                steps_table(trace.step_columns()).to_pandas())

    (on, *tables_on), (off, *tables_off) = run(True), run(False)
    assert on.num_fast_forwarded_steps > 0 and off.num_fast_forwarded_steps == 0
    assert on.replica_of_request == off.replica_of_request
    for table_on, table_off in zip(tables_on, tables_off):
        pd.testing.assert_frame_equal(table_on, table_off, check_exact=True)
