"""One choice's generated text as an assistant message with tool calls, whole or as streamed deltas.

Per tool mode (tool_calls.py):
- ``none``: the text is the content;
- ``named``: the text is the named function's arguments (the grammar made it so); content is null. Streamed:
  the first delta carries the call's id, type and name, every delta a fragment of ``arguments``;
- ``required``: the text is a JSON array of ``{"name", "parameters"}``; each becomes a call whose arguments
  are the ``parameters`` value's JSON text. Streamed: a call's id, type and name once its name is read, then
  its arguments as they are generated (tool_call_array.py). A text that is not the whole array (cut by
  ``max_tokens``) is returned as content, without calls, when not streamed;
- ``auto``: the server's parser splits calls from content (tool_parsers/). Streamed: content as soon as it
  cannot be the start of a call, each call in one delta once complete. With ``parallel_tool_calls: false`` only
  the first call is kept. Content that is only whitespace around calls is null in the whole message.

A choice that made a call and stopped (not cut by ``max_tokens``) finishes with ``tool_calls``.
"""

from __future__ import annotations

import json
from typing import Any

from engine.serve.tool_call_array import ToolCallArrayScanner
from engine.serve.tool_calls import ToolMode, new_tool_call_id
from engine.serve.tool_parsers import ParsedToolCall


def tool_call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    """A call as the message carries it; ``call_id``: the model's own id for it (Kimi K2's), else a new one."""
    return {"id": call_id or new_tool_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


class ChoiceToolOutput:
    """The ``none`` mode, and what every mode shares."""

    def __init__(self, mode: ToolMode) -> None:
        self.mode = mode
        self.called = False  # a call has gone out (streamed) or is in the message

    def stream(self, text: str, finished: bool) -> tuple[str | None, list[dict[str, Any]]]:
        """The content (None: none) and the ``delta.tool_calls`` entries of a streamed delta of text."""
        return text, []

    def message(self, text: str) -> dict[str, Any]:
        """The ``content`` and ``tool_calls`` of the whole message."""
        return {"content": text}

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.called and reason == "stop" else reason


class _NamedOutput(ChoiceToolOutput):
    def stream(self, text: str, finished: bool) -> tuple[str | None, list[dict[str, Any]]]:
        if not self.called:
            self.called = True
            return None, [{"index": 0, **tool_call(self.mode.name, text)}]
        return None, [{"index": 0, "function": {"arguments": text}}] if text else []

    def message(self, text: str) -> dict[str, Any]:
        self.called = True
        return {"content": None, "tool_calls": [tool_call(self.mode.name, text)]}


class _RequiredOutput(ChoiceToolOutput):
    def __init__(self, mode: ToolMode) -> None:
        super().__init__(mode)
        self._scanner = ToolCallArrayScanner()

    def stream(self, text: str, finished: bool) -> tuple[str | None, list[dict[str, Any]]]:
        deltas: list[dict[str, Any]] = []
        for kind, index, value in self._scanner.feed(text):
            if kind == "name":
                self.called = True
                deltas.append({"index": index, **tool_call(value, "")})
            elif deltas and deltas[-1]["index"] == index:
                deltas[-1]["function"]["arguments"] += value
            else:
                deltas.append({"index": index, "function": {"arguments": value}})
        return None, deltas

    def message(self, text: str) -> dict[str, Any]:
        try:
            json.loads(text)
        except ValueError:  # cut short: what was generated, as it is
            return {"content": text}
        self._scanner.feed(text)
        calls = [tool_call(call.name, "".join(call.arguments).strip()) for call in self._scanner.calls]
        self.called = bool(calls)
        return {"content": None, "tool_calls": calls}


class _AutoOutput(ChoiceToolOutput):
    def __init__(self, mode: ToolMode) -> None:
        super().__init__(mode)
        self._streaming = mode.parser.streaming()
        self._num_calls = 0

    def _kept(self, calls: list[ParsedToolCall]) -> list[ParsedToolCall]:
        return calls if self.mode.parallel else calls[:max(0, 1 - self._num_calls)]

    def stream(self, text: str, finished: bool) -> tuple[str | None, list[dict[str, Any]]]:
        content, calls = self._streaming.feed(text)
        if finished:
            rest, more = self._streaming.finish()
            content, calls = content + rest, calls + more
        deltas = []
        for call in self._kept(calls):
            deltas.append({"index": self._num_calls, **tool_call(call.name, call.arguments, call.id)})
            self._num_calls += 1
            self.called = True
        return content or None, deltas

    def message(self, text: str) -> dict[str, Any]:
        extracted = self.mode.parser.extract(text)
        calls = self._kept(extracted.tool_calls)
        if not calls:
            return {"content": extracted.content}
        self.called = True
        return {"content": extracted.content if extracted.content.strip() else None,
                "tool_calls": [tool_call(call.name, call.arguments, call.id) for call in calls]}


_OUTPUTS = {"none": ChoiceToolOutput, "named": _NamedOutput, "required": _RequiredOutput, "auto": _AutoOutput}


def choice_tool_output(mode: ToolMode) -> ChoiceToolOutput:
    return _OUTPUTS[mode.kind](mode)
