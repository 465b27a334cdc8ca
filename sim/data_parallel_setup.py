"""``engine.data_parallel_size``: what the simulator runs with data-parallel ranks, and what it refuses by name.

A mixture of experts' ranks step in lockstep (sim/data_parallel_loop.py runs them; sim/cost_models/expert_parallel.py
prices their steps). A dense model's ranks never wait for one another: as in vLLM, they are independent engines
behind one load balancer, simulated as replicas (each rank one, the cluster's router choosing among them)."""

from __future__ import annotations

from sim.model_shapes import ModelShape
from workloads import WorkloadConfig


class DataParallelError(ValueError):
    """A data-parallel configuration the simulator does not run; the message names the field."""


def check_data_parallel(workload: WorkloadConfig, model: ModelShape) -> int:
    """The number of data-parallel ranks (1: off), refusing what the lockstep loop does not simulate."""
    engine, cluster = workload.engine, workload.cluster
    ranks = engine.data_parallel_size
    if ranks == 1:
        return 1
    field = f"engine.data_parallel_size: {ranks} ranks"
    refusals = [
        (cluster.disaggregated, f"cluster.prefill_replicas {cluster.prefill_replicas}"),
        (cluster.autoscaling is not None, "cluster.autoscaling"),
    ]
    if model.is_moe:  # the lockstep loop's own limits
        refusals += _lockstep_refusals(workload)
    for refused, what in refusals:
        if refused:
            raise DataParallelError(f"{field} are not simulated with {what}; set one of them back")
    return ranks


def _lockstep_refusals(workload: WorkloadConfig) -> list[tuple[bool, str]]:
    engine = workload.engine
    return [
        (engine.pipeline_parallel_size > 1, f"engine.pipeline_parallel_size {engine.pipeline_parallel_size}"),
        (engine.async_scheduling, "engine.async_scheduling: true"),
        (engine.speculative_decoding is not None and engine.speculative_decoding.num_speculative_tokens > 0
         and engine.speculative_decoding.method == "draft_model",
         "engine.speculative_decoding.method draft_model (a separate draft's ranks are not modelled; mtp, eagle, "
         "eagle3 and ngram are)"),
        (engine.kv_offloading_size_gib > 0, f"engine.kv_offloading_size_gib {engine.kv_offloading_size_gib:g}"),
        (workload.workload.lora is not None, "workload.lora"),
        (workload.workload.images is not None, "workload.images"),
    ]
