"""Server-sent events, and noticing that a client has gone.

A stream is ``data: <json>\\n\\n`` per chunk and ``data: [DONE]\\n\\n`` at the end (OpenAI's format). An
error after the response has started (status 200 already sent) is reported as one more ``data:``
event holding the OpenAI error object, then ``[DONE]``: the client sees it instead of a cut stream.

Client disconnects:
- streaming: starlette's ``StreamingResponse`` listens for ``http.disconnect`` while it streams and
  cancels the body iterator; the cancellation reaches ``AsyncLLM.generate``, which aborts the
  request, and the body iterator also aborts it explicitly in its ``finally``;
- non-streaming: ``run_unless_disconnected`` races the generation against the connection, so a
  client that gives up on a long completion does not leave it running to the end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

T = TypeVar("T")

DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


class ChunkFormatter(Protocol):
    """Turns each engine output into its choices (one per completion it carries), and reports the usage at
    the end."""

    def choices(self, output: Any) -> list[dict[str, Any]]: ...

    def usage(self) -> dict[str, Any]: ...


async def stream_chunks(outputs: AsyncIterator[Any], formatter: ChunkFormatter, header: dict[str, Any],
                        include_usage: bool, abort: Any, request_ids: str | list[str],
                        continuous_usage: bool = False) -> AsyncIterator[bytes]:
    """The SSE body shared by completions and chat: one chunk per choice per output (as vLLM and OpenAI send
    them), the usage chunk when asked, ``[DONE]``; an error after the start becomes one more event. With
    ``continuous_usage`` (vLLM's ``continuous_usage_stats``) every chunk carries the usage so far instead of null.
    A request that did not finish (the client went away and the response was cancelled, or it failed) is aborted
    on the way out."""
    finished = False
    try:
        async for output in outputs:
            # Every output carries new tokens or a finish (the core reports nothing else).
            finished = output.finished
            for choice in formatter.choices(output):
                chunk = {**header, "choices": [choice]}
                if include_usage:
                    chunk["usage"] = formatter.usage() if continuous_usage else None
                yield sse_event(chunk)
        if include_usage:
            yield sse_event({**header, "choices": [], "usage": formatter.usage()})
        yield DONE_EVENT
    except Exception as error:
        from engine.serve.state import engine_error

        yield sse_event(engine_error(error).to_dict())
        yield DONE_EVENT
    finally:
        if not finished:
            abort(request_ids)


class ClientDisconnected(Exception):
    pass


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read already, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, unless the client disconnects first: then ``work`` is cancelled and
    ClientDisconnected is raised."""
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work_task.cancel()
        raise
    finally:
        watcher.cancel()
    if work_task.done():
        return work_task.result()
    work_task.cancel()
    try:
        await work_task
    except asyncio.CancelledError:
        pass
    raise ClientDisconnected()
