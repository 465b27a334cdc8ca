"""Routers: which replica of a cluster serves an arriving request (workloads/cluster_section.py).

A router reads the replicas' own scheduler state at the moment the request arrives: the prefix cache, the
LoRA adapters they hold (``adapters_held``), and the waiting and running counts (``ReplicaLoads``: live, as the step in progress will leave them, or
as last published, vLLM-style; the simulator runs a step's scheduling and bookkeeping when the step
starts, see sim/simulator.py). It changes nothing: the prefix lookup is
``KVCacheManager.get_computed_blocks``, which only reads.

Every router is deterministic given the workload: ``random`` draws from the workload seed's own stream.
"""

from __future__ import annotations

import importlib
import inspect
import operator
from collections.abc import Sequence
from typing import Protocol

from engine.core import EngineCore, Request
from sim.replica_loads import ReplicaLoads
from workloads import WorkloadConfig
from workloads.random_streams import Stream, random_stream


class Router(Protocol):
    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        """The index of the replica that gets ``request``. With prefix caching on, the request's block
        hashes are computed already (``checked_choice``), so ``get_computed_blocks`` finds its hits."""


def lowest(scores: Sequence[int]) -> int:
    """The index of the lowest score; ties go to the lowest index."""
    return min(range(len(scores)), key=scores.__getitem__)


class RoundRobinRouter:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        # Modulo the count now: an autoscaled cluster's replicas to choose among change in number.
        index = self._next % len(replicas)
        self._next = (index + 1) % len(replicas)
        return index


class RandomRouter:
    def __init__(self, seed: int, stream: Stream = Stream.ROUTING) -> None:
        self._rng = random_stream(seed, stream)

    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        return int(self._rng.integers(len(replicas)))


class LeastOutstandingRouter:
    def __init__(self, loads: ReplicaLoads) -> None:
        self.loads = loads

    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        return lowest([self.loads.outstanding(index) for index in range(len(replicas))])


class LeastLoadedRouter:
    def __init__(self, loads: ReplicaLoads) -> None:
        self.loads = loads

    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        return lowest([self.loads.score(index) for index in range(len(replicas))])


class PowerOfTwoRouter:
    """Two distinct replicas drawn at random (the workload seed's ROUTING stream); the lower
    load score of the two, the first drawn on a tie."""

    def __init__(self, seed: int, loads: ReplicaLoads, stream: Stream = Stream.ROUTING) -> None:
        self._rng = random_stream(seed, stream)
        self.loads = loads

    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        if len(replicas) == 1:  # a disaggregated cluster's pool of one
            return 0
        first, second = (int(index) for index in self._rng.choice(len(replicas), size=2, replace=False))
        return second if self.loads.score(second) < self.loads.score(first) else first


class PrefixAwareRouter:
    """The longest cached prefix among the replicas within ``max_load_gap`` of the least loaded one.

    Invariant: the chosen replica's load score is at most the lowest score plus ``max_load_gap``, so a
    popular prefix cannot pile its requests onto one replica past that gap.
    """

    def __init__(self, max_load_gap: int, loads: ReplicaLoads) -> None:
        self.max_load_gap = max_load_gap
        self.loads = loads

    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        scores = [self.loads.score(index) for index in range(len(replicas))]
        limit = min(scores) + self.max_load_gap
        best_index, best_key = 0, None
        for index, engine in enumerate(replicas):
            if scores[index] > limit:
                continue
            _, num_cached_tokens = engine.scheduler.kv_cache_manager.get_computed_blocks(request)
            key = (-num_cached_tokens, scores[index])
            if best_key is None or key < best_key:
                best_index, best_key = index, key
        return best_index


def adapters_held(engine: EngineCore) -> tuple[set[int], set[int]]:
    """(on the device or about to be, in host memory) of ``engine``'s LoRA adapters, by the runner's id.

    "About to be": the adapters of its running and waiting requests, which its next steps load if they are
    not in a slot already. A real router learns the same from the engines' metrics: vLLM exports each engine's running and
    waiting adapters (``vllm:lora_requests_info``), and a LoRA-aware router (vLLM production-stack's, or
    dLoRA's and Chameleon's schedulers) tracks what it routed where. The simulator reads the simulated
    executor's slots directly (sim/lora_steps.py), live even when the load counts are published.
    """
    lora = getattr(engine.executor, "lora", None)
    if lora is None:
        return set(), set()
    device = set(lora.slots.device)
    scheduler = engine.scheduler
    for queue in (scheduler.running, scheduler.waiting):
        for queued in queue:
            if queued.lora_request is not None:
                device.add(queued.lora_request.lora_int_id)
    return device, set(lora.slots.host)


