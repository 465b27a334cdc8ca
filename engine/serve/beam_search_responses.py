"""What both routes do with their beam searches once started (beam_search_completions.py, beam_search_chat.py).

The sequences are only known once a search ends, so with ``stream``, as in vLLM, every choice comes whole in
one chunk at the end (then the usage chunk when asked, then ``[DONE]``). A client that leaves cancels the
searches, which aborts their requests: no blocks stay held."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.beam_search import BeamSearchOutput
from engine.serve.state import engine_error, usage
from engine.serve.streaming import DONE_EVENT, ClientDisconnected, run_unless_disconnected, sse_event, sse_response

# Each route's choices from the finished searches: (outputs, streamed) -> choice dicts, in index order.
ChoicesOf = Callable[[list[BeamSearchOutput], bool], list[dict[str, Any]]]


async def beam_search_response(searches: asyncio.Future, raw_request: Request, *, header: dict[str, Any],
                               chunk_header: dict[str, Any], choices_of: ChoicesOf, stream: bool,
                               include_usage: bool, num_prompt_tokens: int,
                               response_fields: Callable[[list[BeamSearchOutput]], dict[str, Any]] | None = None
                               ) -> Response:
    """The response to ``searches`` (their gather): one JSON body, or the stream of whole choices.
    ``response_fields`` adds a route's own top-level fields to the JSON body."""
    if stream:
        return sse_response(_stream(searches, chunk_header, choices_of, include_usage, num_prompt_tokens))
    try:
        outputs: list[BeamSearchOutput] = await run_unless_disconnected(raw_request, searches)
    except ClientDisconnected:  # the searches were cancelled, which aborts their requests
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    return JSONResponse({**header, "choices": choices_of(outputs, False), "usage": _usage(outputs, num_prompt_tokens),
                         **(response_fields(outputs) if response_fields is not None else {})})


async def _stream(searches: asyncio.Future, chunk_header: dict[str, Any], choices_of: ChoicesOf,
                  include_usage: bool, num_prompt_tokens: int) -> AsyncIterator[bytes]:
    try:
        outputs = await searches
        for choice in choices_of(outputs, True):
            yield sse_event({**chunk_header, "choices": [choice], **({"usage": None} if include_usage else {})})
        if include_usage:
            yield sse_event({**chunk_header, "choices": [], "usage": _usage(outputs, num_prompt_tokens)})
        yield DONE_EVENT
    except Exception as error:
        yield sse_event(engine_error(error).to_dict())
        yield DONE_EVENT
    finally:
        searches.cancel()  # the client left mid-search: cancelling aborts the round's requests


def _usage(outputs: list[BeamSearchOutput], num_prompt_tokens: int) -> dict[str, Any]:
    num_completion_tokens = sum(len(sequence.logprobs) for output in outputs for sequence in output.sequences)
    return usage(num_prompt_tokens, num_completion_tokens, 0)
