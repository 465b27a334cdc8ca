"""gpt-oss's harmony answers through the server (``--reasoning-parser openai_gptoss --tool-call-parser openai``) with the
official openai client, on chat completions and the Responses API, streamed and whole. The tiny model's tokenizer has
no harmony special tokens, so its forced answers (guided_choice) carry the markers as text: what is tested is the
parsing and the routes; a real gpt-oss tokenizer's markers are special tokens, which these parsers keep in the text
(skip_special_tokens off, tests/serve/test_harmony_parsers.py)."""

import json

import openai
import pytest

from tests.serve.conftest import SERVER_ARGS, start_server

pytest.importorskip("xgrammar")

THOUGHT = "<|channel|>analysis<|message|>Need the weather.<|end|>"
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Oslo"}')
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 4 degrees."
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def client(tiny_model_path, tmp_path_factory):
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("harmony-log"),
                           [*SERVER_ARGS, "--reasoning-parser", "openai_gptoss", "--structured-outputs-in-reasoning",
                            "--enable-auto-tool-choice", "--tool-call-parser", "openai", "--max-model-len", "2048"])
    with openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=60.0) as client:
        yield client
    process.stop()


def chat(client, answer: str, **fields):
    return client.chat.completions.create(**{
        "model": "tiny", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_completion_tokens": 300,
        "temperature": 0.0, "extra_body": {"guided_choice": [answer]}, **fields})


def test_the_analysis_channel_is_reasoning_and_the_final_one_content(client):
    message = chat(client, THOUGHT + FINAL).choices[0].message
    assert (message.reasoning, message.content) == ("Need the weather.", "It is 4 degrees.")
    reasoning, content = "", ""
    for chunk in chat(client, THOUGHT + FINAL, stream=True):
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning", None) or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == ("Need the weather.", "It is 4 degrees.")


def test_a_call_to_a_function_is_a_tool_call(client):
    choice = chat(client, THOUGHT + CALL, tools=[WEATHER]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.reasoning == "Need the weather."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    assert not choice.message.content
    streamed = [call for chunk in chat(client, THOUGHT + CALL, tools=[WEATHER], stream=True)
                for choice in chunk.choices for call in (choice.delta.tool_calls or [])]
    assert [call.function.name for call in streamed] == ["get_weather"]


def test_the_responses_api_gives_reasoning_and_function_call_items(client):
    response = client.responses.create(
        model="tiny", input="Weather in Oslo?", max_output_tokens=300, temperature=0.0,
        tools=[{"type": "function", **WEATHER["function"]}], extra_body={"guided_choice": [THOUGHT + CALL]})
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert response.output[0].content[0].text == "Need the weather."
    assert json.loads(response.output[1].arguments) == {"city": "Oslo"}
    final = client.responses.create(model="tiny", input="Weather in Oslo?", max_output_tokens=300, temperature=0.0,
                                    extra_body={"guided_choice": [THOUGHT + FINAL]})
    assert final.output_text == "It is 4 degrees."
