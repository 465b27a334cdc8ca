"""One engine step as a front end takes it: ``LLM`` and the server's engine loop share it.

A front end's step is more than ``EngineCore.step()``: requests scheduled for the first time get their
first-scheduled time (the end of their queueing time), the core's outputs are detokenized and checked
for stop strings, and a request that a stop string ended is finished in the core at once, so that its
blocks are free before the next schedule and never outlive it.
"""

from __future__ import annotations

from typing import Any, Callable

from engine.core import EngineCore, RequestStatus
from engine.core.engine_core import EngineStepResult
from engine.output_processor import OutputProcessor, OutputProcessorOutput


def step_front_end(engine_core: EngineCore, output_processor: OutputProcessor,
                   take_prompt_logprobs: Callable[[str], Any] | None,
                   take_pooler_output: Callable[[str], Any] | None = None,
                   ) -> tuple[EngineStepResult, OutputProcessorOutput]:
    """Run one core step and its output processing; ``take_prompt_logprobs`` and ``take_pooler_output`` are the
    executor's. A finished embedding request's output carries its pooled vector in ``pooler_output``."""
    result = engine_core.step()
    if result.scheduler_output is not None and result.scheduler_output.scheduled_new_reqs:
        output_processor.mark_scheduled(request.req_id for request in result.scheduler_output.scheduled_new_reqs)
    processed = output_processor.process_outputs(result.outputs, take_prompt_logprobs)
    if take_pooler_output is not None:
        for output in processed.request_outputs:
            if output.finished:
                output.pooler_output = take_pooler_output(output.request_id)
    if processed.reqs_to_abort:
        engine_core.scheduler.finish_requests(processed.reqs_to_abort, RequestStatus.FINISHED_STOPPED)
    return result, processed
