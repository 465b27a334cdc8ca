"""Background responses (``background: true``, OpenAI's and vLLM's): the request is answered at once with the response
``queued``, the answer is generated after, and the client reads it back with ``GET /v1/responses/{id}`` (``in_progress``
with the output so far, then ``completed``, ``incomplete`` or ``failed``) or stops it with
``POST /v1/responses/{id}/cancel`` (``cancelled``: the engine request is aborted, its blocks freed, the output so far
kept).

A background response is stored from the start (the request must say ``store``); a request that continues it with
``previous_response_id`` before it has finished is a 400, since its output is not known yet. Cancelling a response
that has finished answers it as it is; one made in the foreground cannot be cancelled (400).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from engine.serve.errors import OpenAIError


class BackgroundResponses:
    def __init__(self) -> None:
        # Response id -> (its task, its _Turn), while it is generated; whether a stored response was made in the
        # background is its own "background" field (so nothing here outlives the store's memory of it).
        self._running: dict[str, tuple[asyncio.Task, Any]] = {}

    def start(self, turn, outputs: AsyncIterator, state) -> dict[str, Any]:
        """Store ``turn``'s response as queued and generate it in a task; returns the queued response."""
        queued = turn.response("queued")
        state.responses.put(queued, turn.input_items)
        self._running[turn.response_id] = (asyncio.create_task(self._generate(turn, outputs, state)), turn)
        return queued

    async def _generate(self, turn, outputs: AsyncIterator, state) -> None:
        try:
            async for output in outputs:
                turn.feed(output)
            final = turn.response(turn.output.status)
        except asyncio.CancelledError:
            # Closing the generator (the task's cancellation reaches it) aborted the engine request.
            final = turn.response("cancelled")
        except Exception as error:
            from engine.serve.state import engine_error  # state.py holds this class's instance: imported late

            final = turn.response("failed", engine_error(error))
        finally:
            self._running.pop(turn.response_id, None)
        state.responses.put(final, turn.input_items)

    def live(self, response_id: str) -> dict[str, Any] | None:
        """The response as it stands while it is generated (None once it has finished, or never ran here)."""
        running = self._running.get(response_id)
        if running is None:
            return None
        turn = running[1]
        return turn.response("in_progress" if turn.output.items else "queued", partial=True)

    def check_finished(self, response_id: str) -> None:
        """A 400 for continuing a response still being generated."""
        if response_id in self._running:
            raise OpenAIError(f"response {response_id!r} is still in progress; continue it once it has finished",
                              param="previous_response_id", code="response_in_progress")

    async def cancel(self, response_id: str, state) -> dict[str, Any]:
        running = self._running.get(response_id)
        if running is not None:
            task = running[0]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        stored = state.responses.get(response_id)
        if not stored.response.get("background"):
            raise OpenAIError(f"response {response_id!r} was not made in the background: only background responses "
                              "can be cancelled", param="response_id", code="not_cancellable")
        return stored.response
