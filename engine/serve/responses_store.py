"""Responses kept in the server's memory, for ``previous_response_id``, ``GET /v1/responses/{id}`` and its
``input_items``.

A response is kept when its request says ``store`` (OpenAI's default: true) and it finished (completed or
incomplete; one that failed or whose client left is not). It keeps the conversation that led to it: the items of
its own input after those of its ``previous_response_id``, so a request that continues it is the whole
conversation again, as OpenAI's API treats one. Memory is bounded: past ``capacity`` responses the oldest is
forgotten, and a request that continues a forgotten (or deleted, or never stored) response is a 404 naming it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.serve.errors import OpenAIError
from engine.serve.responses_output import new_item_id

DEFAULT_CAPACITY = 1024


@dataclass
class StoredResponse:
    response: dict[str, Any]
    # The conversation before this response's output: earlier turns' input and output items, then its input.
    input_items: list[dict[str, Any]]

    def history(self) -> list[dict[str, Any]]:
        """The items a request continuing this response starts from."""
        return [*self.input_items, *self.response["output"]]


class ResponseStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"the responses store keeps at least one response, got capacity {capacity}")
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        # Input items get ids, as OpenAI's input_items list shows them.
        items = [item if "id" in item else {"id": new_item_id("msg" if item.get("type", "message") == "message"
                                                               else "item"), **item} for item in input_items]
        self._responses[response["id"]] = StoredResponse(response, items)
        while len(self._responses) > self.capacity:
            self._responses.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        stored = self._responses.get(response_id)
        if stored is None:
            raise OpenAIError(f"no response with id {response_id!r} is stored here (it was sent with store: "
                              f"false, deleted, or forgotten past the last {self.capacity})", status=404,
                              param=param, code="response_not_found")
        self._responses.move_to_end(response_id)  # continued or read: kept longer
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._responses[response_id]
