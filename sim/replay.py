"""Replay a real run in the simulator: same requests, same configuration, the real step durations.

The proof that the simulator and the real engine share one scheduler: with the real run's step
timeline in place of a cost model, the simulated run must schedule the same requests with the same
token counts in every step, preempt the same requests, and stamp every request with the same times
up to float rounding. ``compare_replay`` checks all three and names the first difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis import Run, read_run
from engine.core import CacheConfig, EngineCore, Scheduler, SchedulerConfig
from sim.cost_models.replay import ReplayCostModel
from sim.real_lora_steps import RecordedLoRASteps
from sim.trace_recorder import LORA_STEP_COLUMNS
from sim.recorded_drafts import RecordedDraftsExecutor
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from sim.trace_recorder import PROPOSED_COUNTS, SAMPLED_COUNTS, TraceRecorder
from workloads import RequestSpec, generate_requests, load_workload

# Timestamps are sums of the same durations in a different association order: allow for rounding.
TIME_TOLERANCE_S = 1e-6


@dataclass
class ReplayReport:
    num_steps_real: int
    num_steps_replay: int
    first_divergent_step: int | None
    max_time_difference_s: float
    preemptions_equal: bool

    @property
    def identical(self) -> bool:
        return (self.first_divergent_step is None and self.num_steps_real == self.num_steps_replay
                and self.preemptions_equal and self.max_time_difference_s <= TIME_TOLERANCE_S)

    def describe(self) -> str:
        if self.identical:
            return (f"replay identical: {self.num_steps_real} steps, same requests and token counts in every step, "
                    f"same preemptions, timestamps within {self.max_time_difference_s:.1e} s")
        return (f"replay DIVERGED: first different step {self.first_divergent_step}, steps real "
                f"{self.num_steps_real} vs replay {self.num_steps_replay}, preemptions equal: "
                f"{self.preemptions_equal}, largest timestamp difference {self.max_time_difference_s:.3g} s")


def replay_inputs(run: Run) -> tuple[SchedulerConfig, CacheConfig, list[RequestSpec]]:
    """The configuration and request stream a recorded run used, rebuilt from its summary."""
    config = run.summary.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"{run.path}: summary.json has no 'config' object; only real runs recorded by sim.run "
                         "--executor real can be replayed")
    missing = [key for key in ("workload", "scheduler", "cache", "vocab_size") if key not in config]
    if missing:
        raise ValueError(f"{run.path}: summary.json config lacks {missing}; only real runs can be replayed")
    workload = load_workload(config["workload"])
    if workload.cluster.num_replicas > 1:
        # A recording of a deployment of several engines (--executor server) has no per-engine steps to
        # replay, and one simulated engine would not be that deployment.
        raise ValueError(f"{run.path}: cluster.num_replicas is {workload.cluster.num_replicas}; a replay and a "
                         "fidelity comparison drive one engine")
    requests = generate_requests(workload, vocab_size=config["vocab_size"],
                                 reserved_token_ids=config.get("reserved_token_ids", ()),
                                 model_max_len=config["scheduler"].get("max_model_len"),
                                 tokens_per_image=config.get("tokens_per_image"))
    return SchedulerConfig(**config["scheduler"]), CacheConfig(**config["cache"]), requests


def recorded_max_concurrency(run: Run) -> int | None:
    """The recorded run's client limit on requests in flight (workload.max_concurrency), None for none."""
    return load_workload(run.summary["config"]["workload"]).workload.max_concurrency


