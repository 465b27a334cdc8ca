"""Tool calls written in a block between two markers, content around them: what most formats share (Hermes'
``<tool_call>`` blocks, GLM-4.5's, DeepSeek's and Kimi K2's call sections).

A format names its markers and how a block's inside reads (``read_block``: the calls it holds, or None when it is not
one of this format's blocks). A block that is not stays in the content as written, markers included, and so does a
block never closed: the client sees what the model said rather than losing it. A block ends at the first closing
marker after its opening one. Streamed, text outside a block goes out as content at once, except a tail that could
begin an opening marker; a block's calls go out together once it closes.
"""

from __future__ import annotations

import json
import re

from engine.serve.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, StreamingToolParser, ToolParser


class BlockToolParser(ToolParser):
    open_tag = ""
    close_tag = ""

    def read_block(self, inside: str) -> list[ParsedToolCall] | None:
        raise NotImplementedError

    def extract(self, text: str) -> ExtractedToolCalls:
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        position = 0
        block = re.compile(re.escape(self.open_tag) + "(.*?)" + re.escape(self.close_tag), re.DOTALL)
        for match in block.finditer(text):
            read = self.read_block(match.group(1))
            if read is None:
                continue  # stays in the content, with the text around it
            content.append(text[position:match.start()])
            calls.extend(read)
            position = match.end()
        content.append(text[position:])
        return ExtractedToolCalls("".join(content), calls)

    def streaming(self) -> StreamingToolParser:
        return BlockStreamingParser(self.open_tag, self.close_tag, self.read_block)


class BlockStreamingParser(StreamingToolParser):
    """Outside a block, text goes out as content except a tail that could begin the opening marker; inside, it waits
    for the closing one, then sends the block's calls at once."""

    def __init__(self, open_tag: str, close_tag: str, read_block) -> None:
        self._open, self._close, self._read_block = open_tag, close_tag, read_block
        self._buffer = ""  # outside: the held-back tail; inside: the block's text after the opening marker
        self._inside = False

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        self._buffer += delta
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        while True:
            if self._inside:
                end = self._buffer.find(self._close)
                if end < 0:
                    break
                inside, self._buffer = self._buffer[:end], self._buffer[end + len(self._close):]
                self._inside = False
                read = self._read_block(inside)
                if read is None:
                    content.append(self._open + inside + self._close)
                else:
                    calls.extend(read)
            else:
                start = self._buffer.find(self._open)
                if start < 0:
                    keep = _opening_prefix_length(self._buffer, self._open)
                    content.append(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(self._open):]
                self._inside = True
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        rest = (self._open if self._inside else "") + self._buffer
        self._buffer, self._inside = "", False
        return rest, []


def _opening_prefix_length(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def json_object_text(text: str) -> str | None:
    """``text`` as a call's arguments (a JSON object, written back compactly as JSON), or None when it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


class SchemaTypedArguments:
    """For formats whose argument values are text, typed by the request's tool schema as vLLM types them (Qwen3-Coder's
    and GLM-4.5's): a ``string`` parameter keeps its text; others are read as JSON, kept as text when they are not."""

    def __init__(self) -> None:
        self._types: dict[str, dict[str, str]] = {}  # function -> parameter -> its schema's type

    def use_tools(self, tools: list) -> None:
        for tool in tools:
            function = getattr(tool, "function", None) or (tool.get("function") if isinstance(tool, dict) else None)
            if function is None:
                continue
            name = getattr(function, "name", None) or (function.get("name") if isinstance(function, dict) else None)
            schema = getattr(function, "parameters", None) if not isinstance(function, dict) \
                else function.get("parameters")
            properties = (schema or {}).get("properties") or {}
            self._types[name] = {key: value.get("type") for key, value in properties.items()
                                 if isinstance(value, dict) and isinstance(value.get("type"), str)}

    def typed_value(self, function: str, parameter: str, text: str):
        text = text.strip("\n")
        if self._types.get(function, {}).get(parameter) == "string":
            return text
        try:
            return json.loads(text)
        except ValueError:
            return text
