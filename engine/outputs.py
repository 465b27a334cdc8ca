"""What the front ends return to users, shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``.

Logprobs follow vLLM's layout: one dict per generated position, ``{token_id: Logprob}``, holding the
sampled token and the top-k tokens (the sampled one may also be among the top-k, then it appears once).
Prompt logprobs have ``None`` for the first prompt token, which nothing predicts.
Times are ``time.monotonic()`` seconds, like vLLM's request metrics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # stop | length | abort | ignored | error
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    # Why the engine ended the request early (finish_reason "ignored" / "error"), for the user.
    status_message: str | None = None
    # An embedding request's pooled vector, on its finished output (engine/pooling_outputs.py wraps it).
    pooler_output: list[float] | None = None
