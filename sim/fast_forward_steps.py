"""Decode-only stretches of a simulated engine advanced in one call to the core (engine/core/decode_fast_forward.py).

Between two events that could change a step (an arrival, a publication of the replicas' loads, a later turn
of a session on its way) the steps of a decode-only batch are known in advance: their durations are planned
here, the core applies them at once, and they are recorded as ordinary steps. The traces are those of the
ordinary steps, byte for byte (tests/sim/test_fast_forward_equivalence.py).
"""

from __future__ import annotations

from engine.core.decode_fast_forward import DecodeFastForward, FastForwardResult
from sim.cost_models import StepFeatures
from sim.lora_steps import FastForwardLoRA
from sim.sim_executor import SimulatedExecutor

# A fast-forward stops at the next arrival anyway; the cap bounds the work planned ahead of it.
MAX_FAST_FORWARD_STEPS = 1024


# ``simulation`` is the sim.simulator.Simulation running the engine, ``replica`` its sim.simulator.Replica.
def plan_durations(simulation, plan: DecodeFastForward, executor: SimulatedExecutor
                   ) -> tuple[list[float], list[StepFeatures], FastForwardLoRA | None]:
    """Durations and features of the decode-only steps that start before the next arrival (or the next
    publication of the loads), and their adapters when the engine serves LoRA (sim/lora_steps.py)."""
    time_features = executor.cost_model_time
    next_event = simulation.next_event_time()
    now = simulation.env.now
    durations: list[float] = []
    planned_steps: list[StepFeatures] = []
    lora = None if executor.lora is None else executor.lora.plan_fast_forward(plan.requests, plan.last_steps)
    max_steps = MAX_FAST_FORWARD_STEPS
    if simulation.client is not None:
        # Up to the first finish: it frees a client slot, and a request sent into it (or an arrival that now finds
        # one free) joins the step after it.
        max_steps = min(max_steps, min(plan.last_steps) + 1)
    # A request whose session sends a next turn may finish in the stretch: its turn arrives think_time_s after that
    # step's end, and no step starts at or after it, as after any arrival (the turn joins the step after it).
    think_after_step: dict[int, float] = {}
    if simulation.client is None and simulation.later_turns is not None:
        think_time = simulation.later_turns.next_think_time
        for request, last in zip(plan.requests, plan.last_steps):
            think = think_time(request.request_id)
            if think is not None and think < think_after_step.get(last, float("inf")):
                think_after_step[last] = think
    while len(durations) < max_steps and now < next_event:
        step = plan.step(len(durations))
        if step.num_decode_reqs == 0:
            break
        features = StepFeatures(
            num_reqs=step.num_decode_reqs, num_tokens=step.num_decode_reqs, num_prefill_reqs=0,
            num_prefill_tokens=0, num_decode_reqs=step.num_decode_reqs,
            decode_context_tokens=step.decode_context_tokens, prefill_context_tokens=0,
            prefill_attention_work=0, max_seq_len=step.max_seq_len,
            shared_context_tokens=step.shared_kv_tokens, kv_block_runs=step.kv_block_runs)
        if lora is None:
            duration = time_features(features)
        else:
            features.num_lora_tokens, features.num_active_loras = lora.counts(len(durations))
            # Only the first step can load: the later ones' adapters are among its, all active.
            duration = time_features(features) + (lora.first_load_s if not durations else 0.0)
        planned_steps.append(features)
        durations.append(duration)
        # The same float addition SimPy performs for each timeout, so times match ordinary steps.
        now = now + duration
        think = think_after_step.get(len(durations) - 1)
        if think is not None:
            next_event = min(next_event, now + think)  # the float sum RequestSpec.next_turn computes
    return durations, planned_steps, lora


def fast_forward(simulation, replica, result: FastForwardResult, durations: list[float],
                 planned_steps: list[StepFeatures], lora: FastForwardLoRA | None):
    """Advance virtual time through the fast-forwarded steps and record them as ordinary ones."""
    env = simulation.env
    if lora is not None:
        replica.executor.lora.commit_fast_forward(lora, result.num_steps)
    starts, ends = [], []
    now = env.now
    for duration in durations[:result.num_steps]:
        starts.append(now)
        now = now + duration
        ends.append(now)
    replica.recorder.on_fast_forward(starts, durations[:result.num_steps], planned_steps, result, ends,
                                     replica.engine.scheduler)
    simulation.num_fast_forwarded_steps += result.num_steps
    if simulation.client is None and simulation.later_turns is not None:
        # Each step's finishes reach the sessions at the step's end, in running order (the order of the step's
        # outputs), as count_finished reports them after an ordinary step: a turn sent then arrives at the very
        # time, and in the same order among the arrivals during the stretch's last step, as without the
        # fast-forward (plan_durations ends the stretch with the step its think time ends in).
        finished_by_step: dict[int, list[str]] = {}
        for request, step in zip(result.requests, result.finish_step):
            if step >= 0:
                finished_by_step.setdefault(step, []).append(request.request_id)
        for step, duration in enumerate(durations[:result.num_steps]):
            yield env.timeout(duration)
            for request_id in finished_by_step.get(step, ()):
                simulation.on_request_finished(request_id, ends[step])
        simulation.unreported_finished += sum(step >= 0 for step in result.finish_step)
        return
    for duration in durations[:result.num_steps]:
        yield env.timeout(duration)
    simulation.unreported_finished += sum(step >= 0 for step in result.finish_step)
    if simulation.client is not None:
        # Only the last step can finish a request (see plan_durations): now is its end.
        for request, step in zip(result.requests, result.finish_step):
            if step >= 0:
                simulation.on_request_finished(request.request_id, ends[step])
