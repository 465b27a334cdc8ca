"""Without a server: the scanner of tool_choice required's JSON array, fed whole and split at every position,
and how a history with tool calls and the tools reach the offline model's chat template."""

import json

import pytest

from engine.models.synthetic_tokenizer import CHAT_TEMPLATE
from engine.serve.protocol import ChatCompletionRequest
from engine.serve.tool_call_array import ToolCallArrayScanner
from engine.serve.tool_prompt import template_messages, template_tools, with_tools_described

ARRAY = ('[ {"name": "get_weather", "parameters": {"city": "P,}a\\"ris", "days": [1, {"a": 2}]}} ,'
         '{"name":"say\\"hi","parameters":{}}]')


def scanned(pieces: list[str]) -> dict[int, list[str]]:
    scanner = ToolCallArrayScanner()
    calls: dict[int, list[str]] = {}
    for piece in pieces:
        for kind, index, value in scanner.feed(piece):
            entry = calls.setdefault(index, ["", ""])
            entry[0 if kind == "name" else 1] += value
    return calls


def test_the_scanner_reads_names_and_the_parameters_text():
    calls = scanned([ARRAY])
    assert [name for name, _ in calls.values()] == ["get_weather", 'say"hi']
    assert json.loads(calls[0][1]) == {"city": 'P,}a"ris', "days": [1, {"a": 2}]}
    assert json.loads(calls[1][1]) == {}


def test_the_scanner_does_not_depend_on_how_the_text_is_split():
    whole = scanned([ARRAY])
    for cut in range(len(ARRAY) + 1):
        assert scanned([ARRAY[:cut], ARRAY[cut:]]) == whole, cut
    assert scanned(list(ARRAY)) == whole


class Template:
    """What tool_prompt reads of a tokenizer: its template's source."""
    def __init__(self, source):
        self.chat_template = source


HISTORY = {"messages": [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "snow"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}


def test_a_template_without_tools_gets_them_written_in():
    body = ChatCompletionRequest.model_validate(HISTORY)
    tokenizer = Template(CHAT_TEMPLATE)
    messages = with_tools_described(template_messages(body, tokenizer), template_tools(body), tokenizer)
    assert messages[0]["role"] == "system" and '{"name": "get_weather", "parameters": {"type": "object"}}' \
        in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": '<tool_call>{"name": "get_weather", "arguments": '
                                                            '{"city": "Oslo"}}</tool_call>'}
    assert messages[3] == {"role": "tool", "content": "snow", "tool_call_id": "c1"}
    assert messages == with_tools_described(template_messages(body, tokenizer), template_tools(body), tokenizer)


@pytest.mark.parametrize("source", ["{{ tools }} {{ message.tool_calls }}", {"default": "x", "tool_use": "y"}])
def test_a_template_that_renders_tools_gets_them_as_they_are(source):
    body = ChatCompletionRequest.model_validate(HISTORY)
    tokenizer = Template(source)
    messages = with_tools_described(template_messages(body, tokenizer), template_tools(body), tokenizer)
    assert len(messages) == 3 and messages[1]["content"] is None
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}  # an object, for tojson
