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
types it: a ``string`` parameter keeps its text, ``integer``, ``number``, ``boolean``, ``object`` and ``array`` ones
are read as JSON (kept as text when they are not); a parameter the schema does not type is read as JSON when it is
JSON and kept as text otherwise.
"""

from __future__ import annotations

import json
import re

from engine.serve.tool_parsers.base import ParsedToolCall
from engine.serve.tool_parsers.hermes import HermesToolParser

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _value(text: str, kind: str | None):
    text = text.strip("\n")
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


class Qwen3CoderToolParser(HermesToolParser):
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

    def parse_call(self, inside: str) -> ParsedToolCall | None:
        """The call a block holds, or None when it is not one."""
        match = _FUNCTION.fullmatch(inside)
        if match is None:
            return None
        name, body = match.group(1).strip(), match.group(2)
        if _PARAMETER.sub("", body).strip():
            return None  # text between parameters: not this format
        types = self._types.get(name, {})
        arguments = {key.strip(): _value(value, types.get(key.strip())) for key, value in _PARAMETER.findall(body)}
        return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))
