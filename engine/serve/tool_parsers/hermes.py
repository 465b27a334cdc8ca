"""The Hermes format (Nous Hermes 2 Pro, Qwen2.5 and others): each call is a JSON object
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``.

A block is a call when its inside is a JSON object with a string ``name`` and an ``arguments`` object (left out:
no arguments). A block that is not (malformed JSON, no name) stays in the content as written, tags included,
and so does a ``<tool_call>`` never closed: the client sees what the model said rather than losing it. Text
around and between the calls is content. A block ends at the first ``</tool_call>`` after its opening tag.
"""

from __future__ import annotations

import json
import re

from engine.serve.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, StreamingToolParser, ToolParser

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + "(.*?)" + re.escape(CLOSE), re.DOTALL)


def parse_call(inside: str) -> ParsedToolCall | None:
    """The call a block holds, or None when it is not one."""
    try:
        value = json.loads(inside)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class HermesToolParser(ToolParser):
    # What a block's inside is read with (Qwen3-Coder's XML calls share the blocks: qwen3_coder.py).
    parse_call = staticmethod(parse_call)

    def extract(self, text: str) -> ExtractedToolCalls:
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        position = 0
        for match in _BLOCK.finditer(text):
            call = self.parse_call(match.group(1))
            if call is None:
                continue  # stays in the content, with the text around it
            content.append(text[position:match.start()])
            calls.append(call)
            position = match.end()
        content.append(text[position:])
        return ExtractedToolCalls("".join(content), calls)

    def streaming(self) -> StreamingToolParser:
        return HermesStreamingParser(self.parse_call)


def _held_back(text: str) -> int:
    """How many characters at the end of ``text`` could be the start of an opening tag."""
    for length in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-length:]):
            return length
    return 0


class HermesStreamingParser(StreamingToolParser):
    """Outside a block, text goes out as content except a tail that could begin ``<tool_call>``; inside, it
    waits for ``</tool_call>``, then sends the whole call at once (its arguments in one delta)."""

    def __init__(self, read_call=parse_call) -> None:
        self._buffer = ""  # outside: the held-back tail; inside: the block's text after the opening tag
        self._inside = False
        self._read_call = read_call

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        self._buffer += delta
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        while True:
            if self._inside:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    break
                inside, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE):]
                self._inside = False
                call = self._read_call(inside)
                if call is None:
                    content.append(OPEN + inside + CLOSE)
                else:
                    calls.append(call)
            else:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _held_back(self._buffer)
                    content.append(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(OPEN):]
                self._inside = True
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        rest = (OPEN if self._inside else "") + self._buffer
        self._buffer, self._inside = "", False
        return rest, []
