"""The ``cluster`` section: identical engine replicas behind one router.

What vLLM calls data parallelism (``--data-parallel-size``: one engine core per replica, a front end that
picks the engine for each request) and Vidur calls replicas under a global scheduler. Every replica has
the whole ``engine`` section to itself: its own KV cache of ``num_gpu_blocks`` (or the memory budget of
its own ``hardware``), its own scheduler and its own prefix cache. Arrival rates stay the rate into the
whole cluster.

Routers (each sees the replicas' scheduler state at the moment the request arrives):
- ``round_robin``: replica 0, 1, ..., n-1, 0, ... in arrival order.
- ``random``: uniform, from the workload's seed (its own stream, so the requests do not change).
- ``least_outstanding``: fewest unfinished requests (Vidur's ``lor``).
- ``least_loaded``: vLLM's data-parallel balancing, the lowest ``4 * waiting + running``; ties go to
  the lowest replica index. The default, as in vLLM.
- ``prefix_aware``: the replica whose prefix cache holds the longest prefix of the prompt, among those
  whose ``least_loaded`` score is within ``max_load_gap`` of the lowest (ties: the lower score, then the
  lower index). A cache-aware router in the manner of SGLang's and llm-d's: it trades balance for hits.
  Without prefix caching it finds no hits and is ``least_loaded``.

With one replica every router sends everything to it: a sweep over routers needs ``num_replicas`` > 1.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from workloads.errors import problems_error
from workloads.schema_base import SchemaModel

DEFAULT_MAX_LOAD_GAP = 4
MAX_REPLICAS = 256
ROUTERS = ("round_robin", "random", "least_outstanding", "least_loaded", "prefix_aware")


class ClusterSection(SchemaModel):
    # Each replica is a whole engine in this process (its block pool alone is megabytes): a cap that
    # keeps a typo from exhausting memory, far above the data-parallel sizes vLLM deployments use.
    num_replicas: PositiveInt = Field(default=1, le=MAX_REPLICAS)
    router: Literal["round_robin", "random", "least_outstanding", "least_loaded", "prefix_aware"] = "least_loaded"
    # prefix_aware only (null: DEFAULT_MAX_LOAD_GAP). In units of least_loaded's score: 4 is one more
    # waiting request, or four more running ones.
    max_load_gap: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _gap_only_for_prefix_aware(self) -> ClusterSection:
        # A setting that the chosen router never reads would silently do nothing.
        if self.max_load_gap is not None and self.router != "prefix_aware":
            raise problems_error([("max_load_gap", f"applies to router 'prefix_aware' only, and router is "
                                   f"{self.router!r} (beside other routers in a sweep, sweep the whole section: "
                                   "sweep={cluster: [{router: least_loaded}, {router: prefix_aware, max_load_gap: 8}]})",
                                   self.max_load_gap)])
        return self

    @property
    def prefix_aware_max_load_gap(self) -> int:
        return DEFAULT_MAX_LOAD_GAP if self.max_load_gap is None else self.max_load_gap
