"""Tool calling through the server with the official openai client: tool_choice required and named (the
output constrained to the tools' schemas), auto with the hermes parser (started with --enable-auto-tool-choice
--tool-call-parser hermes), streamed and not, histories with calls and results, and the 400s. The tiny model
has random weights: only constrained output means anything, so auto's calls are forced with guided_choice."""

import json

import openai
import pytest

from tests.serve.conftest import SERVER_ARGS, start_server
from tests.serve.serve_helpers import metric, wait_until_idle

pytest.importorskip("xgrammar")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"}},
                   "required": ["city", "metric"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}  # no parameters: the arguments are {}
TOOLS = [WEATHER, CLOCK]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Compact JSON: a random model pads optional whitespace until max_tokens.
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}
HISTORY = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Oslo", "metric": true}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, snow"},
    {"role": "user", "content": "And in Paris?"},
]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def auto_server(tiny_model_path, tmp_path_factory):
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("auto-log"),
                           [*SERVER_ARGS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                            "--max-model-len", "2048"])  # the tools' system message and forced calls are long
    yield process
    process.stop()


@pytest.fixture(scope="module")
def auto_client(auto_server):
    with openai.OpenAI(base_url=f"{auto_server.url}/v1", api_key="x", max_retries=0, timeout=60.0) as client:
        yield client


def check_call(name: str, arguments: str) -> None:
    """The arguments parse as JSON and fit the named tool's schema (checked by hand: no jsonschema here)."""
    value = json.loads(arguments)
    if name == "get_time":
        assert value == {}
    else:
        assert name == "get_weather" and set(value) == {"city", "metric"}, (name, value)
        assert value["city"] in ("Paris", "Oslo") and isinstance(value["metric"], bool)


def check_message_calls(choice) -> list:
    assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
    calls = choice.message.tool_calls
    assert calls
    for call in calls:
        assert call.id.startswith("chatcmpl-tool-") and len(call.id) > len("chatcmpl-tool-") and call.type == "function"
        check_call(call.function.name, call.function.arguments)
    assert len({call.id for call in calls}) == len(calls)
    return calls


def streamed_calls(chunks) -> tuple[dict[int, dict], str | None, str]:
    """Fold streamed delta.tool_calls by index: the first entry of an index has its id, type and name."""
    calls: dict[int, dict] = {}
    content = []
    finish_reason = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content.append(choice.delta.content or "")
        finish_reason = choice.finish_reason or finish_reason
        for entry in choice.delta.tool_calls or []:
            if entry.index not in calls:
                # The server's ids, or the model's own (Kimi K2's functions.NAME:INDEX).
                assert entry.id.startswith(("chatcmpl-tool-", f"functions.{entry.function.name}:"))
                assert entry.type == "function" and entry.function.name
                calls[entry.index] = {"name": entry.function.name, "arguments": "", "id": entry.id}
            else:
                assert entry.id is None and not entry.function.name
            calls[entry.index]["arguments"] += entry.function.arguments or ""
    return calls, finish_reason, "".join(content)


@pytest.mark.parametrize("parallel", [True, False])
def test_required_gives_valid_calls(client, parallel):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel,
        max_completion_tokens=120, temperature=1.0, seed=3, n=3, extra_body=COMPACT)
    for choice in response.choices:
        calls = check_message_calls(choice)
        if not parallel:
            assert len(calls) == 1


def test_required_streams_calls(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        max_completion_tokens=120, temperature=0.0, stream=True, extra_body=COMPACT))
    calls, finish_reason, content = streamed_calls(chunks)
    assert finish_reason == "tool_calls" and content == "" and list(calls) == [0]
    check_call(calls[0]["name"], calls[0]["arguments"])
    # The arguments came in fragments as they were generated, not in one piece.
    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.tool_calls) > 2


@pytest.mark.parametrize("stream", [False, True])
def test_named_function(client, stream):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_completion_tokens=60, temperature=0.0, stream=stream,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, extra_body=COMPACT)
    if stream:
        calls, finish_reason, content = streamed_calls(response)
        assert finish_reason == "tool_calls" and content == "" and list(calls) == [0]
        assert calls[0]["name"] == "get_weather"
        check_call("get_weather", calls[0]["arguments"])
    else:
        [call] = check_message_calls(response.choices[0])
        assert call.function.name == "get_weather"


def test_history_with_calls_and_results_is_accepted(client, auto_client):
    for each in (client, auto_client):
        response = each.chat.completions.create(model="tiny", messages=HISTORY, tools=TOOLS,
                                                max_completion_tokens=4, temperature=0.0)
        assert response.choices[0].message.content is not None


def test_tools_reach_the_prompt_only_when_they_may_be_called(client, auto_client):
    def prompt_tokens(each, **fields):
        return each.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=1,
                                            **fields).usage.prompt_tokens
    plain = prompt_tokens(client)
    # The tiny model's template ignores tools: with tool_choice none (the default without the flags), nothing
    # is added; when the model may call them, a system message lists them.
    assert prompt_tokens(client, tools=TOOLS) == plain
    assert prompt_tokens(auto_client, tools=TOOLS) > plain
    assert prompt_tokens(auto_client, tools=TOOLS, tool_choice="none") == plain


