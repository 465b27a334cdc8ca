"""``/v1/responses`` (OpenAI's Responses API) through the official openai client: output items (reasoning, message,
function calls), streamed events whose final response is the unstreamed one, ``max_output_tokens`` cuts, usage
against the chat route's for the same conversation, tools (auto with hermes, required, named), ``text.format``,
logprobs, stored responses continued with ``previous_response_id`` (a function call's output sent back) and the
400s and 404s. The server runs ``--reasoning-parser qwen3`` (a thought only when the answer opens with
``<think>``) and ``--structured-outputs-in-reasoning``; the tiny model has random weights, so answers that mean
something are forced with guided_choice."""

import json

import httpx
import openai
import pytest

from tests.serve.conftest import SERVER_ARGS, start_server
from tests.serve.serve_helpers import metric, parse_metrics, wait_until_idle

pytest.importorskip("xgrammar")

ANSWER = "<think>compare the tenths</think>9.8 is larger."
WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                          "required": ["city"], "additionalProperties": False}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}  # a random model pads JSON with whitespace


@pytest.fixture(scope="module")
def responses_server(tiny_model_path, tmp_path_factory):
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("responses-log"),
                           [*SERVER_ARGS, "--reasoning-parser", "qwen3", "--structured-outputs-in-reasoning",
                            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "2048"])
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(responses_server):
    with openai.OpenAI(base_url=f"{responses_server.url}/v1", api_key="x", max_retries=0, timeout=60.0) as client:
        yield client


def forced(client, answer: str, **fields):
    extra_body = {"guided_choice": [answer], **fields.pop("extra_body", {})}
    return client.responses.create(**{"model": "tiny", "input": "Which is larger, 9.11 or 9.8?",
                                      "max_output_tokens": 200, "temperature": 0.0, "extra_body": extra_body,
                                      **fields})


def without_ids(items):
    return [{key: value for key, value in item.model_dump(exclude_none=True).items() if key not in ("id", "call_id")}
            for item in items]


def test_a_thought_and_an_answer_are_a_reasoning_item_and_a_message(client):
    response = forced(client, ANSWER)
    assert response.status == "completed" and response.object == "response" and response.id.startswith("resp_")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "compare the tenths"
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert response.output_text == "9.8 is larger."
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens


