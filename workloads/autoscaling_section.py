"""``cluster.autoscaling``: replicas started and stopped with the load, as a Kubernetes autoscaler does.

A fleet seldom runs its peak replica count all day. An autoscaler (Kubernetes' HPA, or KEDA, reading each
vLLM server's ``vllm:num_requests_running`` / ``..._waiting`` / ``vllm:kv_cache_usage_perc``) reads a metric
every ``interval_s`` and sets the replica count to ``ceil(sum of the metric over the ready replicas /
target)``, within ``min_replicas`` and ``cluster.num_replicas`` (the most it may run); sim/autoscaler.py
simulates it. What this section decides, and why each default:

- ``metric``: ``outstanding`` (waiting + running requests: Knative's and KServe's concurrency target),
  ``waiting`` (the queue alone: vLLM production-stack's KEDA example scales on it), or ``kv_cache_usage``
  (each replica's share of KV blocks in use, 0-1; the target is then a share).
- ``target``: the metric's value per ready replica that the count aims at. Required: it is the policy.
- ``tolerance`` 0.1: HPA's default; a change is made only when the desired count differs from the current
  one by more than 10% of it, so that noise does not move the count.
- ``interval_s`` 15: HPA's sync period.
- ``startup_s`` 60: how long a new replica takes before it serves (a pod scheduled, the container started,
  the weights loaded, CUDA graphs captured). It is billed from the decision on.
- ``scale_down_delay_s`` 300: HPA's scale-down stabilization window. A scale-down goes to the largest
  count desired over the last ``scale_down_delay_s``, so a dip shorter than that stops nothing. Scale-ups
  happen at once (HPA's default for them is 0).
- ``initial_replicas`` (default ``min_replicas``): ready at t = 0.

A replica scaled down stops taking requests and finishes those it holds (its server drains), then stops;
if the count rises again while it drains, it is taken back at once, warm. Routers see the ready replicas
only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from workloads.errors import problems_error
from workloads.schema_base import SchemaModel

AUTOSCALING_METRICS = ("outstanding", "waiting", "kv_cache_usage")


class AutoscalingSection(SchemaModel):
    metric: Literal["outstanding", "waiting", "kv_cache_usage"] = "outstanding"
    # Per ready replica; > 0 (a share in (0, 1] for kv_cache_usage).
    target: float = Field(gt=0)
    min_replicas: PositiveInt = 1
    initial_replicas: PositiveInt | None = None
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    # At least a millisecond, for the same reason as cluster.stats_interval_s: a vanishing period never moves on.
    interval_s: float = Field(default=15.0, ge=1e-3, le=86_400)
    startup_s: float = Field(default=60.0, ge=0, le=86_400)
    scale_down_delay_s: float = Field(default=300.0, ge=0, le=86_400)

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalingSection:
        problems = []
        if self.metric == "kv_cache_usage" and self.target > 1:
            problems.append(("target", "must be a share of the KV cache in (0, 1] with metric 'kv_cache_usage'",
                             self.target))
        if self.initial_replicas is not None and self.initial_replicas < self.min_replicas:
            problems.append(("initial_replicas", f"must be at least min_replicas ({self.min_replicas})",
                             self.initial_replicas))
        if problems:
            raise problems_error(problems)
        return self

    @property
    def replicas_at_start(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas
