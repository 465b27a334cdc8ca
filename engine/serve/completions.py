"""``POST /v1/completions``: one prompt (text or token ids) -> one choice, streamed or not.

Streaming sends one chunk per engine output that carries text or tokens (a chunk may hold several
tokens when the client reads slower than the engine generates; ``return_token_ids`` tells how many),
the finish reason in the last choice chunk, then, with ``stream_options.include_usage``, a chunk with
no choices and the usage, then ``[DONE]``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.core import SamplingParams
from engine.outputs import RequestOutput
from engine.serve.logprobs_format import completion_logprobs
from engine.serve.protocol import (COMPLETION_PARAM_NAMES, CompletionRequest, completion_sampling_params,
                                   single_prompt)
from engine.serve.state import ServerState, UsageCounter, engine_error
from engine.serve.streaming import ClientDisconnected, run_unless_disconnected, sse_response, stream_chunks


class _Choice(UsageCounter):
    """The choice being built from delta outputs: text, token ids, logprobs, and where it ended."""

    def __init__(self, params: SamplingParams, body: CompletionRequest) -> None:
        super().__init__()
        self.num_top_logprobs = params.logprobs
        self.return_token_ids = body.return_token_ids
        self.tokens_as_ids = body.return_tokens_as_token_ids
        self.text_offset = 0

    def delta(self, output: RequestOutput) -> dict[str, Any]:
        completion = output.outputs[0]
        self.count(output)
        logprobs = None
        if self.num_top_logprobs is not None and completion.logprobs is not None:
            logprobs, self.text_offset = completion_logprobs(completion.logprobs, completion.token_ids,
                                                             self.num_top_logprobs, self.text_offset,
                                                             self.tokens_as_ids)
        choice = {"index": 0, "text": completion.text, "logprobs": logprobs,
                  "finish_reason": completion.finish_reason if output.finished else None,
                  "stop_reason": completion.stop_reason if output.finished else None}
        if self.return_token_ids:
            choice["token_ids"] = list(completion.token_ids)
        return choice


async def create_completion(body: CompletionRequest, raw_request: Request, state: ServerState) -> Response:
    state.check_model(body.model)
    state.check_priority(body.priority)
    params = completion_sampling_params(body)
    prompt = state.prepare_prompt(single_prompt(body.prompt), params, param="prompt",
                                  param_names=COMPLETION_PARAM_NAMES)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "object": "text_completion", "created": int(time.time()),
              "model": body.model or state.model_name}
    outputs = state.engine.generate(prompt, params, request_id, priority=body.priority)
    choice = _Choice(params, body)
    if body.stream:
        return sse_response(stream_chunks(outputs, choice, header, body.include_usage, state.engine.abort,
                                          request_id))
    try:
        final = await run_unless_disconnected(raw_request, _collect(outputs, choice))
    except ClientDisconnected:
        state.engine.abort(request_id)
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    return JSONResponse({**header, "choices": [final], "usage": choice.usage()})


async def _collect(outputs: AsyncIterator[RequestOutput], choice: _Choice) -> dict[str, Any]:
    """Fold the deltas into one choice."""
    merged: dict[str, Any] | None = None
    async for output in outputs:
        delta = choice.delta(output)
        if merged is None:
            merged = delta
            continue
        merged["text"] += delta["text"]
        merged["finish_reason"], merged["stop_reason"] = delta["finish_reason"], delta["stop_reason"]
        if "token_ids" in merged:
            merged["token_ids"] += delta["token_ids"]
        if merged["logprobs"] is not None and delta["logprobs"] is not None:
            for key in merged["logprobs"]:
                merged["logprobs"][key] += delta["logprobs"][key]
    return merged