class LoRAAwareRouter:
    """Adapter affinity: a request of adapter X goes to the least loaded replica that holds X on the device
    (``adapters_held``), else to the least loaded that holds it in host memory, else to the least loaded
    replica (whose slots then load it); base-model requests go to the least loaded replica.

    A holder qualifies only while its load score is at most ``max_load_ratio`` times the lowest score, or
    within ``MIN_LOAD_GAP`` of it (at low load a ratio of small counts means little): past that, a hot adapter
    spills over to the least loaded replica, which then holds it too. Invariant: the chosen replica's score
    is at most max(``max_load_ratio`` x the lowest, the lowest + ``MIN_LOAD_GAP``). Without LoRA (no
    replica has slots, or the request has no adapter) it is ``least_loaded``.

    A request of an adapter no replica holds goes to the least loaded replica, and the next request of it
    then finds it there, queued (``adapters_held``), even at the same instant: a burst of one new adapter
    stays on one replica until that replica passes the bound, rather than loading the adapter everywhere.
    """

    # One waiting request (vLLM's score weighs it as four running).
    MIN_LOAD_GAP = 4

    def __init__(self, max_load_ratio: float, loads: ReplicaLoads) -> None:
        self.max_load_ratio = max_load_ratio
        self.loads = loads

    def choose(self, request: Request, replicas: Sequence[EngineCore]) -> int:
        scores = [self.loads.score(index) for index in range(len(replicas))]
        least_loaded = lowest(scores)
        if request.lora_request is None:
            return least_loaded
        adapter = request.lora_request.lora_int_id
        limit = max(self.max_load_ratio * scores[least_loaded], scores[least_loaded] + self.MIN_LOAD_GAP)
        held = [adapters_held(engine) for engine in replicas]
        for tier in (0, 1):  # the device, then host memory
            holders = [index for index in range(len(replicas)) if adapter in held[index][tier] and scores[index] <= limit]
            if holders:
                return min(holders, key=scores.__getitem__)
        # No holder: the least loaded, and of those tied (idle replicas, at a light load) the one with the fewest
        # adapters on its device, whose free slot takes the adapter without evicting another's.
        return min(range(len(replicas)), key=lambda index: (scores[index], len(held[index][0])))


class RouterError(ValueError):
    """A router of the user's own that cannot be loaded, or that chose no replica of the cluster."""


def load_custom_router(workload: WorkloadConfig) -> Router:
    """``cluster.router: "module:Class"``: the class, built with the workload when its constructor takes
    an argument (for its seed or settings), else with none."""
    name = workload.cluster.router
    module_name, class_name = name.split(":")
    try:
        router_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise RouterError(f"cluster.router: cannot load {name!r}: {error}") from None
    if not callable(getattr(router_class, "choose", None)):
        raise RouterError(f"cluster.router: {name!r} has no choose(request, replicas) method")
    try:
        parameters = inspect.signature(router_class).parameters
    except (TypeError, ValueError):  # a builtin or extension type: build it without arguments
        parameters = {}
    required = [parameter for parameter in parameters.values() if parameter.default is parameter.empty
                and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]
    try:
        if "workload" in parameters:
            return router_class(workload=workload)
        return router_class(workload) if required else router_class()
    except TypeError as error:
        raise RouterError(f"cluster.router: cannot build {name!r} (it is given the workload, as `workload`, or "
                          f"nothing): {error}") from None


def checked_choice(router: Router, request: Request, replicas: Sequence[EngineCore], loads: ReplicaLoads) -> int:
    """The router's choice, refused by name when it is not a replica of the cluster, and counted in the
    loads the router reads until the replicas next publish theirs."""
    # The replicas share one block hasher (sim/run_pipeline.py), so the hashes computed here for the
    # router's lookups are the ones the chosen replica's scheduler keeps, not computed again.
    hasher = replicas[0].scheduler.block_hasher
    if hasher is not None and request.block_hasher is not hasher:
        request.set_block_hasher(hasher)
    choice = router.choose(request, replicas)
    try:  # any integer type (a numpy argmin too), but not a bool or a float
        index = None if isinstance(choice, bool) else operator.index(choice)
    except TypeError:
        index = None
    if index is None or not 0 <= index < len(replicas):
        raise RouterError(f"cluster.router {type(router).__name__} chose {choice!r} for request {request.request_id!r}; "
                          f"a replica is an int in 0..{len(replicas) - 1}")
    loads.routed(index)
    return index


def make_router(workload: WorkloadConfig, loads: ReplicaLoads, stream: Stream = Stream.ROUTING) -> Router:
    """The workload's router; the built-in ones that weigh load read it from ``loads``, those that draw
    draw from ``stream`` (a disaggregated cluster has a second router, for its decode replicas)."""
    cluster = workload.cluster
    if cluster.is_custom_router:
        return load_custom_router(workload)
    if cluster.router == "round_robin":
        return RoundRobinRouter()
    if cluster.router == "random":
        return RandomRouter(workload.seed, stream)
    if cluster.router == "least_outstanding":
        return LeastOutstandingRouter(loads)
    if cluster.router == "least_loaded":
        return LeastLoadedRouter(loads)
    if cluster.router == "power_of_two":
        return PowerOfTwoRouter(workload.seed, loads, stream)
    if cluster.router == "prefix_aware":
        return PrefixAwareRouter(cluster.prefix_aware_max_load_gap, loads)
    if cluster.router == "lora_aware":
        return LoRAAwareRouter(cluster.lora_aware_max_load_ratio, loads)
    raise ValueError(f"cluster.router: unknown router {cluster.router!r}")
