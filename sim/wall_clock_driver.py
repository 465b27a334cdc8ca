"""Drive an ``EngineCore`` in wall-clock time with a workload's arrivals: the real-run counterpart of
``simulator.py``, writing the same traces.

The clock is kept on the same terms as the simulator's, so that a real run can be replayed exactly
(``sim.run --replay``): a step starts where the previous one ended (or at the arrival that woke an
idle engine), its duration runs to the moment the next step can start (model time plus the engine's
own overhead), and the requests added before a step are exactly those that arrived by its start.
A request arriving while a step runs waits for the next one, as on a real server.

With a ``RecordedTimeline`` (``sim.retime``) the same loop re-executes a recorded run: the logical
clock advances by the recorded step durations instead of the wall clock, so every arrival joins at the
step it joined before and the scheduler makes the same decisions (checked step by step), while each
step's wall time is measured over the same span as in a real run.

A multi-turn session's later turn is added once the clock reaches its arrival time, which the turn before it
set when it finished, and a client with a concurrency limit sends a held request at each finish, as the
simulator does (sim/wall_clock_arrivals.py).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from tqdm import tqdm

from engine.core import EngineCore, SamplingParams
from sim.cost_models.replay import ReplayDivergedError
from sim.scheduled_batch import scheduler_output_features
from sim.engine_requests import make_request
from sim.real_lora_steps import RealLoRASteps
from sim.trace_recorder import TraceRecorder
from sim.wall_clock_arrivals import WallClockArrivals
from workloads import RequestSpec
from workloads.request_spec import count_requests


@dataclass
class RecordedTimeline:
    """A recorded run's step durations and scheduled token counts, to drive the logical clock by."""
    durations: Sequence[float]
    scheduled_tokens: Sequence[int]
    measured: list[float] = field(default_factory=list)  # each step's wall time, filled in by the driver

    def step_duration(self, num_scheduled_tokens: int, measured: float) -> float:
        """Record a step's measured wall time; return its recorded duration (the schedule must match)."""
        step = len(self.measured)
        if step >= len(self.durations) or num_scheduled_tokens != self.scheduled_tokens[step]:
            expected = self.scheduled_tokens[step] if step < len(self.scheduled_tokens) else "no step"
            raise ReplayDivergedError(f"step {step}: scheduled {num_scheduled_tokens} tokens, the recorded run {expected}")
        self.measured.append(measured)
        return self.durations[step]

    def check_finished(self) -> None:
        if len(self.measured) != len(self.durations):
            raise ReplayDivergedError(f"re-timed run took {len(self.measured)} steps, the recorded run "
                                      f"{len(self.durations)}")


def run_wall_clock(engine: EngineCore, requests: Sequence[RequestSpec], *, record_schedule: bool = True,
                   progress: bool = False, description: str = "running",
                   clock: Callable[[], float] = time.perf_counter,
                   sleep: Callable[[float], None] = time.sleep,
                   timeline: RecordedTimeline | None = None, lora_paths: Mapping[str, str] | None = None,
                   lora_steps: RealLoRASteps | None = None, max_concurrency: int | None = None,
                   image_pixels: Mapping[str, Any] | None = None, temperature: float | None = None) -> TraceRecorder:
    """``lora_paths``: each adapter's folder (a real runner reads it); ``lora_steps``: the runner's LoRA counters,
    recorded per step (sim/real_lora_steps.py), for an engine that serves adapters; ``max_concurrency``: the
    client's limit on requests in flight (workload.max_concurrency); ``image_pixels``: each image identifier's
    preprocessed pixels, for a real runner that encodes them (sim/real_images.py)."""
    recorder = TraceRecorder(record_schedule=record_schedule)
    recorder.track_lora(lora_steps)
    recorder.track_spec_decoding(engine.scheduler.spec_decoding_stats)  # (None: an engine that does not speculate)
    # A speculating engine's tokens kept and drafts proposed per step, which its replay must reproduce.
    record_drafts = record_schedule and engine.scheduler.num_speculative_tokens > 0
    arrivals = WallClockArrivals(requests, max_concurrency)
    scheduler = engine.scheduler
    params_by_output_len: dict[int, SamplingParams] = {}
    if any(spec.session_id is not None for spec in requests):
        recorder.track_sessions()
    if max_concurrency is not None:
        recorder.track_client_waits()
    if any(spec.images for spec in requests):
        recorder.track_images()
    bar = tqdm(total=count_requests(requests), desc=description, unit="req", disable=not progress, mininterval=0.5,
               leave=False)
    # As serving engines do after start-up: move every object alive now out of the collector's view,
    # so that a full collection over the whole process does not land in the middle of a step.
    gc.collect()
    gc.freeze()
    origin = clock()
    now = 0.0  # the logical time: where the next step starts
    span_start = 0.0  # the wall time (since origin) the next step's measured span starts at

    def finished(outputs, time: float) -> None:
        """Count the finished requests and let the client react to each (a held request, a session's next turn)."""
        for output in outputs:
            if output.finish_reason is not None:
                bar.update()
                arrivals.on_finished(output.request_id, time)

    while arrivals.pending() or engine.has_work():
        for spec in arrivals.take(now):
            recorder.on_arrival(spec.request_id, spec.arrival_time, len(spec.prompt_token_ids), spec.priority,
                                spec.request_class, spec.lora_name, spec.session_id, spec.turn, spec.client_wait_s)
            if spec.images:
                recorder.note_images(spec.request_id, spec.images)
            request = make_request(spec, params_by_output_len, lora_paths=lora_paths, image_pixels=image_pixels,
                                   temperature=temperature)
            engine.add_request(request)
            arrivals.track(spec, request)
        if not engine.has_work():
            # Idle until the next arrival; the step it triggers starts at that arrival.
            now = arrivals.next_arrival()
            if now == float("inf"):  # a bug, never a workload's property: the client waits on nothing
                raise RuntimeError("requests are pending, none is in flight and none is on its way")
            if timeline is None:
                remaining = now - (clock() - origin)
                if remaining > 0:
                    sleep(remaining)
            span_start = clock() - origin
            continue
        start = now
        result = engine.step()
        scheduler_output = result.scheduler_output
        if scheduler_output is None or scheduler_output.total_num_scheduled_tokens == 0:
            # Only outputs of requests that ended between steps, or preemptions that freed blocks for the
            # next step: no model work, no time.
            if scheduler_output is not None and scheduler_output.preempted_req_ids:
                recorder.on_empty_step(scheduler_output)
            recorder.on_outputs(result.outputs, start)
            finished(result.outputs, start)
            continue
        wall_end = clock() - origin
        if timeline is None:
            duration, end = wall_end - start, wall_end
        else:
            # Re-timing: the recorded duration moves the logical clock; the measured span runs from
            # the previous step's end (its bookkeeping included, as in a real run) to this one's.
            duration = timeline.step_duration(scheduler_output.total_num_scheduled_tokens, wall_end - span_start)
            end = start + duration
        features = scheduler_output_features(scheduler_output)
        if lora_steps is not None:
            lora_steps.on_step(scheduler_output, features)
        recorder.on_step(start, duration, scheduler_output, features, scheduler)
        if record_drafts:
            recorder.on_drafts(scheduler_output, result.model_runner_output)
        recorder.on_outputs(result.outputs, end)
        finished(result.outputs, end)
        now = end
        span_start = wall_end
    bar.close()
    if timeline is not None:
        timeline.check_finished()
    return recorder
