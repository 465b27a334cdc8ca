"""Structured outputs through the server with the official openai client: OpenAI's ``response_format`` and
vLLM's ``guided_*`` and ``structured_outputs`` fields (sent with ``extra_body``), streamed and not, and the
400s that name the parameter at fault. The server's tiny model has random weights: well-formed answers are
the grammar's doing."""

import json
import re

import openai
import pytest

from tests.serve.serve_helpers import metric, wait_until_idle

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe the sky as JSON."}]
CHOICES = ["yes", "no", "maybe"]
PHONE = r"[0-9]{3}-[0-9]{4}"
# Compact JSON: a random model pads optional whitespace until max_tokens (response_format cannot say so).
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30.0) as client:
        yield client


def test_chat_response_format_json_schema(client):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=40, temperature=0.0, extra_body=COMPACT,
        response_format={"type": "json_schema", "json_schema": {"name": "sky", "schema": SCHEMA, "strict": True}})
    choice = response.choices[0]
    value = json.loads(choice.message.content)
    assert set(value) == {"ok", "color"} and isinstance(value["ok"], bool) and value["color"] in ("red", "green",
                                                                                                  "blue")
    assert choice.finish_reason == "stop"


def test_json_object_on_completions(client):
    # The openai client's completions take response_format as vLLM's servers do: in the body.
    response = client.completions.create(model="tiny", prompt="{", max_tokens=24, temperature=0.0,
                                         extra_body={"response_format": {"type": "json_object"}, **COMPACT})
    assert isinstance(json.loads(response.choices[0].text), dict), response.choices[0]


def test_guided_choice_on_completions(client):
    response = client.completions.create(model="tiny", prompt=["Is the cache full?", "Is it late?"],
                                         max_tokens=8, temperature=1.0, seed=1, n=2,
                                         extra_body={"guided_choice": CHOICES})
    assert len(response.choices) == 4
    assert all(choice.text in CHOICES and choice.finish_reason == "stop" for choice in response.choices)


def test_streams(client):
    chunks = list(client.completions.create(model="tiny", prompt="Call me at", max_tokens=16, temperature=0.0,
                                            stream=True, extra_body={"guided_regex": PHONE}))
    assert re.fullmatch(PHONE, "".join(chunk.choices[0].text for chunk in chunks if chunk.choices))
    assert chunks[-1].choices[0].finish_reason == "stop" and len(chunks) > 2  # streamed, not sent whole
    chat_chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=8, temperature=0.0, stream=True,
        extra_body={"structured_outputs": {"choice": CHOICES}}))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chat_chunks if chunk.choices) in CHOICES


@pytest.mark.parametrize("route,fields,param,message", [
    ("completions", {"extra_body": {"guided_json": {"type": "foo"}}}, "guided_json",
     "guided_json is not a valid JSON schema (Unsupported type \"foo\")"),
    ("completions", {"extra_body": {"guided_regex": "[0-9"}}, "guided_regex",
     "guided_regex is not a valid regular expression"),
    ("completions", {"extra_body": {"guided_grammar": "item ::= \"a\""}}, "guided_grammar",
     "guided_grammar is not a valid EBNF grammar"),
    ("completions", {"extra_body": {"guided_choice": []}}, "guided_choice",
     "guided_choice must be a non-empty list of non-empty strings"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema", "response_format.json_schema.schema is not a valid JSON schema"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema", "must be an object with a schema"),
    ("chat", {"response_format": {"type": "xml"}}, "response_format", "type is one of text, json_object"),
    ("chat", {"extra_body": {"structured_outputs": {"regex": "(a"}}}, "structured_outputs.regex",
     "structured_outputs.regex is not a valid regular expression"),
    ("chat", {"extra_body": {"structured_outputs": {"regex": "a", "choice": ["a"]}}}, "structured_outputs",
     "structured_outputs needs exactly one of json, regex, choice, grammar, json_object; got regex, choice"),
    ("chat", {"extra_body": {"structured_outputs": {"pattern": "a"}}}, "structured_outputs.pattern",
     "unknown field(s) ['pattern']"),
    ("chat", {"extra_body": {"structured_outputs": {"disable_any_whitespace": True}}}, "structured_outputs",
     "got none"),
    ("chat", {"response_format": {"type": "json_object"}, "extra_body": {"guided_json": SCHEMA}}, "response_format",
     "one way per request, got guided_json and response_format"),
    ("completions", {"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}}, "guided_choice",
     "got guided_regex and guided_choice"),
])
def test_bad_structured_requests_are_400s_naming_the_parameter(client, server, route, fields, param, message):
    with pytest.raises(openai.BadRequestError) as caught:
        if route == "completions":
            client.completions.create(model="tiny", prompt="x", max_tokens=2, **fields)
        else:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=2, **fields)
    error = caught.value.body
    assert error["param"] == param and message in error["message"], error
    assert not error["message"].startswith("prompt")
    # Nothing reached the engine: it serves the next request, and every block is free once it is done.
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].text is not None
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")
