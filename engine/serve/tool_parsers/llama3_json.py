"""Llama 3.1-3.3's JSON tool calls (vLLM's ``llama3_json``): an answer that is a call is a JSON object
``{"name": ..., "parameters": {...}}`` (``arguments`` is read too), several separated by ``;``, optionally after
``<|python_tag|>`` (a special token, usually absent from the text).

An answer is read as calls only when, after leading whitespace, it opens with ``{`` (or the tag) and the whole of it
is such objects; anything else (prose, a malformed or cut object, an object without a string ``name``) is
content as written. So a streamed answer that opens like a call is held back until it ends, and then goes out as
calls or, failing that, as content: the deltas then agree with the whole answer's parse.
"""

from __future__ import annotations

import json

from engine.serve.tool_parsers.base import (ExtractedToolCalls, ParsedToolCall, StreamingToolParser, ToolParser,
                                            WholeAnswerStreamingParser)

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


def _opens_a_call(text: str) -> bool | None:
    """Whether ``text`` opens like a call (None: too little of it to tell)."""
    stripped = text.lstrip()
    if not stripped or PYTHON_TAG.startswith(stripped):
        return None
    return stripped.startswith(("{", PYTHON_TAG))


def parse_calls(text: str) -> list[ParsedToolCall] | None:
    """The calls the whole answer holds, or None when it is not calls only."""
    rest = text.strip().removeprefix(PYTHON_TAG).strip()
    calls = []
    while rest:
        try:
            value, end = _DECODER.raw_decode(rest)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get("parameters", value.get("arguments", {}))
        if not isinstance(arguments, dict):
            return None
        calls.append(ParsedToolCall(value["name"], json.dumps(arguments, ensure_ascii=False)))
        rest = rest[end:].strip()
        if rest.startswith(";"):
            rest = rest[1:].strip()
        elif rest:
            return None
    return calls or None


class Llama3JsonToolParser(ToolParser):
    def extract(self, text: str) -> ExtractedToolCalls:
        calls = parse_calls(text) if _opens_a_call(text) else None
        return ExtractedToolCalls("", calls) if calls else ExtractedToolCalls(text, [])

    def streaming(self) -> StreamingToolParser:
        return WholeAnswerStreamingParser(_opens_a_call, self.extract)
