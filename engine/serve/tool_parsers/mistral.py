"""Mistral's tool calls (vLLM's ``mistral``): content, then ``[TOOL_CALLS]`` and the calls, in either of the two
forms Mistral's tokenizers write:

- a JSON array after the marker (tokenizers before v11: Mistral 7B v0.3, Mistral Small 3.0):
  ``[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, ...]``;
- a name and its ``[ARGS]`` per call (v11 and later: Mistral Small 3.2, Magistral, Devstral):
  ``[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]mul[ARGS]{"b": 2}``.

``[TOOL_CALLS]`` is a special token, which the answer's text keeps only when special tokens are not skipped: the
chat route asks for them for this parser (``keeps_special_tokens``), as vLLM does. What follows the first marker
must be calls only, else the whole answer stays content as written; a streamed answer is content up to a possible
marker, then held until it ends.
"""

from __future__ import annotations

import json

from engine.serve.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, StreamingToolParser, ToolParser

MARK, ARGS = "[TOOL_CALLS]", "[ARGS]"
_DECODER = json.JSONDecoder()


def _call(name, arguments) -> ParsedToolCall | None:
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


def parse_calls(text: str) -> list[ParsedToolCall] | None:
    """The calls after the first marker (``text`` starting there), or None when it is not calls only."""
    pieces = [piece.strip() for piece in text.split(MARK)[1:]]
    if len(pieces) == 1 and pieces[0].startswith("["):
        try:
            value, end = _DECODER.raw_decode(pieces[0])
        except ValueError:
            return None
        if pieces[0][end:].strip() or not isinstance(value, list):
            return None
        calls = [_call(item.get("name"), item.get("arguments", {})) if isinstance(item, dict) else None
                 for item in value]
    else:
        calls = []
        for piece in pieces:
            name, args, arguments = piece.partition(ARGS)
            try:
                value, end = _DECODER.raw_decode(arguments.strip()) if args else (None, 0)
            except ValueError:
                return None
            calls.append(_call(name.strip(), value) if not arguments.strip()[end:].strip() else None)
    return calls if calls and all(calls) else None


class MistralToolParser(ToolParser):
    keeps_special_tokens = True

    def extract(self, text: str) -> ExtractedToolCalls:
        start = text.find(MARK)
        calls = parse_calls(text[start:]) if start >= 0 else None
        return ExtractedToolCalls(text[:start], calls) if calls else ExtractedToolCalls(text, [])

    def streaming(self) -> StreamingToolParser:
        return MistralStreamingParser()


class MistralStreamingParser(StreamingToolParser):
    def __init__(self) -> None:
        self._held = ""  # a tail that may begin the marker, or everything from the marker on
        self._calling = False

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        self._held += delta
        if self._calling:
            return "", []
        start = self._held.find(MARK)
        if start >= 0:
            content, self._held, self._calling = self._held[:start], self._held[start:], True
            return content, []
        keep = next((length for length in range(min(len(self._held), len(MARK) - 1), 0, -1)
                     if MARK.startswith(self._held[-length:])), 0)
        content, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return content, []

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        held, self._held = self._held, ""
        calls = parse_calls(held) if self._calling else None
        return ("", calls) if calls else (held, [])
