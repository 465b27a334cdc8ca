"""``POST /v1/chat/completions``: messages -> the model's chat template -> ``n`` assistant messages.

The prompt is the tokenizer's ``apply_chat_template`` rendering (with the generation prompt), tokenized
without adding special tokens again: templates put BOS in themselves. Streaming chunks carry, per
choice, ``delta: {"role": "assistant", "content": ...}`` first, then ``{"content": ...}``; each choice's
last chunk has its finish reason; usage and ``[DONE]`` follow as for completions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.core import SamplingParams
from engine.chat_template import ChatTemplateError, NoChatTemplateError, render_chat
from engine.outputs import CompletionOutput, RequestOutput
from engine.serve.errors import OpenAIError
from engine.serve.logprobs_format import chat_logprobs
from engine.serve.protocol import ChatCompletionRequest, chat_param_names, chat_sampling_params
from engine.serve.state import ServerState, UsageCounter, engine_error
from engine.serve.streaming import ClientDisconnected, run_unless_disconnected, sse_response, stream_chunks


def render_chat_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    messages = [{"role": message.role, "content": message.text()} for message in body.messages]
    try:
        return render_chat(state.engine.get_tokenizer(), messages, body.add_generation_prompt)
    except NoChatTemplateError:
        raise OpenAIError("this model has no chat template; use /v1/completions", param="messages",
                          code="no_chat_template") from None
    except ChatTemplateError as error:
        raise OpenAIError(str(error), param="messages") from None


class _Messages(UsageCounter):
    """The assistant messages being built from delta outputs, one per choice index."""

    def __init__(self, params: SamplingParams, body: ChatCompletionRequest) -> None:
        super().__init__()
        self.num_top_logprobs = params.logprobs
        self.return_token_ids = body.return_token_ids
        self.tokens_as_ids = body.return_tokens_as_token_ids
        self.sent_role: set[int] = set()  # choice indices whose first chunk (with the role) has gone out

    def choices(self, output: RequestOutput) -> list[dict[str, Any]]:
        self.count(output)
        return [self._choice(completion) for completion in output.outputs]

    def _choice(self, completion: CompletionOutput) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": completion.text}
        if completion.index not in self.sent_role:
            delta = {"role": "assistant", **delta}
            self.sent_role.add(completion.index)
        logprobs = None
        if self.num_top_logprobs is not None and completion.logprobs is not None:
            logprobs = chat_logprobs(completion.logprobs, completion.token_ids, self.num_top_logprobs,
                                     self.tokens_as_ids)
        choice = {"index": completion.index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}
        if self.return_token_ids:
            choice["token_ids"] = list(completion.token_ids)
        return choice


async def create_chat_completion(body: ChatCompletionRequest, raw_request: Request, state: ServerState) -> Response:
    state.check_model(body.model)
    state.check_priority(body.priority)
    params = chat_sampling_params(body)
    prompt = state.prepare_prompt(render_chat_prompt(state, body), params, param="messages",
                                  param_names=chat_param_names(body))
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "created": int(time.time()), "model": body.model or state.model_name}
    outputs = state.engine.generate(prompt, params, request_id, priority=body.priority)
    messages = _Messages(params, body)
    if body.stream:
        chunk_header = {**header, "object": "chat.completion.chunk"}
        return sse_response(stream_chunks(outputs, messages, chunk_header, body.include_usage, state.engine.abort,
                                          request_id))
    try:
        choices = await run_unless_disconnected(raw_request, _collect(outputs, messages))
    except ClientDisconnected:
        state.engine.abort(request_id)
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    return JSONResponse({**header, "object": "chat.completion", "choices": choices, "usage": messages.usage()})


async def _collect(outputs: AsyncIterator[RequestOutput], messages: _Messages) -> list[dict[str, Any]]:
    """Fold the deltas into one message per choice index, in index order."""
    text: dict[int, list[str]] = {}
    content_logprobs: dict[int, list[dict[str, Any]]] = {}
    token_ids: dict[int, list[int]] = {}
    last: dict[int, dict[str, Any]] = {}
    async for output in outputs:
        for delta in messages.choices(output):
            index = delta["index"]
            last[index] = delta
            text.setdefault(index, []).append(delta["delta"]["content"])
            token_ids.setdefault(index, []).extend(delta.get("token_ids", []))
            if delta["logprobs"] is not None:
                content_logprobs.setdefault(index, []).extend(delta["logprobs"]["content"])
    choices = []
    for index in sorted(last):
        choice = {"index": index, "message": {"role": "assistant", "content": "".join(text[index])},
                  "logprobs": {"content": content_logprobs[index]} if index in content_logprobs else None,
                  "finish_reason": last[index]["finish_reason"], "stop_reason": last[index]["stop_reason"]}
        if messages.return_token_ids:
            choice["token_ids"] = token_ids[index]
        choices.append(choice)
    return choices