FORCED = ('Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "metric": false}}</tool_call>'
          '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_parses_hermes_calls(auto_client, parallel):
    # guided_choice makes the random model write calls in the hermes format; the parser finds them.
    response = auto_client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, parallel_tool_calls=parallel, max_completion_tokens=400,
        temperature=0.0, extra_body={"guided_choice": [FORCED]})
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking. "
    names = [call.function.name for call in choice.message.tool_calls]
    assert names == (["get_weather", "get_time"] if parallel else ["get_weather"])
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Oslo", "metric": False}
    chunks = list(auto_client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, parallel_tool_calls=parallel, max_completion_tokens=400,
        temperature=0.0, stream=True, extra_body={"guided_choice": [FORCED]}))
    calls, finish_reason, content = streamed_calls(chunks)
    assert finish_reason == "tool_calls" and content == "Checking. "
    assert [call["name"] for call in calls.values()] == names


def test_auto_without_calls_is_content(auto_client):
    response = auto_client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                                   max_completion_tokens=8, temperature=0.0)
    choice = response.choices[0]
    assert choice.message.tool_calls is None and choice.message.content and choice.finish_reason == "length"


def test_auto_without_the_flags_names_them(client, server):
    for fields in ({"tool_choice": "auto"}, {}):
        if not fields:  # without a choice, the default is none: served
            client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_completion_tokens=2)
            continue
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_completion_tokens=2,
                                           **fields)
        error = caught.value.body
        assert error["param"] == "tool_choice" and "--enable-auto-tool-choice" in error["message"]
        assert "--tool-call-parser" in error["message"], error
    assert_engine_is_clean(client, server)


@pytest.mark.parametrize("fields,param,message", [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name",
     "missing required parameter"),
    ({"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools[0].type", "'function'"),
    ({"tools": [{"type": "function", "function": {"name": "two words"}}]}, "tools[0].function.name",
     "letters, digits, underscores or dashes"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters", "dictionary"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_mood"}}}, "tool_choice",
     "'get_mood', which is not in tools"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "tool_choice: must be one of none, auto, required"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice: needs tools"),
    ({"tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     'tool_choice "required" constrains the output to tool calls, so it cannot be combined with response_format'),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
      "guided_regex": "a+"}, "guided_regex", "cannot be combined with guided_regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}],
      "tool_choice": "required"}, "tools", "is not a valid JSON schema"),
    ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id", "needs the tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "content is required"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls",
     "only assistant messages carry tool_calls"),
])
def test_bad_tool_requests_are_400s_naming_the_field(client, server, fields, param, message):
    body = {"model": "tiny", "messages": MESSAGES, "max_completion_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.post("/chat/completions", body=body, cast_to=object)
    error = caught.value.body
    assert error["param"] == param and message in error["message"], error
    assert_engine_is_clean(client, server)


def assert_engine_is_clean(client, server) -> None:
    """Nothing reached the engine: it serves the next request, and every block is free once it is done."""
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].text is not None
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")


@pytest.mark.parametrize("parser, call", [
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo", "metric": true}}'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "metric": true}'),
    ("pythonic", '[get_weather(city="Oslo", metric=True)]'),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
                    "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>"),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>metric"
              "</arg_key>\n<arg_value>true</arg_value>\n</tool_call>"),
    ("deepseek_v31", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo", "metric": '
                     'true}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("kimi_k2", '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
                '{"city": "Oslo", "metric": true}<|tool_call_end|><|tool_calls_section_end|>'),
])
def test_auto_parses_json_calls_of_other_formats(tiny_model_path, tmp_path_factory, parser, call):
    """--tool-call-parser llama3_json (Llama 3.1-3.3's JSON calls), mistral ([TOOL_CALLS] and the calls, which the
    chat route keeps special tokens for) and qwen3_coder (XML in <tool_call> blocks, values typed by the tool's
    schema): the call comes back as a tool call, whole and streamed; prose stays content."""
    process = start_server(tiny_model_path, tmp_path_factory.mktemp(f"{parser}-log"),
                           [*SERVER_ARGS, "--enable-auto-tool-choice", "--tool-call-parser", parser,
                            "--max-model-len", "2048"])
    try:
        with openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=60.0) as other:
            response = other.chat.completions.create(
                model="tiny", messages=MESSAGES, tools=TOOLS, max_completion_tokens=300, temperature=0.0,
                extra_body={"guided_choice": [call]})
            choice = response.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
                ("get_weather", {"city": "Oslo", "metric": True})]
            chunks = list(other.chat.completions.create(
                model="tiny", messages=MESSAGES, tools=TOOLS, max_completion_tokens=300, temperature=0.0,
                stream=True, extra_body={"guided_choice": [call]}))
            calls, finish_reason, content = streamed_calls(chunks)
            assert finish_reason == "tool_calls" and not content
            assert [call["name"] for call in calls.values()] == ["get_weather"]
            if parser == "kimi_k2":  # the model's own id for the call, which its template writes back
                assert choice.message.tool_calls[0].id == calls[0]["id"] == "functions.get_weather:0"
            prose = other.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                                   max_completion_tokens=300, temperature=0.0,
                                                   extra_body={"guided_choice": ["It is sunny."]})
            assert prose.choices[0].message.content == "It is sunny." and not prose.choices[0].message.tool_calls
    finally:
        process.stop()
