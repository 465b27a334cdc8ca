"""GLM-4.5's tool calls (vLLM's ``glm45``): Hermes' ``<tool_call>`` blocks holding the function's name, then its
arguments as key and value pairs::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    <arg_key>days</arg_key>
    <arg_value>2</arg_value>
    </tool_call>

Values are typed by the request's tool schema (block_calls.SchemaTypedArguments). A block with anything else in it
(text between the pairs, a key without its value) is not a call and stays in the content.
"""

from __future__ import annotations

import json
import re

from engine.serve.tool_parsers.base import ParsedToolCall
from engine.serve.tool_parsers.block_calls import BlockToolParser, SchemaTypedArguments

_NAME = re.compile(r"\s*([^\s<]+)\s*(.*)", re.DOTALL)
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Glm45ToolParser(SchemaTypedArguments, BlockToolParser):
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def read_block(self, inside: str) -> list[ParsedToolCall] | None:
        match = _NAME.fullmatch(inside)
        if match is None:
            return None
        name, body = match.groups()
        if _PAIR.sub("", body).strip():
            return None
        arguments = {key.strip(): self.typed_value(name, key.strip(), value) for key, value in _PAIR.findall(body)}
        return [ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))]
