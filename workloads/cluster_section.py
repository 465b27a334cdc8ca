"""The ``cluster`` section: identical engine replicas behind one router.

What vLLM calls data parallelism (``--data-parallel-size``: one engine core per replica, a front end that
picks the engine for each request) and Vidur calls replicas under a global scheduler. Every replica has
the whole ``engine`` section to itself: its own KV cache of ``num_gpu_blocks`` (or the memory budget of
its own ``hardware``), its own scheduler and its own prefix cache. Arrival rates stay the rate into the
whole cluster.

Routers (each sees the replicas' scheduler state at the moment the request arrives; the waiting and
running counts live, or as last published every ``stats_interval_s`` plus the router's own routing since,
as vLLM's data-parallel front end sees them: sim/replica_loads.py):
- ``round_robin``: replica 0, 1, ..., n-1, 0, ... in arrival order.
- ``random``: uniform, from the workload's seed (its own stream, so the requests do not change).
- ``least_outstanding``: fewest unfinished requests (Vidur's ``lor``).
- ``least_loaded``: vLLM's data-parallel balancing, the lowest ``4 * waiting + running``; ties go to
  the lowest replica index. The default, as in vLLM.
- ``power_of_two``: the lower ``least_loaded`` score of two replicas drawn at random (the "power of
  two choices": nearly least-loaded balance from two reads, what vLLM notes for large data-parallel
  sizes and what Envoy-style balancers do).
- ``prefix_aware``: the replica whose prefix cache holds the longest prefix of the prompt, among those
  whose ``least_loaded`` score is within ``max_load_gap`` of the lowest (ties: the lower score, then the
  lower index). A cache-aware router in the manner of SGLang's and llm-d's: it trades balance for hits.
  Without prefix caching it finds no hits and is ``least_loaded``.
- ``lora_aware``: adapter affinity, as dLoRA, S-LoRA's cluster mode, Chameleon and vLLM production-stack's
  LoRA routing do: a request of adapter X goes to the least loaded replica that has X on the device (in a
  slot, or named by one of its running or waiting requests), else to the least loaded that has X in host
  memory, else to the least loaded replica (whose slots then load X). A holder qualifies only while its
  ``least_loaded`` score is at most ``max_load_ratio`` times the lowest (or within 4, one waiting request, of
  it): past that a hot adapter spills to the least loaded replica. Base-model requests, and every request of
  a workload without LoRA, go to the least loaded replica: there it is ``least_loaded`` (allowed, so that a
  sweep over routers runs on any workload).

With one replica every router sends everything to it: a sweep over routers needs ``num_replicas`` > 1.

Disaggregated prefill and decode (``prefill_replicas`` > 0): the first ``prefill_replicas`` replicas only
prefill, the others only decode, as in vLLM's disaggregated serving (a proxy in front of prefill and decode
engines whose KV a connector such as NIXL moves). The router picks a prefill replica for each arriving request, which computes the
prompt and one token; the router then picks a decode replica among the decode replicas, which allocates
blocks for the prompt, loads its KV over the two replicas' links (``kv_transfer_bandwidth_gbps``,
``kv_transfer_latency_s``: each link moves one load at a time, first come first served) and decodes; the
prefill replica keeps the blocks until they are read. Each pool's router is its own instance of the
workload's router over that pool's replicas (a router of your own is built twice, and sees its pool). The user sees the decode replica's tokens: the first comes from its
first step after the load (sim/disaggregation.py).

Autoscaling (``autoscaling``, workloads/autoscaling_section.py): replicas started and drained with the load,
``num_replicas`` the most that may run; the router chooses among the ready ones.

Your own router: ``router: "my_module:MyRouter"`` imports ``MyRouter`` from ``my_module`` (found on
Python's path: the directory you run from is on it), a class with ``choose(request, replicas) -> int``
that reads the replicas (``engine.core.EngineCore``: their schedulers, queues and KV caches) without
changing them (sim/router.py defines the protocol and the built-in routers).
"""

from __future__ import annotations

import re

from pydantic import Field, PositiveInt, field_validator, model_validator

from workloads.autoscaling_section import AutoscalingSection
from workloads.errors import problems_error
from workloads.schema_base import SchemaModel

DEFAULT_MAX_LOAD_GAP = 4
DEFAULT_MAX_LOAD_RATIO = 2.0
MIN_STATS_INTERVAL_S = 1e-3
MAX_REPLICAS = 256
ROUTERS = ("round_robin", "random", "least_outstanding", "least_loaded", "power_of_two", "prefix_aware", "lora_aware")
LOAD_READING_ROUTERS = ("least_outstanding", "least_loaded", "power_of_two", "prefix_aware", "lora_aware")
# A router of the user's own: "package.module:ClassName".
CUSTOM_ROUTER_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


