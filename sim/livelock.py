"""A run whose requests keep evicting one another never ends: it is stopped with an error that says why.

Recompute preemption frees a request's KV and restarts it from scratch. When the pool cannot hold the
requests it runs and none of them is ever allowed to finish, the engine preempts forever: for example
under ``scheduling_policy: priority``, where vLLM's rule (and so ours) evicts, among requests of equal
priority and arrival time, the one admitted first, which is the one furthest ahead. The completions of one
prompt (``workload.n``) share their arrival time, and two of them that do not fit the pool together take
turns evicting each other. A real engine would spin too; a simulation must end, so a request preempted
``MAX_PREEMPTIONS_PER_REQUEST`` times stops the run.
"""

from __future__ import annotations

from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerOutput

# Far past what a run that makes progress reaches (an overloaded run with a tight pool preempts a request a
# few dozen times), and reached within seconds of simulation by one that does not.
MAX_PREEMPTIONS_PER_REQUEST = 1000


class EngineLivelockError(ValueError):
    """The engine keeps preempting a request: the configuration cannot make progress."""


def check_preemptions(scheduler: Scheduler, scheduler_output: SchedulerOutput, now: float) -> None:
    """Raise EngineLivelockError when a request this step preempted has been preempted too often."""
    for request_id in scheduler_output.preempted_req_ids:
        request = scheduler.requests.get(request_id)
        if request is not None and request.num_preemptions >= MAX_PREEMPTIONS_PER_REQUEST:
            raise EngineLivelockError(
                f"at t={now:.3f}s request {request_id!r} has been preempted {request.num_preemptions} times "
                f"without finishing: the engine is livelocked (engine.scheduling_policy "
                f"{scheduler.policy!r}, {scheduler.kv_cache_manager.num_usable_blocks} KV blocks of "
                f"{scheduler.block_size} tokens). Give the requests more KV cache (engine.num_gpu_blocks or "
                "engine.gpu_memory_utilization), a shorter engine.max_model_len, fewer engine.max_num_seqs, or, under "
                "a ranked policy (priority and the others but fcfs), ranks that tell apart the requests that evict "
                "each other (engine.scheduling_policy=fcfs evicts the newest instead)")
