"""The output processor (the seed's section 9): core outputs -> RequestOutputs.

Per step, for each EngineCoreOutput: detokenize incrementally, check stop strings, collect logprobs,
update timing, and build a RequestOutput when the request's output kind asks for one. Requests ended
by a stop string are returned in ``reqs_to_abort``: the caller must finish them in the core in the same
step (the core still believes they are running and would otherwise schedule them again).

Invariant: a request is tracked from ``add_request`` until its finished output is produced (or it is
aborted); outputs for request ids it does not track (e.g. the core's confirmation of a stop-string
abort) are ignored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.core.outputs import EngineCoreOutput
from engine.core.sampling_params import SamplingParams
from engine.output_processor.logprobs import TokenDecoder
from engine.output_processor.request_state import OutputKind, RequestState
from engine.outputs import RequestOutput


@dataclass(slots=True)
class OutputProcessorOutput:
    request_outputs: list[RequestOutput] = field(default_factory=list)
    reqs_to_abort: list[str] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer
        self.decode = TokenDecoder(tokenizer)
        self.request_states: dict[str, RequestState] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    sampling_params: SamplingParams, arrival_time: float | None = None,
                    output_kind: OutputKind = "final") -> None:
        if request_id in self.request_states:
            raise ValueError(f"request_id {request_id!r} is already being processed")
        self.request_states[request_id] = RequestState(
            request_id, prompt, prompt_token_ids, sampling_params, self.tokenizer, self.decode,
            time.monotonic() if arrival_time is None else arrival_time, output_kind)

    def abort_requests(self, request_ids) -> None:
        for request_id in request_ids:
            self.request_states.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def mark_scheduled(self, request_ids, now: float | None = None) -> None:
        """Record first-scheduled times (from a step's newly scheduled requests)."""
        now = time.monotonic() if now is None else now
        for request_id in request_ids:
            state = self.request_states.get(request_id)
            if state is not None and state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = now

    def process_outputs(self, engine_core_outputs: list[EngineCoreOutput],
                        take_prompt_logprobs: Callable[[str], Any] | None = None) -> OutputProcessorOutput:
        """``take_prompt_logprobs(request_id)`` fetches a request's prompt logprobs from the executor."""
        result = OutputProcessorOutput()
        now = time.monotonic()
        states = self.request_states
        for output in engine_core_outputs:
            state = states.get(output.request_id)
            if state is None:
                continue
            if (take_prompt_logprobs is not None and state.logprobs.wants_prompt_logprobs
                    and state.logprobs.prompt_logprobs is None):
                state.logprobs.set_prompt_logprobs(take_prompt_logprobs(output.request_id))
            if state.update(output, now):
                result.reqs_to_abort.append(output.request_id)
            request_output = state.make_request_output()
            if request_output is not None:
                result.request_outputs.append(request_output)
            if state.finished:
                del states[output.request_id]
        return result