def test_the_stream_builds_the_response_the_request_answers_whole(client):
    whole = forced(client, ANSWER)
    events = list(forced(client, ANSWER, stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[0].response.status == "in_progress"
    assert events[1].type == "response.in_progress" and events[-1].type == "response.completed"
    final = events[-1].response
    assert without_ids(final.output) == without_ids(whole.output)
    # The same counts (the prefix cache may hit the second request's prompt: cached_tokens may differ).
    counts = [(usage.input_tokens, usage.output_tokens, usage.output_tokens_details.reasoning_tokens)
              for usage in (final.usage, whole.usage)]
    assert counts[0] == counts[1]
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    thought = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    assert (thought, text) == ("compare the tenths", "9.8 is larger.")
    added = [event.item.id for event in events if event.type == "response.output_item.added"]
    assert added == [item.id for item in final.output]


def test_max_output_tokens_leaves_the_response_incomplete(client):
    response = forced(client, ANSWER, max_output_tokens=12)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[-1].status == "incomplete" and response.usage.output_tokens == 12
    events = list(forced(client, ANSWER, max_output_tokens=12, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


def test_usage_and_prompt_match_the_chat_route_for_the_same_conversation(client):
    response = forced(client, "9.8", instructions="Answer with a number.")
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "Answer with a number."},
                                {"role": "user", "content": "Which is larger, 9.11 or 9.8?"}],
        max_completion_tokens=200, temperature=0.0, extra_body={"guided_choice": ["9.8"]})
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.output_text == chat.choices[0].message.content == "9.8"


def test_an_auto_tool_call_then_its_output_sent_back(client):
    response = forced(client, f"<think>need the weather</think>Let me check. {CALL}", tools=[WEATHER],
                      input="Weather in Oslo?")
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message", "function_call"]
    call = response.output[-1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}
    assert response.output_text == "Let me check. "
    follow_up = client.responses.create(
        model="tiny", previous_response_id=response.id, tools=[WEATHER], max_output_tokens=200, temperature=0.0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "4 degrees, snow"}],
        extra_body={"guided_choice": ["It is 4 degrees."]})
    assert follow_up.output_text == "It is 4 degrees." and follow_up.previous_response_id == response.id
    # The model saw the whole conversation, as the chat route renders it.
    chat = client.chat.completions.create(
        model="tiny", tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        max_completion_tokens=200, temperature=0.0, extra_body={"guided_choice": ["It is 4 degrees."]},
        messages=[{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": "Let me check. ", "tool_calls": [
                      {"id": call.call_id, "type": "function", "function": {"name": call.name,
                                                                            "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "4 degrees, snow"}])
    assert follow_up.usage.input_tokens == chat.usage.prompt_tokens
    items = client.responses.input_items.list(follow_up.id, order="asc").data
    assert [item.type for item in items] == ["message", "reasoning", "message", "function_call",
                                             "function_call_output"]


def test_required_and_named_tool_choices_make_calls(client):
    clock = {"type": "function", "name": "get_time"}
    required = client.responses.create(model="tiny", input="Weather?", tools=[WEATHER, clock], tool_choice="required",
                                       max_output_tokens=200, temperature=0.0, extra_body=COMPACT)
    assert required.output and all(item.type == "function_call" for item in required.output)
    assert {item.name for item in required.output} <= {"get_weather", "get_time"}
    events = list(client.responses.create(model="tiny", input="Weather?", tools=[WEATHER, clock], stream=True,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=200, temperature=0.0, extra_body=COMPACT))
    final = events[-1].response
    (call,) = final.output
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    streamed = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    assert streamed == call.arguments


def test_text_format_json_schema_constrains_the_answer(client):
    schema = {"type": "object", "properties": {"larger": {"enum": ["9.11", "9.8"]}}, "required": ["larger"],
              "additionalProperties": False}
    response = client.responses.create(model="tiny", input="Which is larger?", max_output_tokens=100,
                                       temperature=0.0, extra_body=COMPACT,
                                       text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    assert json.loads(response.output_text)["larger"] in ("9.11", "9.8")
    assert response.text.format.type == "json_schema"


def test_logprobs_of_the_answer(client):
    response = forced(client, "9.8 is larger.", include=["message.output_text.logprobs"], top_logprobs=2)
    logprobs = response.output[0].content[0].logprobs
    assert "".join(entry.token for entry in logprobs) == "9.8 is larger."
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in logprobs)


def test_stored_responses_are_read_and_deleted(client, responses_server):
    response = forced(client, "9.8")
    assert client.responses.retrieve(response.id).output_text == "9.8"
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    unstored = forced(client, "9.8", store=False)
    with pytest.raises(openai.NotFoundError) as error:
        forced(client, "9.8", previous_response_id=unstored.id)
    assert error.value.body["param"] == "previous_response_id"
    assert httpx.get(f"{responses_server.url}/v1/responses/{unstored.id}").status_code == 404


@pytest.mark.parametrize("fields, param", [
    ({"max_output_tokens": 5000}, "max_output_tokens"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"extra_body": {"n": 2}}, "n"),
    ({"input": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}, "input[1].message.role"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
])
def test_bad_requests_are_400s_naming_the_field(client, fields, param):
    body = {"model": "tiny", "input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(**body)
    assert error.value.body["param"] == param, error.value.body


def test_a_client_that_leaves_a_stream_leaves_nothing_behind(client, responses_server):
    stream = client.responses.create(model="tiny", input="go on", max_output_tokens=1000, temperature=0.0,
                                     stream=True, extra_body={"ignore_eos": True})
    for event in stream:
        if event.type == "response.output_text.delta":
            break
    aborted = metric(parse_metrics(httpx.get(f"{responses_server.url}/metrics").text),
                     "servesim_requests_finished_total", finished_reason="abort")
    stream.close()  # the request is aborted; its blocks come back
    samples = wait_until_idle(responses_server.url)
    assert metric(samples, "servesim_requests_finished_total", finished_reason="abort") == aborted + 1
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")


def test_a_background_response_is_read_back_once_generated(client):
    import time

    queued = forced(client, ANSWER, background=True)
    assert queued.status == "queued" and queued.background and queued.output == []
    deadline = time.monotonic() + 30
    response = client.responses.retrieve(queued.id)
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
        response = client.responses.retrieve(queued.id)
    assert response.status == "completed" and response.output_text == "9.8 is larger."
    assert without_ids(response.output) == without_ids(forced(client, ANSWER).output)
    with pytest.raises(openai.BadRequestError) as error:
        forced(client, ANSWER, background=True, store=False)
    assert error.value.body["param"] == "background"


def test_a_background_response_can_be_cancelled(client, responses_server):
    running = client.responses.create(model="tiny", input="go on", max_output_tokens=1500, temperature=0.0,
                                       background=True, extra_body={"ignore_eos": True})
    with pytest.raises(openai.BadRequestError) as error:  # its output is not known yet
        client.responses.create(model="tiny", input="and?", previous_response_id=running.id, max_output_tokens=2)
    assert error.value.body["code"] == "response_in_progress"
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled" and cancelled.usage.output_tokens < 1500
    assert client.responses.retrieve(running.id).status == "cancelled"
    samples = wait_until_idle(responses_server.url)  # the engine request was aborted: every block is back
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")
    foreground = forced(client, "9.8")
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.cancel(foreground.id)
    assert error.value.body["code"] == "not_cancellable"
