"""What the executor returns after a step, and what the engine core reports per request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ModelRunnerOutput:
    """Sampled tokens for every request scheduled in the step.

    ``sampled_token_ids[req_id_to_index[req_id]]`` lists the tokens sampled for that request: usually
    one, none for a prefill chunk that does not reach the end of the prompt, and with speculative decoding
    the accepted drafts then one more token (1 to drafts + 1). The scheduler ignores tokens sampled for an
    incomplete prefill. ``spec_token_ids`` holds the drafts proposed after this step's tokens, by request id.
    """
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    # Opaque per-request payloads the front end understands (the runner's logprob tensors).
    logprobs: dict[str, Any] | None = None
    prompt_logprobs: dict[str, Any] | None = None
    # Pooling requests whose prompt completed this step: their pooled vectors (the front end's to read).
    pooler_output: dict[str, Any] | None = None
    # Requests whose KV load (SchedulerOutput.offload_loads) this step completed (vLLM: finished_recving).
    finished_kv_loads: list[str] = field(default_factory=list)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput([], {}, [])


@dataclass(slots=True)
class EngineCoreOutput:
    """One request's progress in one step."""
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None       # stop | length | abort | ignored | error
    stop_reason: int | str | None = None   # the stop token id that ended it, if any
    num_cached_tokens: int = 0
    status_message: str | None = None
    logprobs: Any = None
    prompt_logprobs: Any = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class SchedulerStats:
    """A snapshot of the scheduler after a step, for logs, metrics and traces."""
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    num_preempted_reqs: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Speculative decoding's counts so far (SpecDecodingStats.to_dict()), None when it is off.
    spec_decoding: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