class ClusterSection(SchemaModel):
    # Each replica is a whole engine in this process (its block pool alone is megabytes): a cap that
    # keeps a typo from exhausting memory, far above the data-parallel sizes vLLM deployments use.
    num_replicas: PositiveInt = Field(default=1, le=MAX_REPLICAS)
    # One of ROUTERS, or "module:Class" for a router of your own (imported by the simulator).
    router: str = "least_loaded"
    # prefix_aware only (null: DEFAULT_MAX_LOAD_GAP). In units of least_loaded's score: 4 is one more
    # waiting request, or four more running ones.
    max_load_gap: int | None = Field(default=None, ge=0)
    # lora_aware only (null: DEFAULT_MAX_LOAD_RATIO): how much busier than the least loaded replica (by
    # least_loaded's score) a replica holding the request's adapter may be and still get it. 1 keeps the
    # balance of least_loaded beyond one waiting request; larger keeps each adapter on fewer replicas.
    max_load_ratio: float | None = Field(default=None, ge=1, allow_inf_nan=False)
    # How often the replicas' waiting and running counts reach the router (sim/replica_loads.py): 0 reads
    # them live; vLLM's data-parallel front end gets them every 0.1 s and counts its own routing between.
    # A property of the deployment, not of one router: the routers that weigh load (LOAD_READING_ROUTERS)
    # read it, the others route as they do without it, so a sweep over routers compares them under it.
    stats_interval_s: float = Field(default=0.0, ge=0)
    # Disaggregated prefill and decode: how many of the replicas prefill (0: none; every replica does both).
    prefill_replicas: int = Field(default=0, ge=0)
    # The link a decode replica loads KV over, one way, per GPU (GB/s; 50: one 400 Gb/s RDMA NIC per GPU,
    # as GPU servers are built; at tensor parallelism each GPU moves its shard over its own), and the fixed
    # cost of one transfer (a request's whole prompt moves as one read). Assumed figures, not measured.
    # Bounded so that a load's time stays a finite number of seconds (1e-320 GB/s made it inf: the run jumped
    # to t = inf and reported every request finished, with no latency).
    kv_transfer_bandwidth_gbps: float = Field(default=50.0, ge=1e-3)
    kv_transfer_latency_s: float = Field(default=1e-4, ge=0, le=3600)
    # Replicas started and stopped with the load (workloads/autoscaling_section.py); num_replicas is then
    # the most that may run. null: all num_replicas serve from start to end.
    autoscaling: AutoscalingSection | None = None

    @field_validator("router")
    @classmethod
    def _known_or_importable(cls, value: str) -> str:
        if value not in ROUTERS and not CUSTOM_ROUTER_PATTERN.fullmatch(value):
            raise ValueError(f"must be one of {', '.join(ROUTERS)}, or 'module:Class' naming a router of your own")
        return value

    @property
    def is_custom_router(self) -> bool:
        return self.router not in ROUTERS

    @model_validator(mode="after")
    def _load_bounds_only_for_their_routers(self) -> ClusterSection:
        # A setting that the chosen router never reads would silently do nothing.
        if self.max_load_gap is not None and self.router != "prefix_aware":
            raise problems_error([("max_load_gap", f"applies to router 'prefix_aware' only, and router is "
                                   f"{self.router!r} (beside other routers in a sweep, sweep the whole section: "
                                   "sweep={cluster: [{router: least_loaded}, {router: prefix_aware, max_load_gap: 8}]})",
                                   self.max_load_gap)])
        if self.max_load_ratio is not None and self.router != "lora_aware":
            raise problems_error([("max_load_ratio", f"applies to router 'lora_aware' only, and router is "
                                   f"{self.router!r} (beside other routers in a sweep, sweep the whole section: "
                                   "sweep={cluster: [{router: least_loaded}, {router: lora_aware, max_load_ratio: 4}]})",
                                   self.max_load_ratio)])
        return self

    @model_validator(mode="after")
    def _both_roles_present(self) -> ClusterSection:
        if self.prefill_replicas and self.prefill_replicas >= self.num_replicas:
            raise problems_error([("prefill_replicas", f"must leave at least one decode replica, and "
                                   f"cluster.num_replicas is {self.num_replicas} (set cluster.num_replicas to at least "
                                   f"{self.prefill_replicas + 1}, or fewer prefill replicas)", self.prefill_replicas)])
        return self

    @model_validator(mode="after")
    def _autoscaling_within_the_cluster(self) -> ClusterSection:
        scaling = self.autoscaling
        if scaling is None:
            return self
        problems = []
        if self.num_replicas == 1:
            problems.append(("num_replicas", "must be more than 1 with autoscaling: it is the most replicas the "
                             "autoscaler may run", self.num_replicas))
        if self.prefill_replicas:
            problems.append(("autoscaling", "is simulated for clusters whose replicas prefill and decode, and "
                             f"cluster.prefill_replicas is {self.prefill_replicas} (set it to 0, or drop autoscaling)",
                             "(set)"))
        for name in ("min_replicas", "initial_replicas"):
            value = getattr(scaling, name)
            if value is not None and value > self.num_replicas:
                problems.append((f"autoscaling.{name}", f"must be at most cluster.num_replicas ({self.num_replicas}), "
                                 "the most replicas the autoscaler may run", value))
        if problems:
            raise problems_error(problems)
        return self

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    @field_validator("stats_interval_s")
    @classmethod
    def _interval_is_a_real_period(cls, value: float) -> float:
        # A vanishing period would publish again at the same instant forever (now + interval == now).
        if 0 < value < MIN_STATS_INTERVAL_S:
            raise ValueError(f"must be 0 (live counts) or at least {MIN_STATS_INTERVAL_S:g} s")
        return value

    @property
    def prefix_aware_max_load_gap(self) -> int:
        return DEFAULT_MAX_LOAD_GAP if self.max_load_gap is None else self.max_load_gap

    @property
    def lora_aware_max_load_ratio(self) -> float:
        return DEFAULT_MAX_LOAD_RATIO if self.max_load_ratio is None else self.max_load_ratio
