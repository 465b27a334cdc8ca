"""One simulated run, start to finish: setup -> simulation -> run directory -> summary.

Kept apart from the CLI so that sweeps (in worker processes), tests and benchmarks run exactly what
``python -m sim.run`` runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from analysis import compute_summary, requests_table, steps_table, write_run
from analysis.spec_decode_stats import merge_spec_decoding
from engine.core import EngineCore, Scheduler
from sim.cost_models.calibrated_range import extrapolation_report
from sim.cluster_trace import ClusterTrace
from sim.disaggregation import DisaggregationSetup
from sim.model_shapes import kv_cache_storage_dtype
from sim.engine_setup import RunSetup, build_setup
from sim.replica_loads import ReplicaLoads
from sim.router import make_router
from sim.lora_steps import LoRASteps
from sim.speculative_executor import make_executor
from sim.simulator import Simulation
from sim.trace_recorder import TraceRecorder
from workloads import WorkloadConfig
from workloads.random_streams import Stream
from workloads.request_spec import count_requests


@dataclass
class RunResult:
    summary: dict
    out_dir: Path | None
    wall_s: float               # simulation and writing, not setup
    simulate_s: float           # the event loop alone
    num_requests: int


def simulate(setup: RunSetup, *, progress: bool = False, description: str = "simulating",
             fast_forward: bool = True) -> TraceRecorder | ClusterTrace:
    """One engine, or a cluster of ``cluster.num_replicas`` identical ones behind its router. With
    ``engine.data_parallel_size`` D, each of them is D ranks (one replica each in the traces; a mixture of experts'
    stepping in lockstep), and the router picks among all the ranks."""
    expert_parallel = getattr(setup.cost_model, "expert_parallel", None)
    num_replicas = setup.workload.cluster.num_replicas * setup.workload.engine.data_parallel_size
    engines = [EngineCore(Scheduler(setup.scheduler_config, setup.cache_config),
                          make_executor(setup.cost_model, setup.speculation))
               for _ in range(num_replicas)]
    if setup.lora is not None:  # each replica has its own adapter slots
        for engine in engines:
            engine.executor.lora = LoRASteps(setup.lora)
    router = None
    cluster = setup.workload.cluster
    loads = ReplicaLoads(engines, cluster.stats_interval_s)
    disaggregation = None
    if num_replicas > 1:
        # One hasher for all: a request's block hashes, computed once before it is routed (checked_choice),
        # are then the ones every replica's scheduler would compute, and are not computed again.
        for engine in engines[1:]:
            engine.scheduler.block_hasher = engines[0].scheduler.block_hasher
        if cluster.disaggregated:
            disaggregation = disaggregation_setup(setup, engines)
        else:
            router = make_router(setup.workload, loads)
    return Simulation(engines, setup.requests, router=router, loads=loads, progress=progress, description=description,
                      fast_forward=fast_forward, disaggregation=disaggregation, host_link=setup.host_link,
                      max_concurrency=setup.workload.workload.max_concurrency, autoscaling=cluster.autoscaling,
                      expert_parallel=expert_parallel).run()


def disaggregation_setup(setup: RunSetup, engines: list[EngineCore]) -> DisaggregationSetup:
    """The two pools of a disaggregated cluster, each behind its own instance of the workload's router, and
    the KV link. At tensor parallelism each GPU of the decode replica receives its own shard of the KV."""
    cluster, engine = setup.workload.cluster, setup.workload.engine
    prefill, decode = engines[:cluster.prefill_replicas], engines[cluster.prefill_replicas:]
    prefill_loads = ReplicaLoads(prefill, cluster.stats_interval_s)
    decode_loads = ReplicaLoads(decode, cluster.stats_interval_s)
    shape = setup.model.shard(engine.tensor_parallel_size)
    return DisaggregationSetup(
        num_prefill=cluster.prefill_replicas,
        prefill_router=make_router(setup.workload, prefill_loads), prefill_loads=prefill_loads,
        decode_router=make_router(setup.workload, decode_loads, Stream.DECODE_ROUTING), decode_loads=decode_loads,
        bytes_per_token=shape.kv_bytes_per_token(kv_cache_storage_dtype(setup.workload.dtype, engine.kv_cache_dtype)),
        bandwidth_gbps=cluster.kv_transfer_bandwidth_gbps,
        latency_s=cluster.kv_transfer_latency_s)


def summarize(recorder: TraceRecorder, setup: RunSetup, mode: str = "sim"):
    return summarize_traces(recorder, setup.workload, setup.describe(), mode)


def summarize_traces(recorder: TraceRecorder, workload: WorkloadConfig, config: dict, mode: str):
    """Tables and summary of a recorded run, whatever executor produced it."""
    requests = requests_table(recorder.request_columns())
    steps = steps_table(recorder.step_columns())
    slo = workload.slo.model_dump(exclude_none=True) if workload.slo is not None else None
    summary = compute_summary(requests.to_pandas(), steps.to_pandas(), name=workload.name, mode=mode,
                              config=config, slo=slo, class_slos=workload.class_slos())
    spec_decoding = merge_spec_decoding(recorder.spec_decoding_counts())
    if spec_decoding is not None:
        summary["spec_decoding"] = spec_decoding
    return requests, steps, summary


def cost_model_extrapolation(cost_model, steps) -> dict | None:
    """For a calibrated profile that records its calibrated range: the run's steps beyond it."""
    calibrated = getattr(getattr(cost_model, "profile", None), "provenance", {}).get("calibrated_range")
    if not calibrated:
        return None
    from sim.calibration_fit import step_feature_frame

    return extrapolation_report(step_feature_frame(steps.to_pandas()), calibrated)


def run_simulation(workload: WorkloadConfig, out_dir: str | Path | None, *, cost_model: str | dict | None = None,
                   progress: bool = False, fast_forward: bool = True) -> RunResult:
    setup = build_setup(workload, cost_model)
    started = time.perf_counter()
    recorder = simulate(setup, progress=progress, description=workload.name, fast_forward=fast_forward)
    simulated = time.perf_counter()
    requests, steps, summary = summarize(recorder, setup)
    summary["simulation_wall_s"] = simulated - started
    autoscaling = getattr(recorder, "autoscaling", None)
    if autoscaling is not None:
        engine = workload.engine
        summary["autoscaling"] = autoscaling.summary(
            workload.cluster.num_replicas,
            engine.tensor_parallel_size * engine.pipeline_parallel_size, workload.cluster.autoscaling)
        # Busy time over the mean replica's says how evenly a router shared the load among replicas that all
        # served throughout; replicas that were off for part of the run make it say nothing.
        summary["replica_load_imbalance"] = None
    lockstep = getattr(recorder, "lockstep", None)
    if lockstep is not None:
        summary["data_parallel"] = lockstep.summary(workload.cluster.num_replicas)
    extrapolation = cost_model_extrapolation(setup.cost_model, steps)
    if extrapolation is not None:
        summary["cost_model_extrapolation"] = extrapolation
    if out_dir is not None:
        out_dir = Path(out_dir)
        write_run(out_dir, requests, steps, summary)
    finished = time.perf_counter()
    return RunResult(summary, out_dir, finished - started, simulated - started, count_requests(setup.requests))