def replay(run_dir: str | Path) -> tuple[TraceRecorder, Run, ReplayCostModel]:
    run = read_run(run_dir)
    scheduler_config, cache_config, requests = replay_inputs(run)
    cost_model = ReplayCostModel.from_steps(run.steps, source=str(run_dir))
    executor = SimulatedExecutor(cost_model)
    if scheduler_config.num_speculative_tokens:
        if SAMPLED_COUNTS not in run.steps.columns:
            raise ValueError(f"{run_dir}: a speculating run whose steps.parquet lacks {SAMPLED_COUNTS!r}; only real "
                             "runs recorded by sim.run --executor real can be replayed")
        steps = run.steps.sort_values("step")
        executor = RecordedDraftsExecutor(cost_model, steps["scheduled_request_ids"].tolist(),
                                          steps[SAMPLED_COUNTS].tolist(), steps[PROPOSED_COUNTS].tolist())
    if LORA_STEP_COLUMNS[0] in run.steps.columns:
        # Adapter counts and the recorded loads in the replay's trace; the recorded durations include the loads.
        executor.lora = RecordedLoRASteps(run.steps)
    engine = EngineCore(Scheduler(scheduler_config, cache_config), executor)
    # Fast-forward plans durations ahead of time; a replay consumes them strictly in order.
    recorder = Simulation(engine, requests, fast_forward=False, record_schedule=True,
                          max_concurrency=recorded_max_concurrency(run)).run()
    return recorder, run, cost_model


def compare_replay(real: Run, replay_requests, replay_steps) -> ReplayReport:
    """Compare a recorded run with its replay (both as DataFrames in the run-directory schema)."""
    real_steps = real.steps.sort_values("step").reset_index(drop=True)
    replay_steps = replay_steps.sort_values("step").reset_index(drop=True)
    first_divergent = None
    for index in range(min(len(real_steps), len(replay_steps))):
        if (list(real_steps.at[index, "scheduled_request_ids"]) != list(replay_steps.at[index, "scheduled_request_ids"])
                or list(real_steps.at[index, "scheduled_token_counts"])
                != list(replay_steps.at[index, "scheduled_token_counts"])):
            first_divergent = index
            break
    if first_divergent is None and len(real_steps) != len(replay_steps):
        first_divergent = min(len(real_steps), len(replay_steps))
    real_requests = real.requests.set_index("request_id")
    replay_requests = replay_requests.set_index("request_id").loc[real_requests.index]
    preemptions_equal = bool((real_requests["num_preemptions"] == replay_requests["num_preemptions"]).all()
                             and real_steps["num_preemptions"].tolist()[:len(replay_steps)]
                             == replay_steps["num_preemptions"].tolist()[:len(real_steps)])
    largest = 0.0
    for column in ("scheduled_time", "first_token_time", "finish_time"):
        difference = np.abs(real_requests[column].to_numpy(float) - replay_requests[column].to_numpy(float))
        difference = difference[~np.isnan(difference)]
        if difference.size:
            largest = max(largest, float(difference.max()))
    for real_times, replay_times in zip(real_requests["token_times"], replay_requests["token_times"]):
        if len(real_times) != len(replay_times):
            largest = math.inf
            break
        if len(real_times):
            largest = max(largest, float(np.max(np.abs(np.asarray(real_times) - np.asarray(replay_times)))))
    return ReplayReport(len(real_steps), len(replay_steps), first_divergent, largest, preemptions_equal)


def run_replay(real_run_dir: str | Path, out_dir: str | Path | None):
    """Replay, write the replay's run directory (mode "replay"), and compare it with the recorded run."""
    from analysis import write_run
    from sim.run_pipeline import RunResult, summarize_traces

    recorder, run, cost_model = replay(real_run_dir)
    workload = load_workload(run.summary["config"]["workload"])
    config = dict(run.summary["config"], replay_of=str(real_run_dir), cost_model=cost_model.describe())
    requests, steps, summary = summarize_traces(recorder, workload, config, mode="replay")
    report = compare_replay(run, requests.to_pandas(), steps.to_pandas())
    summary["replay"] = {"identical": report.identical, "first_divergent_step": report.first_divergent_step,
                         "max_time_difference_s": report.max_time_difference_s}
    if out_dir is not None:
        write_run(Path(out_dir), requests, steps, summary)
    return RunResult(summary, Path(out_dir) if out_dir else None, 0.0, 0.0, len(requests)), report
