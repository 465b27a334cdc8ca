"""``POST /v1/chat/completions``: messages -> the model's chat template -> one assistant message.

The prompt is the tokenizer's ``apply_chat_template`` rendering (with the generation prompt), tokenized
without adding special tokens again: templates put BOS in themselves. Streaming chunks carry
``delta: {"role": "assistant", "content": ...}`` first, then ``{"content": ...}``; the last choice
chunk has the finish reason; usage and ``[DONE]`` follow as for completions.
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
from engine.serve.errors import OpenAIError
from engine.serve.logprobs_format import chat_logprobs
from engine.serve.protocol import ChatCompletionRequest, chat_param_names, chat_sampling_params
from engine.serve.state import ServerState, UsageCounter, engine_error
from engine.serve.streaming import ClientDisconnected, run_unless_disconnected, sse_response, stream_chunks


def render_chat_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    tokenizer = state.engine.get_tokenizer()
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise OpenAIError("this model has no chat template; use /v1/completions", param="messages",
                          code="no_chat_template")
    messages = [{"role": message.role, "content": message.text()} for message in body.messages]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=body.add_generation_prompt)
    except Exception as error:  # a template may raise on, e.g., roles it does not know
        raise OpenAIError(f"the chat template rejected the messages: {error}", param="messages") from None
    return {"prompt": text, "prompt_token_ids": list(tokenizer(text, add_special_tokens=False).input_ids)}


class _Message(UsageCounter):
    def __init__(self, params: SamplingParams, body: ChatCompletionRequest) -> None:
        super().__init__()
        self.num_top_logprobs = params.logprobs
        self.return_token_ids = body.return_token_ids
        self.tokens_as_ids = body.return_tokens_as_token_ids
        self.sent_role = False

    def delta(self, output: RequestOutput) -> dict[str, Any]:
        completion = output.outputs[0]
        self.count(output)
        delta: dict[str, Any] = {"content": completion.text}
        if not self.sent_role:
            delta = {"role": "assistant", **delta}
            self.sent_role = True
        logprobs = None
        if self.num_top_logprobs is not None and completion.logprobs is not None:
            logprobs = chat_logprobs(completion.logprobs, completion.token_ids, self.num_top_logprobs,
                                     self.tokens_as_ids)
        choice = {"index": 0, "delta": delta, "logprobs": logprobs,
                  "finish_reason": completion.finish_reason if output.finished else None,
                  "stop_reason": completion.stop_reason if output.finished else None}
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
    message = _Message(params, body)
    if body.stream:
        chunk_header = {**header, "object": "chat.completion.chunk"}
        return sse_response(stream_chunks(outputs, message, chunk_header, body.include_usage, state.engine.abort,
                                          request_id))
    try:
        choice = await run_unless_disconnected(raw_request, _collect(outputs, message))
    except ClientDisconnected:
        state.engine.abort(request_id)
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    return JSONResponse({**header, "object": "chat.completion", "choices": [choice], "usage": message.usage()})


async def _collect(outputs: AsyncIterator[RequestOutput], message: _Message) -> dict[str, Any]:
    text: list[str] = []
    content_logprobs: list[dict[str, Any]] | None = None
    token_ids: list[int] = []
    last: dict[str, Any] = {}
    async for output in outputs:
        last = message.delta(output)
        text.append(last["delta"]["content"])
        token_ids += last.get("token_ids", [])
        if last["logprobs"] is not None:
            content_logprobs = (content_logprobs or []) + last["logprobs"]["content"]
    choice = {"index": 0, "message": {"role": "assistant", "content": "".join(text)},
              "logprobs": None if content_logprobs is None else {"content": content_logprobs},
              "finish_reason": last.get("finish_reason"), "stop_reason": last.get("stop_reason")}
    if message.return_token_ids:
        choice["token_ids"] = token_ids
    return choice
