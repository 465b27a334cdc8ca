"""The Hermes format (Nous Hermes 2 Pro, Qwen2.5 and others): each call is a JSON object
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>`` (blocks as block_calls.py reads them).

A block is a call when its inside is a JSON object with a string ``name`` and an ``arguments`` object (left out:
no arguments). A block that is not (malformed JSON, no name) stays in the content as written, tags included,
and so does a ``<tool_call>`` never closed: the client sees what the model said rather than losing it. Text
around and between the calls is content. A block ends at the first ``</tool_call>`` after its opening tag.
"""

from __future__ import annotations

import json

from engine.serve.tool_parsers.base import ParsedToolCall
from engine.serve.tool_parsers.block_calls import BlockToolParser

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


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


class HermesToolParser(BlockToolParser):
    open_tag, close_tag = OPEN, CLOSE

    def read_block(self, inside: str) -> list[ParsedToolCall] | None:
        call = parse_call(inside)
        return None if call is None else [call]
