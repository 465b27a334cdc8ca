"""A response's output items, built from the chat route's streamed deltas, and the events that tell a streaming
client how they grow (OpenAI's Responses API streaming events).

One answer becomes, in order: a ``reasoning`` item (the reasoning parser's thought, as ``reasoning_text``), a
``message`` item (the content, as one ``output_text`` part) and a ``function_call`` item per call, in the order
the model wrote them. Whole and streamed responses come from the same deltas, so a streamed response's final
``response.completed`` carries exactly what the same request answers unstreamed.

Events per item: ``response.output_item.added``; for text, ``response.content_part.added``, a
``response.reasoning_text.delta`` or ``response.output_text.delta`` per delta, then ``...done``,
``response.content_part.done``; for a call, ``response.function_call_arguments.delta`` per fragment and
``.done``; then ``response.output_item.done``. Every event has the stream's next ``sequence_number``.

A message item opens with its first text that is not blank: the whitespace a model writes between its calls
would otherwise be an item of its own (chat's whole message drops it as ``null`` content); blank text before
other text is kept in front of it. An answer cut by ``max_output_tokens`` leaves its last item ``incomplete``. Calls past
``max_tool_calls`` are dropped.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
    """The output items of one response, fed the chat choice deltas of its single choice."""

    def __init__(self, max_tool_calls: int | None = None) -> None:
        self.max_tool_calls = max_tool_calls  # calls past it are dropped (None: no limit)
        self.items: list[dict[str, Any]] = []
        self.sequence_number = 0
        self.token_ids: list[int] = []  # the answer's tokens, in order (what the reasoning tokens are counted in)
        self.finish_reason: str | None = None
        self._open: dict[str, Any] | None = None  # the item still growing (the last in items)
        self._blank = ""  # blank content held until the message's first other text
        # Chat tool-call index -> its function_call item (None: dropped past max_tool_calls).
        self._calls: dict[int, dict[str, Any] | None] = {}

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return event

    def feed(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat choice delta (``{"delta": {...}, "logprobs", "finish_reason", "token_ids"}``)."""
        delta = choice["delta"]
        events: list[dict[str, Any]] = []
        reasoning, content = delta.get("reasoning") or "", delta.get("content") or ""
        self.token_ids.extend(choice.get("token_ids", ()))
        if reasoning:
            events += self._text("reasoning", reasoning, [])
        if content:
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            if content.strip() or (self._open is not None and self._open["type"] == "message"):
                events += self._text("message", self._blank + content, logprobs)
                self._blank = ""
            else:
                self._blank += content
        for call in delta.get("tool_calls") or []:
            events += self._call(call)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            events += self._close("incomplete" if self.finish_reason == "length" else "completed")
        return events

    @property
    def status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def output_text(self) -> str:
        return "".join(part["text"] for item in self.items if item["type"] == "message" for part in item["content"])

    def _open_item(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close("completed")
        self.items.append(item)
        self._open = item
        events.append(self.event("response.output_item.added", output_index=len(self.items) - 1,
                                 item=copy.deepcopy(item)))
        if item["type"] in ("reasoning", "message"):
            events.append(self.event("response.content_part.added", item_id=item["id"],
                                     output_index=len(self.items) - 1, content_index=0,
                                     part=copy.deepcopy(item["content"][0])))
        return events

    def _text(self, kind: str, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != kind:
            part = ({"type": "reasoning_text", "text": ""} if kind == "reasoning"
                    else {"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            item = {"id": new_item_id("rs" if kind == "reasoning" else "msg"), "type": kind, "status": "in_progress",
                    **({"summary": []} if kind == "reasoning" else {"role": "assistant"}), "content": [part]}
            events += self._open_item(item)
        item = self._open
        part = item["content"][0]
        part["text"] += text
        location = {"item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0}
        if kind == "reasoning":
            events.append(self.event("response.reasoning_text.delta", **location, delta=text))
        else:
            part["logprobs"] += logprobs
            events.append(self.event("response.output_text.delta", **location, delta=text, logprobs=logprobs))
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        function = call.get("function", {})
        if "id" in call and self.max_tool_calls is not None and len(self._calls) >= self.max_tool_calls:
            self._calls[call["index"]] = None  # past max_tool_calls: dropped, with its later fragments
            return events
        if self._calls.get(call["index"], "new") is None:
            return events
        if "id" in call:  # a new call: its id and name, maybe its first arguments
            item = {"id": new_item_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": call["id"], "name": function["name"], "arguments": ""}
            events += self._open_item(item)
            self._calls[call["index"]] = item
        item = self._calls[call["index"]]
        arguments = function.get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=self.items.index(item), delta=arguments))
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        """Close the open item (``status``: completed, or incomplete for one cut short)."""
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        index = self.items.index(item)
        events = []
        if item["type"] == "function_call":
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                     name=item["name"], arguments=item["arguments"]))
        else:
            part = item["content"][0]
            location = {"item_id": item["id"], "output_index": index, "content_index": 0}
            if item["type"] == "reasoning":
                events.append(self.event("response.reasoning_text.done", **location, text=part["text"]))
            else:
                events.append(self.event("response.output_text.done", **location, text=part["text"],
                                         logprobs=part["logprobs"]))
            events.append(self.event("response.content_part.done", **location, part=copy.deepcopy(part)))
        events.append(self.event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return events

