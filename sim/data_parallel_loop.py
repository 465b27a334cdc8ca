"""The engine loop of data-parallel ranks that step in lockstep (``engine.data_parallel_size`` > 1 with a mixture
of experts: sim/cost_models/expert_parallel.py says why and what a step costs).

Each rank is a replica of the simulation (its own EngineCore, scheduler, KV cache, traces), and the workload's
router gives each arrival to one (vLLM's data-parallel load balancer: the least loaded rank by default; with
``cluster.num_replicas`` data-parallel engines, the least loaded rank of any). The ranks of one engine share one
loop: every rank with work schedules and runs its step (its executor prices its own batch without the
routed experts), the step lasts the slowest rank's time plus the experts' and the all-to-alls' for all the
ranks' tokens, and every rank's tokens are stamped with its end. A rank without work sits the step out in the
traces (vLLM runs it on an empty batch, which costs its GPUs only the experts' share, already counted). When no
rank has work the loop sleeps until an arrival wakes any of them.

Speculative decoding runs in each rank (its executor prices verification and proposing); with the model's MTP
module as the proposer, the module's routed experts are spread over the ranks too, so the step adds them for all
ranks' tokens as it adds the model's. Not run here: the decode fast-forward (each rank's stretch would have to
match the others'), pipeline stages, async scheduling, a separate draft model, KV transfers and host loads (the
setup refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.cost_models.expert_parallel import ExpertParallelMoE
from sim.livelock import check_preemptions

if TYPE_CHECKING:  # the simulation imports this module
    from sim.simulator import Replica, Simulation


@dataclass
class LockstepStats:
    """What lockstep cost the ranks, over every data-parallel engine's steps: each step holds every rank of its
    engine for its duration; a rank's own work is its executor's time (its batch without the routed experts), and
    the rest of the step's non-expert part it spends waiting for the slowest rank (all of it for a rank without
    work)."""
    ranks_per_engine: int
    num_steps: int = 0
    step_s: float = 0.0          # summed step durations, each once per engine step
    experts_s: float = 0.0       # their routed experts' and all-to-alls' part
    rank_s: float = 0.0          # ranks x the non-expert part of each step
    waited_s: float = 0.0        # of rank_s, the ranks' time waiting for their engine's slowest rank

    def add(self, own_times: list[float], experts_s: float) -> None:
        slowest = max(own_times)
        self.num_steps += 1
        self.step_s += slowest + experts_s
        self.experts_s += experts_s
        self.rank_s += self.ranks_per_engine * slowest
        self.waited_s += self.ranks_per_engine * slowest - sum(own_times)

    def summary(self, num_engines: int) -> dict:
        return {"ranks_per_engine": self.ranks_per_engine, "engines": num_engines, "lockstep_steps": self.num_steps,
                # The share of the ranks' non-expert step time spent waiting for the slowest rank.
                "rank_wait_share": self.waited_s / self.rank_s if self.rank_s else 0.0,
                # The share of step time in the routed experts and their all-to-alls (every rank's tokens).
                "routed_experts_share": self.experts_s / self.step_s if self.step_s else 0.0}


def data_parallel_loop(simulation: Simulation, replicas: list[Replica], expert_parallel: ExpertParallelMoE,
                       stats: LockstepStats | None = None):
    from sim.simulator import SchedulerStalledError

    env = simulation.env
    while True:
        working = [replica for replica in replicas if replica.engine.has_work()]
        if not working:
            for replica in replicas:
                simulation.on_replica_idle(replica)
            if simulation.arrivals_done:
                return
            yield from _sleep_until_any_wakes(env, replicas)
            continue
        start = env.now
        ran = []
        for replica in working:
            result = replica.engine.step()
            scheduler_output = result.scheduler_output
            scheduler = replica.engine.scheduler
            if scheduler_output is not None and scheduler_output.preempted_req_ids:
                check_preemptions(scheduler, scheduler_output, start)
            if scheduler_output is None or scheduler_output.total_num_scheduled_tokens == 0:
                replica.recorder.on_outputs(result.outputs, start)
                simulation.count_finished(result.outputs, start)
                if scheduler_output is not None and scheduler_output.preempted_req_ids:
                    replica.recorder.on_empty_step(scheduler_output)
                elif scheduler.has_unfinished_requests() and scheduler_output is not None:
                    raise SchedulerStalledError(
                        f"at t={start:.6f}s {len(scheduler.waiting)} requests wait and none was scheduled")
                continue
            ran.append((replica, result))
        if not ran:
            continue
        tokens = [result.scheduler_output.total_num_scheduled_tokens for _, result in ran]
        own_times = [replica.executor.last_duration for replica, _ in ran]
        experts_s = expert_parallel.time(sum(tokens), max(tokens)) + _draft_experts_time(ran, tokens)
        duration = max(own_times) + experts_s
        if stats is not None:  # ranks without a step wait it out whole
            stats.add(own_times + [0.0] * (len(replicas) - len(ran)), experts_s)
        for replica, result in ran:
            replica.recorder.on_step(start, duration, result.scheduler_output, replica.executor.last_features,
                                     replica.engine.scheduler)
        yield env.timeout(duration)
        now = env.now
        for replica, result in ran:
            replica.recorder.on_outputs(result.outputs, now)
            simulation.count_finished(result.outputs, now)


def _draft_experts_time(ran: list, tokens: list[int]) -> float:
    """Speculative decoding with the model's MTP module: its MoE layer's routed experts and all-to-alls, for all
    ranks' tokens in its first pass and all ranks' sampling requests in each later one (each rank's executor has
    priced the rest of its passes); 0 without one."""
    speculation = getattr(ran[0][0].executor, "speculation", None)
    draft = None if speculation is None else speculation.draft_cost_model
    if draft is None or draft.expert_parallel is None:
        return 0.0
    moe = draft.expert_parallel
    seconds = moe.time(sum(tokens), max(tokens))
    sampling = [replica.executor.last_num_sampling for replica, _ in ran]
    if sum(sampling):
        seconds += (speculation.num_speculative_tokens - 1) * moe.time(sum(sampling), max(sampling))
    return seconds


def _sleep_until_any_wakes(env, replicas: list[Replica]):
    """One event for every rank: an arrival routed to any of them (``Replica.wake``) ends the wait."""
    woken = env.event()
    for replica in replicas:
        replica.idle = woken
    yield woken
    for replica in replicas:
        replica.idle = None
