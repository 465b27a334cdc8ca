"""``POST /v1/responses`` (OpenAI's Responses API), and the stored responses' routes.

A request is served as a chat completion of one choice (responses_protocol.py), and its answer's deltas become
output items (responses_output.py): unstreamed, one ``response`` object; streamed, server-sent events named by
their type (``event: response.output_text.delta``), from ``response.created`` and ``response.in_progress`` to
``response.completed`` (``response.incomplete`` when cut by ``max_output_tokens``), whose response is what the
same request answers unstreamed. An engine error after the stream started is an ``error`` event, then
``response.failed``. Kept responses (``store``, responses_store.py) are continued with ``previous_response_id``
and served by:

    GET    /v1/responses/{id}              the response (a background one as it stands: responses_background.py)
    GET    /v1/responses/{id}/input_items  the conversation's items before its output (``order``: asc or desc)
    POST   /v1/responses/{id}/cancel       stop a background response
    DELETE /v1/responses/{id}

``usage``: ``input_tokens`` (and ``input_tokens_details.cached_tokens``, the prefix-cache hit),
``output_tokens`` (``output_tokens_details.reasoning_tokens``: those of deltas that were all thought),
``total_tokens``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.outputs import RequestOutput
from engine.serve.chat import AssistantMessages, prepare_chat
from engine.serve.errors import OpenAIError
from engine.serve.responses_output import ResponseOutput
from engine.serve.responses_protocol import ResponsesRequest, input_items, to_chat_request
from engine.serve.state import ServerState, engine_error
from engine.serve.streaming import SSE_HEADERS, ClientDisconnected, run_unless_disconnected


@dataclasses.dataclass
class _Turn:
    """One response being made: what it answers and what it has become so far."""
    body: ResponsesRequest
    response_id: str
    created_at: int
    model: str
    input_items: list[dict[str, Any]]  # the conversation before its output, as stored
    messages: AssistantMessages
    # Token ids -> text as the request's output reads (None: no tokenizer, no reasoning tokens counted).
    decode: Any = None
    output: ResponseOutput = dataclasses.field(default_factory=ResponseOutput)

    def __post_init__(self) -> None:
        self.output.max_tool_calls = self.body.max_tool_calls

    def response(self, status: str, error: OpenAIError | None = None, partial: bool = False) -> dict[str, Any]:
        """The response object at ``status``; an unfinished one carries no output and usage, unless ``partial`` (a
        background response read while it is generated: the output so far)."""
        body = self.body
        usage = None
        finished = status not in ("queued", "in_progress")
        if finished:
            counted = self.messages.usage()
            usage = {"input_tokens": counted["prompt_tokens"],
                     "input_tokens_details": {"cached_tokens": counted["prompt_tokens_details"]["cached_tokens"]},
                     "output_tokens": counted["completion_tokens"],
                     "output_tokens_details": {"reasoning_tokens": self.num_reasoning_tokens()},
                     "total_tokens": counted["total_tokens"]}
        text_format = body.text.format if body.text is not None and body.text.format is not None else {"type": "text"}
        return {"id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
                "background": body.background, "error": None if error is None else {"code": error.code or "server_error",
                                                                          "message": error.message},
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
                "max_tool_calls": body.max_tool_calls,
                "metadata": body.metadata or {}, "model": self.model,
                "output": copy.deepcopy(self.output.items) if finished or partial else [],
                "parallel_tool_calls": body.parallel_tool_calls,
                "previous_response_id": body.previous_response_id,
                "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
                "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
                "text": {"format": text_format}, "tool_choice": body.tool_choice or "auto",
                "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
                "top_logprobs": body.top_logprobs, "top_p": 1.0 if body.top_p is None else body.top_p,
                "truncation": "disabled", "usage": usage, "user": body.user}

    def num_reasoning_tokens(self) -> int:
        """How many of the answer's first tokens it took to write the whole thought: the fewest whose text gives the
        reasoning parser all of it (the same however the tokens were grouped into deltas). 0 without a thought."""
        parser, tokens = self.messages.reasoning, self.output.token_ids
        if parser is None or self.decode is None:
            return 0
        thought = parser.extract(self.decode(tokens))[0]
        if not thought:
            return 0
        low, high = 1, len(tokens)  # the thought is whole after ``high`` tokens
        while low < high:
            middle = (low + high) // 2
            if parser.extract(self.decode(tokens[:middle]))[0] == thought:
                high = middle
            else:
                low = middle + 1
        return high

    def feed(self, output: RequestOutput) -> list[dict[str, Any]]:
        events = []
        for choice in self.messages.choices(output):
            events += self.output.feed(choice)
        return events


async def create_response(body: ResponsesRequest, raw_request: Request, state: ServerState) -> Response:
    lora_request = state.check_model(body.model)
    state.check_priority(body.priority)
    if body.previous_response_id is not None:
        state.background.check_finished(body.previous_response_id)
    history = (state.responses.get(body.previous_response_id, param="previous_response_id").history()
               if body.previous_response_id is not None else [])
    form = to_chat_request(body, history)
    try:
        prompt, params, mode = prepare_chat(form.request, state, lora_request)
    except OpenAIError as error:
        raise form.renamed(error) from None
    response_id = f"resp_{uuid.uuid4().hex}"
    messages = AssistantMessages(params, form.request, mode, state.reasoning_parser)
    messages.streaming = True  # one path for both: the final response is what the events built
    tokenizer = state.engine.get_tokenizer()
    decode = None if tokenizer is None else (
        lambda ids: tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens))
    turn = _Turn(body, response_id, int(time.time()), body.model or state.model_name, [*history, *input_items(body)],
                 messages, decode)
    outputs = state.engine.generate(prompt, params, response_id, priority=body.priority, lora_request=lora_request)
    if body.stream:
        return StreamingResponse(_events(outputs, turn, state), media_type="text/event-stream", headers=SSE_HEADERS)
    if body.background:
        return JSONResponse(state.background.start(turn, outputs, state))
    try:
        await run_unless_disconnected(raw_request, _consume(outputs, turn))
    except ClientDisconnected:
        state.engine.abort(response_id)
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    response = turn.response(turn.output.status)
    if body.store:
        state.responses.put(response, turn.input_items)
    return JSONResponse(response)


async def _consume(outputs: AsyncIterator[RequestOutput], turn: _Turn) -> None:
    async for output in outputs:
        turn.feed(output)


def _sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode("utf-8")


async def _events(outputs: AsyncIterator[RequestOutput], turn: _Turn, state: ServerState) -> AsyncIterator[bytes]:
    """The response's events; a request that did not finish (the client left, or it failed) is aborted."""
    finished = False
    events = turn.output
    try:
        yield _sse(events.event("response.created", response=turn.response("in_progress")))
        yield _sse(events.event("response.in_progress", response=turn.response("in_progress")))
        async for output in outputs:
            finished = output.finished
            for event in turn.feed(output):
                yield _sse(event)
        status = events.status
        response = turn.response(status)
        if turn.body.store:
            state.responses.put(response, turn.input_items)
        yield _sse(events.event("response.completed" if status == "completed" else "response.incomplete",
                                response=response))
    except Exception as error:
        failure = engine_error(error)
        yield _sse(events.event("error", code=failure.code, message=failure.message, param=failure.param))
        yield _sse(events.event("response.failed", response=turn.response("failed", failure)))
    finally:
        if not finished:
            state.engine.abort(turn.response_id)


def stored_response(state: ServerState, response_id: str) -> JSONResponse:
    live = state.background.live(response_id)
    return JSONResponse(live if live is not None else state.responses.get(response_id).response)


async def cancel_response(state: ServerState, response_id: str) -> JSONResponse:
    return JSONResponse(await state.background.cancel(response_id, state))


def stored_input_items(state: ServerState, response_id: str, order: str = "desc") -> JSONResponse:
    if order not in ("asc", "desc"):
        raise OpenAIError(f"order must be asc or desc, got {order!r}", param="order", code="invalid_value")
    items = list(state.responses.get(response_id).input_items)
    if order == "desc":  # OpenAI's default: newest first
        items.reverse()
    return JSONResponse({"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                         "last_id": items[-1]["id"] if items else None, "has_more": False})


def delete_response(state: ServerState, response_id: str) -> JSONResponse:
    state.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
