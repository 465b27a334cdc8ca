"""Drive an ``EngineCore`` in wall-clock time with a workload's arrivals: the real-run counterpart of
``simulator.py``, writing the same traces.

The clock is kept on the same terms as the simulator's, so that a real run can be replayed exactly
(``sim.run --replay``): a step starts where the previous one ended (or at the arrival that woke an
idle engine), its duration runs to the moment the next step can start (model time plus the engine's
own overhead), and the requests added before a step are exactly those that arrived by its start.
A request arriving while a step runs waits for the next one, as on a real server.
"""

from __future__ import annotations

import gc
import time
from typing import Callable, Sequence

from tqdm import tqdm

from engine.core import EngineCore, SamplingParams
from sim.scheduled_batch import scheduler_output_features
from sim.simulator import make_request
from sim.trace_recorder import TraceRecorder
from workloads import RequestSpec


def run_wall_clock(engine: EngineCore, requests: Sequence[RequestSpec], *, record_schedule: bool = True,
                   progress: bool = False, description: str = "running",
                   clock: Callable[[], float] = time.perf_counter,
                   sleep: Callable[[float], None] = time.sleep) -> TraceRecorder:
    recorder = TraceRecorder(record_schedule=record_schedule)
    specs = sorted(requests, key=lambda spec: spec.arrival_time)
    scheduler = engine.scheduler
    params_by_output_len: dict[int, SamplingParams] = {}
    bar = tqdm(total=len(specs), desc=description, unit="req", disable=not progress, mininterval=0.5, leave=False)
    next_index = 0
    # As serving engines do after start-up: move every object alive now out of the collector's view,
    # so that a full collection over the whole process does not land in the middle of a step.
    gc.collect()
    gc.freeze()
    origin = clock()
    now = 0.0  # the logical time: where the next step starts
    while next_index < len(specs) or engine.has_work():
        while next_index < len(specs) and specs[next_index].arrival_time <= now:
            spec = specs[next_index]
            recorder.on_arrival(spec.request_id, spec.arrival_time, len(spec.prompt_token_ids), spec.priority)
            engine.add_request(make_request(spec, params_by_output_len))
            next_index += 1
        if not engine.has_work():
            # Idle until the next arrival; the step it triggers starts at that arrival.
            now = specs[next_index].arrival_time
            remaining = now - (clock() - origin)
            if remaining > 0:
                sleep(remaining)
            continue
        start = now
        result = engine.step()
        scheduler_output = result.scheduler_output
        if scheduler_output is None or scheduler_output.total_num_scheduled_tokens == 0:
            # Only outputs of requests that ended between steps: no model work, no time.
            recorder.on_outputs(result.outputs, start)
            bar.update(sum(output.finish_reason is not None for output in result.outputs))
            continue
        end = clock() - origin
        recorder.on_step(start, end - start, scheduler_output, scheduler_output_features(scheduler_output), scheduler)
        recorder.on_outputs(result.outputs, end)
        bar.update(sum(output.finish_reason is not None for output in result.outputs))
        now = end
    bar.close()
    return recorder
