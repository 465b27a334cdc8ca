"""Qwen3-Coder's tool calls (vLLM's ``qwen3_coder``): Hermes' ``<tool_call>`` blocks (hermes.py: content around
them, a block that is not a call kept as written) holding XML instead of JSON::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

A parameter's value is its text with the newlines around it trimmed, typed by the request's tool schema as vLLM
types it (block_calls.SchemaTypedArguments): a ``string`` parameter keeps its text; others, and parameters the schema
does not type, are read as JSON when they are JSON and kept as text otherwise.
"""

from __future__ import annotations

import json
import re

from engine.serve.tool_parsers.base import ParsedToolCall
from engine.serve.tool_parsers.block_calls import BlockToolParser, SchemaTypedArguments
from engine.serve.tool_parsers.hermes import CLOSE, OPEN

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3CoderToolParser(SchemaTypedArguments, BlockToolParser):
    open_tag, close_tag = OPEN, CLOSE

    def read_block(self, inside: str) -> list[ParsedToolCall] | None:
        """The call a block holds, or None when it is not one."""
        match = _FUNCTION.fullmatch(inside)
        if match is None:
            return None
        name, body = match.group(1).strip(), match.group(2)
        if _PARAMETER.sub("", body).strip():
            return None  # text between parameters: not this format
        arguments = {key.strip(): self.typed_value(name, key.strip(), value) for key, value in _PARAMETER.findall(body)}
        return [ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))]
