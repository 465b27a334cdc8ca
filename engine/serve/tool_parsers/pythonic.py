"""Pythonic tool calls (vLLM's ``pythonic``: Llama 3.2, Llama 4 and others): the answer is a Python list of calls
with keyword arguments, ``[get_weather(city="Paris", days=2), get_time()]``.

The answer is read as calls only when, after whitespace, the whole of it is such a list: every element a call of a
plain (or dotted) name with keyword arguments whose values are Python literals (strings, numbers, booleans,
``None``, lists, dicts), which become the call's JSON arguments. Anything else is content as written; a streamed
answer that opens with ``[`` is held until it ends, then goes out as calls or as content.
"""

from __future__ import annotations

import ast
import json

from engine.serve.tool_parsers.base import (ExtractedToolCalls, ParsedToolCall, StreamingToolParser, ToolParser,
                                            WholeAnswerStreamingParser)


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _name(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def parse_calls(text: str) -> list[ParsedToolCall] | None:
    """The calls a whole answer holds, or None when it is not a list of calls only."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for element in tree.body.elts:
        if not isinstance(element, ast.Call) or element.args or _name(element.func) is None:
            return None
        arguments = {}
        for keyword in element.keywords:
            if keyword.arg is None:  # **kwargs
                return None
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                return None
        try:
            text_arguments = json.dumps(arguments, ensure_ascii=False)
        except TypeError:  # a set, a tuple key...: not JSON
            return None
        calls.append(ParsedToolCall(_name(element.func), text_arguments))
    return calls


def _opens_a_call(text: str) -> bool | None:
    """Whether ``text`` opens like a list of calls (None: only whitespace so far)."""
    return text.lstrip().startswith("[") if text.strip() else None


class PythonicToolParser(ToolParser):
    def extract(self, text: str) -> ExtractedToolCalls:
        calls = parse_calls(text) if text.lstrip().startswith("[") else None
        return ExtractedToolCalls("", calls) if calls else ExtractedToolCalls(text, [])

    def streaming(self) -> StreamingToolParser:
        return WholeAnswerStreamingParser(_opens_a_call, self.extract)
