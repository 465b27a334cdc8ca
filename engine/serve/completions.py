"""``POST /v1/completions``: a prompt (text or token ids), or a batch of them -> ``n`` choices per prompt,
streamed or not.

Streaming sends one chunk per choice per engine output that carries text or tokens (a chunk may hold
several tokens when the client reads slower than the engine generates; ``return_token_ids`` tells how
many), each choice's finish reason in its last chunk, then, with ``stream_options.include_usage``, a
chunk with no choices and the usage (the completion tokens of all choices), then ``[DONE]``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.core import SamplingParams
from engine.outputs import CompletionOutput
from engine.serve.logprobs_format import completion_logprobs
from engine.serve.prompt_batch import PromptOutput, merge_prompt_streams
from engine.serve.protocol import (COMPLETION_PARAM_NAMES, CompletionRequest, completion_prompts,
                                   completion_sampling_params)
from engine.serve.state import ServerState, UsageCounter, engine_error, usage
from engine.serve.streaming import ClientDisconnected, run_unless_disconnected, sse_response, stream_chunks


class _Choices:
    """The choices being built from delta outputs: text, token ids, logprobs, and where each ended. Prompt
    ``p``'s completion ``i`` is choice ``p * n + i`` (OpenAI's and vLLM's order for a batch of prompts)."""

    def __init__(self, params: SamplingParams, body: CompletionRequest, num_prompts: int) -> None:
        self.n = params.n
        self.num_top_logprobs = params.logprobs
        self.return_token_ids = body.return_token_ids
        self.tokens_as_ids = body.return_tokens_as_token_ids
        self.text_offsets: dict[int, int] = {}  # choice index -> characters of text sent so far
        self.usage_counters = [UsageCounter() for _ in range(num_prompts)]

    def choices(self, item: PromptOutput) -> list[dict[str, Any]]:
        self.usage_counters[item.prompt_index].count(item.output)
        return [self._choice(item.prompt_index * self.n + completion.index, completion)
                for completion in item.output.outputs]

    def usage(self) -> dict[str, Any]:
        """Every prompt's tokens and every choice's, summed."""
        return usage(sum(counter.num_prompt_tokens for counter in self.usage_counters),
                     sum(counter.num_tokens for counter in self.usage_counters),
                     sum(counter.num_cached_tokens for counter in self.usage_counters))

    def _choice(self, index: int, completion: CompletionOutput) -> dict[str, Any]:
        logprobs = None
        if self.num_top_logprobs is not None and completion.logprobs is not None:
            logprobs, self.text_offsets[index] = completion_logprobs(
                completion.logprobs, completion.token_ids, self.num_top_logprobs, self.text_offsets.get(index, 0),
                self.tokens_as_ids)
        choice = {"index": index, "text": completion.text, "logprobs": logprobs,
                  "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}
        if self.return_token_ids:
            choice["token_ids"] = list(completion.token_ids)
        return choice


async def create_completion(body: CompletionRequest, raw_request: Request, state: ServerState) -> Response:
    state.check_model(body.model)
    state.check_priority(body.priority)
    params = completion_sampling_params(body)
    batch = completion_prompts(body.prompt)
    prompts = [state.prepare_prompt(prompt, params, param="prompt", param_names=COMPLETION_PARAM_NAMES,
                                    label=None if len(batch) == 1 else f"prompt[{index}]")
               for index, prompt in enumerate(batch)]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "object": "text_completion", "created": int(time.time()),
              "model": body.model or state.model_name}
    request_ids = [request_id] if len(prompts) == 1 else [f"{request_id}-{index}" for index in range(len(prompts))]
    outputs = merge_prompt_streams([state.engine.generate(prompt, params, prompt_request_id, priority=body.priority)
                                    for prompt, prompt_request_id in zip(prompts, request_ids)])
    choices = _Choices(params, body, len(prompts))
    if body.stream:
        return sse_response(stream_chunks(outputs, choices, header, body.include_usage, state.engine.abort,
                                          request_ids))
    try:
        final = await run_unless_disconnected(raw_request, _collect(outputs, choices))
    except ClientDisconnected:
        state.engine.abort(request_ids)
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    return JSONResponse({**header, "choices": final, "usage": choices.usage()})


async def _collect(outputs: AsyncIterator[PromptOutput], choices: _Choices) -> list[dict[str, Any]]:
    """Fold the deltas into one choice per index, in index order."""
    merged: dict[int, dict[str, Any]] = {}
    try:
        async for item in outputs:
            for delta in choices.choices(item):
                choice = merged.get(delta["index"])
                if choice is None:
                    merged[delta["index"]] = delta
                    continue
                choice["text"] += delta["text"]
                choice["finish_reason"], choice["stop_reason"] = delta["finish_reason"], delta["stop_reason"]
                if "token_ids" in choice:
                    choice["token_ids"] += delta["token_ids"]
                if choice["logprobs"] is not None and delta["logprobs"] is not None:
                    for key in choice["logprobs"]:
                        choice["logprobs"][key] += delta["logprobs"][key]
    finally:
        await outputs.aclose()  # a failed prompt ends the merge: the other prompts' requests are aborted
    return [merged[index] for index in sorted(merged)]
