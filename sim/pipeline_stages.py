"""One engine's pipeline-parallel stages in virtual time, and the engine loop that keeps them busy.

vLLM runs a pipeline-parallel engine with a batch queue as deep as the pipeline (``step_with_batch_queue``):
it schedules a batch and hands it to the first stage, and while the queue has room, something can be
scheduled and the oldest batch is not back yet, it schedules the next one at once; otherwise it waits for
the oldest batch's outputs (if they are not back already) and applies them. The scheduler is the shared one: a decode whose token is in flight is passed over, so the running
requests spread over the batches in flight (engine/core/batches_in_flight.py).

Here each stage is a GPU group that runs one batch at a time, in the order batches reach it: a batch enters
a stage when it has left the stage before and the stage is free (``PipelineStages.run``). The engine spends
the cost model's ``engine_overhead_s`` on each batch before the first stage can take it, and cannot
schedule the next meanwhile. A step's row in the traces starts when it is scheduled and lasts until its
outputs are back, so rows overlap in time, by up to the pipeline's depth. Its tokens are stamped when the
engine applies them: at once, or when it has finished preparing the batch it was busy with.

vLLM's async scheduling is the same loop with one stage and a queue two deep: the engine schedules the next
step (the scheduler taking the positions of tokens still being sampled) while the GPU runs this one, so the
engine's overhead overlaps the GPU's time instead of adding to it.
"""

from __future__ import annotations

from collections import deque

from engine.core.engine_core import StartedStep
from sim.livelock import check_preemptions


class PipelineStages:
    """When each stage is next free; batches pass through the stages in order."""

    def __init__(self, num_stages: int) -> None:
        if num_stages < 1:
            raise ValueError(f"a pipeline needs at least one stage, got {num_stages}")
        self.free_at = [0.0] * num_stages

    def run(self, ready_time: float, stage_times: list[float]) -> float:
        """Pass a batch ready at ``ready_time`` through every stage; the time its outputs are back."""
        if len(stage_times) != len(self.free_at):
            raise ValueError(f"{len(stage_times)} stage times for a pipeline of {len(self.free_at)} stages")
        time = ready_time
        free_at = self.free_at
        for stage, duration in enumerate(stage_times):
            start = time if time > free_at[stage] else free_at[stage]
            time = start + duration
            free_at[stage] = time
        return time


def pipelined_engine_loop(simulation, replica, cost_model, depth: int | None = None):
    """The SimPy process of one engine with a batch queue ``depth`` deep (default: one batch per pipeline stage);
    ``simulation`` is the ``sim.simulator.Simulation``."""
    from sim.simulator import SchedulerStalledError

    env, engine, executor, recorder = simulation.env, replica.engine, replica.executor, replica.recorder
    scheduler = engine.scheduler
    stages = PipelineStages(cost_model.pipeline_parallel_size)
    executor.time_by_stage = True  # the executor times each step by stage, once
    depth = cost_model.pipeline_parallel_size if depth is None else depth
    # Batches in flight, oldest first: (the started step, the time its outputs are back).
    in_flight: deque[tuple[StartedStep, float]] = deque()

    def record(outputs, time: float) -> None:
        recorder.on_outputs(outputs, time)
        simulation.count_finished(outputs, time)

    while True:
        if not in_flight and not engine.has_work():
            simulation.on_replica_idle(replica)
            if simulation.arrivals_done:
                return
            yield from replica.sleep(env)
            continue
        # As vLLM's batch queue: the oldest batch's outputs, if already back, are applied before the next schedule.
        if len(in_flight) < depth and scheduler.has_unfinished_requests() and not (
                in_flight and in_flight[0][1] <= env.now):
            start = env.now
            started = engine.start_step()
            scheduler_output = started.scheduler_output
            if scheduler_output.preempted_req_ids:
                check_preemptions(scheduler, scheduler_output, start)
            if scheduler_output.kv_loads:
                replica.host_loads.start_loads(scheduler_output.kv_loads)
            if scheduler_output.total_num_scheduled_tokens:
                overhead = executor.last_overhead
                end = stages.run(start + overhead, executor.last_stage_times)
                in_flight.append((started, end))
                recorder.on_step(start, end - start, scheduler_output, executor.last_features, scheduler)
                # The engine prepares this batch before it can schedule the next.
                if overhead > 0:
                    yield env.timeout(overhead)
                continue
            # Nothing could be scheduled (every running request has a token in flight, or the pool is short):
            # apply the empty batch now, then wait for the oldest batch.
            record(engine.finish_step(started), start)
            if scheduler_output.preempted_req_ids:
                # A running request was its own victim: progress without a token, its blocks now free.
                recorder.on_empty_step(scheduler_output)
                continue
            if not in_flight and scheduler.has_kv_transfers_in_flight():
                # Its waiting requests wait on loads from the host tier: sleep until one is done (or an arrival).
                recorder.on_empty_step(scheduler_output)
                yield from replica.sleep(env)
                continue
            if not in_flight:
                raise SchedulerStalledError(
                    f"at t={start:.6f}s {len(scheduler.waiting)} requests wait and none was scheduled")
        elif not in_flight:
            # Only outputs of requests that ended between steps (ignored at admission, aborted).
            record(scheduler.take_pending_outputs(), env.now)
            continue
        started, end = in_flight.popleft()
        if end > env.now:
            yield env.timeout(end - env.now)
        record(engine.finish_step(started), env.now)
