"""How many replicas a target rate needs, checked by simulating the cluster behind its router.

``ceil(R / capacity)`` (sim/capacity.py) holds when the traffic splits evenly, each replica a queue of
its own. A router that reads the replicas' queues (vLLM's least-loaded balancing) pools them, and a
cache-aware one changes their hit rates, so the count a real cluster needs can differ from the
estimate. This simulates the workload at the target rate on clusters of K replicas under the
workload's router (``cluster.router``), from the estimate down while K passes, or up while it fails, and
reports the fewest replicas that meet the SLO.

Each replica keeps the request count a replica had in the capacity search, so queues have as long to
build at every K (a fixed count split over more replicas would end before they do).

A disaggregated cluster (``cluster.prefill_replicas``) grows and shrinks by whole copies of itself, so the
ratio of prefill to decode replicas stays the one configured: K counts up and down in steps of its size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.run_pipeline import run_simulation
from workloads.config import WorkloadConfig

# The check gives up past this many replicas above the estimate (the estimate is then far off: say so).
MAX_EXTRA_REPLICAS = 16


@dataclass
class ReplicaCheck:
    replicas: int
    slo_attainment: float | None
    passed: bool


@dataclass
class ReplicaCount:
    router: str
    fewest_passing: int | None  # None: none up to the estimate + MAX_EXTRA_REPLICAS passed
    checks: list[ReplicaCheck] = field(default_factory=list)


def cluster_at(workload: WorkloadConfig, replicas: int, target_rate: float) -> WorkloadConfig:
    """The workload on ``replicas`` engines at ``target_rate``, each with the search's requests per engine
    (a disaggregated cluster: ``replicas`` is a multiple of its size, its pools scaled alike)."""
    cluster = workload.cluster
    per_replica = workload.workload.num_requests / cluster.num_replicas
    overrides = [f"cluster.num_replicas={replicas}", f"workload.arrival.rate={target_rate!r}",
                 f"workload.num_requests={math.ceil(per_replica * replicas)}"]
    if cluster.disaggregated:
        overrides.append(f"cluster.prefill_replicas={replicas // cluster.num_replicas * cluster.prefill_replicas}")
    return workload.with_overrides(overrides)


def count_replicas(workload: WorkloadConfig, target_rate: float, estimate: int, attainment_target: float,
                   cost_model: str | None = None, on_check=None) -> ReplicaCount:
    """The fewest replicas meeting the SLO at ``target_rate``, searched from ``estimate`` (a fixed-count
    workload: sim.capacity.with_fixed_request_count). Raises WorkloadError when the workload cannot hold
    the larger request count (a trace read sequentially has only its rows)."""
    checks: dict[int, ReplicaCheck] = {}

    def check(replicas: int) -> bool:
        summary = run_simulation(cluster_at(workload, replicas, target_rate), None, cost_model=cost_model).summary
        attainment = summary.get("slo_attainment")
        checks[replicas] = ReplicaCheck(replicas, attainment, attainment is not None and attainment >= attainment_target)
        if on_check is not None:
            on_check(checks[replicas])
        return checks[replicas].passed

    # Replicas come one at a time, or a whole disaggregated cluster at a time.
    unit = workload.cluster.num_replicas if workload.cluster.disaggregated else 1
    fewest: int | None = None
    if check(estimate):
        fewest = estimate
        while fewest > unit and check(fewest - unit):
            fewest -= unit
    else:
        for replicas in range(estimate + unit, estimate + unit * MAX_EXTRA_REPLICAS + 1, unit):
            if check(replicas):
                fewest = replicas
                break
    return ReplicaCount(workload.cluster.router, fewest, sorted(checks.values(), key=lambda c: c.replicas))

