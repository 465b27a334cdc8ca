"""Bad requests get a 400 in OpenAI's error shape naming the parameter, unknown routes a 404 in the
same shape; never a 500 or a hang, and the server keeps serving (every block free afterwards)."""

import json

import httpx
import openai
import pytest

from tests.serve.serve_helpers import metric, wait_until_idle

GOOD_COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
GOOD_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and body["error"]["param"] == param
    return body["error"]


@pytest.mark.parametrize("change,param,message", [
    ({"max_tokens": -1}, "max_tokens", "max_tokens must be an integer >= 1"),
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"max_tokens": "many"}, "max_tokens", "valid integer"),
    ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"temperature": -0.5}, "temperature", "greater than or equal to 0"),
    ({"top_p": 0}, "top_p", "greater than 0"),
    ({"n": 0}, "n", "greater than or equal to 1"),
    # Without vLLM's ceiling the server built 10**9 children's state in its event loop: no answer, tens of GB.
    ({"n": 10**9}, "n", "less than or equal to 16384"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": [7] * 600}, "prompt", "more than the engine allows"),
    ({"prompt": [7] * 500, "max_tokens": 100}, "max_tokens", "maximum context length is 512"),
    ({"prompt": [1, 2, 100_000]}, "prompt", "outside the vocabulary"),
    ({"prompt": ["a", ""]}, "prompt", "prompt[1]: prompt is empty"),
    ({"prompt": 12}, "prompt", "valid"),
    ({"stop": [""]}, "stop", "non-empty string"),
    ({"stream": "yes please"}, "stream", "valid boolean"),
    ({"logprobs": 50}, "logprobs", "less than or equal to 20"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias", "token ids"),
    ({"presence_penalty": 5}, "presence_penalty", "presence_penalty must be in [-2, 2]"),
    ({"suffix": "after"}, "suffix", "not supported"),
    # torch's Generator.manual_seed takes [-2**63, 2**64 - 1]; past that the engine step itself used to fail.
    ({"seed": 2**64}, "seed", "less than or equal to 18446744073709551615"),
    ({"seed": -(2**63) - 1}, "seed", "greater than or equal to -9223372036854775808"),
    # OpenAI's range is [-100, 100]; inf, NaN or 1e39 (inf in float32) made sampling emit arbitrary tokens.
    ({"logit_bias": {"5": 1e39}}, "logit_bias", "finite numbers in [-100, 100]"),
    ({"logit_bias": {"5": float("nan")}}, "logit_bias", "finite numbers in [-100, 100]"),
    ({"logit_bias": {"5": float("-inf")}}, "logit_bias", "finite numbers in [-100, 100]"),
    ({"logit_bias": {"5": 100.5}}, "logit_bias", "token '5' has 100.5"),
    ({"stop_token_ids": [7, 99999]}, "stop_token_ids", "[99999] outside the vocabulary"),
    ({"max_tokens": True}, "max_tokens", "valid integer"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    # The test server schedules fcfs: a priority would be ignored, so it is refused before anything runs.
    ({"priority": 1}, "priority", "priority 1 needs scheduling_policy='priority'"),
    ({"priority": "high"}, "priority", "valid integer"),
    ({"spaces_between_special_tokens": "no"}, "spaces_between_special_tokens", "valid boolean"),
    # Structured outputs that cannot be honoured (more in test_serve_structured_outputs.py).
    ({"response_format": {"type": "xml"}}, "response_format", "type is one of text, json_object, json_schema"),
    ({"guided_json": {"type": "foo"}}, "guided_json", "guided_json is not a valid JSON schema"),
    ({"guided_regex": "[ab"}, "guided_regex", "guided_regex is not a valid regular expression"),
    # What beam search would ignore is refused rather than ignored (more in test_serve_beam_search.py).
    ({"use_beam_search": True, "logprobs": 1}, "use_beam_search", "use_beam_search does not take logprobs"),
])
def test_bad_completion_parameters(server, change, param, message):
    # json.dumps, not httpx's json=, so that NaN and Infinity go out as the literals JSON parsers accept.
    response = httpx.post(f"{server.url}/v1/completions", content=json.dumps({**GOOD_COMPLETION, **change}),
                          headers={"Content-Type": "application/json"}, timeout=10)
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error" and message in error["message"], error


@pytest.mark.parametrize("change,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0].role"),
    ({"messages": "hi"}, "messages"),
    ({"max_completion_tokens": -3}, "max_completion_tokens"),
    # Past the context: the field the client set (the openai client sends max_completion_tokens), not max_tokens.
    ({"max_completion_tokens": 600}, "max_completion_tokens"),
    ({"max_completion_tokens": 600, "max_tokens": 2}, "max_completion_tokens"),
    ({"max_tokens": 600}, "max_tokens"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 99}, "top_logprobs"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    ({"logit_bias": {"99999": 1.0}}, "logit_bias"),
    ({"stop_token_ids": [99999]}, "stop_token_ids"),
    ({"max_tokens": True}, "max_tokens"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::= "}, "guided_grammar"),
    ({"structured_outputs": {"choice": "yes"}}, "structured_outputs.choice"),
    ({"echo": True}, "echo"),
    ({"use_beam_search": True, "n": 0}, "n"),
    ({"use_beam_search": True, "logprobs": True}, "use_beam_search"),
])
def test_bad_chat_parameters(server, change, param):
    response = httpx.post(f"{server.url}/v1/chat/completions", json={**GOOD_CHAT, **change}, timeout=10)
    error = assert_openai_error(response, 400, param)
    # The message names what the client has to change, not the prompt the check ran on.
    assert param in error["message"] and not error["message"].startswith("prompt"), error


@pytest.mark.parametrize("endpoint,change", [
    ("completions", {"seed": 2**64 - 1}),
    ("completions", {"seed": -(2**63)}),
    ("completions", {"priority": 0}),  # the default, valid under any policy
    ("completions", {"spaces_between_special_tokens": False, "skip_special_tokens": False}),
    ("completions", {"logit_bias": {"5": -100, "6": 100}}),
    ("completions", {"response_format": {"type": "text"}, "guided_json": None, "use_beam_search": False,
                     "prompt_logprobs": None}),
    ("completions", {"guided_choice": ["yes", "no"]}),
    ("chat/completions", {"response_format": {"type": "json_object"}}),
    ("chat/completions", {"tools": None, "functions": [], "response_format": {"type": "text"}}),
    ("chat/completions", {"messages": [{"role": "developer", "content": "be brief"},
                                       {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
])
def test_edge_values_openai_accepts_are_served(server, endpoint, change):
    good = GOOD_COMPLETION if endpoint == "completions" else GOOD_CHAT
    response = httpx.post(f"{server.url}/v1/{endpoint}", json={**good, **change, "temperature": 1.0}, timeout=10)
    assert response.status_code == 200, response.text


def test_a_bad_seed_does_not_fail_requests_in_flight(server):
    """An out-of-range seed used to raise inside the engine step, failing every request in it with a 500."""
    body = {**GOOD_COMPLETION, "max_tokens": 300, "ignore_eos": True, "stream": True, "return_token_ids": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # the request is running
        bad = httpx.post(f"{server.url}/v1/completions", json={**GOOD_COMPLETION, "seed": 2**64}, timeout=10)
        assert_openai_error(bad, 400, "seed")
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2], rest[-3:]
    assert len(rest) > 2  # tokens came after the bad request: the stream was in flight when it arrived
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")


@pytest.mark.parametrize("headers,status", [({}, 200), ({"Content-Type": "text/plain"}, 400)])
def test_json_body_without_a_json_content_type(server, headers, status):
    # httpx sends no Content-Type for bytes content unless told; a missing one is read as JSON.
    response = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "x", "max_tokens": 2}',
                          headers=headers, timeout=10)
    assert "content-type" not in response.request.headers or headers
    if status == 200:
        assert response.status_code == 200, response.text
    else:
        assert "Content-Type: application/json" in assert_openai_error(response, 400, None)["message"]


@pytest.mark.parametrize("content", [b'{"prompt": "x",', b"not json at all", b"[1, 2, 3]", b""])
def test_malformed_bodies(server, content):
    response = httpx.post(f"{server.url}/v1/completions", content=content,
                          headers={"Content-Type": "application/json"}, timeout=10)
    assert_openai_error(response, 400, None if content != b"" else response.json()["error"]["param"])


def test_unknown_routes_and_methods(server):
    error = assert_openai_error(httpx.get(f"{server.url}/v1/engines", timeout=10), 404, None)
    assert error["type"] == "not_found_error" and "/v1/engines" in error["message"]
    assert_openai_error(httpx.get(f"{server.url}/v1/completions", timeout=10), 405, None)


@pytest.mark.parametrize("route,body", [("/v1/completions", {**GOOD_COMPLETION, "model": "gpt-4"}),
                                        ("/v1/chat/completions", {**GOOD_CHAT, "model": "nope"}),
                                        ("/tokenize", {"model": "nope", "prompt": "hi"})])
def test_an_unknown_model_is_a_404_as_in_vllm(server, route, body):
    error = assert_openai_error(httpx.post(f"{server.url}{route}", json=body, timeout=10), 404, "model")
    assert error["type"] == "not_found_error" and error["code"] == "model_not_found"
    assert error["message"] == f"The model `{body['model']}` does not exist. This server serves 'tiny'."


def test_the_openai_client_raises_bad_request(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model="tiny", prompt="x", max_tokens=-5)
        assert raised.value.status_code == 400 and raised.value.body["param"] == "max_tokens"
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="unknown", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="tiny", prompt="x", n=0)
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="tiny", input="x")
        # The server still serves, and nothing leaked.
        assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].finish_reason
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_non_streaming_client_that_gives_up_is_aborted(server):
    before = metric(wait_until_idle(server.url), "servesim_requests_finished_total", finished_reason="abort")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", timeout=0.2,
                   json={"prompt": "a very long answer", "max_tokens": 500, "ignore_eos": True})
    after = wait_until_idle(server.url)
    assert metric(after, "servesim_requests_finished_total", finished_reason="abort") == before + 1
    assert metric(after, "servesim_kv_cache_free_blocks") == metric(after, "servesim_kv_cache_usable_blocks")


def test_vllm_detokenization_flags_reach_the_sampling_params():
    from engine.serve.protocol import CompletionRequest, completion_sampling_params

    params = completion_sampling_params(CompletionRequest(prompt="p", spaces_between_special_tokens=False,
                                                          skip_special_tokens=False))
    assert (params.spaces_between_special_tokens, params.skip_special_tokens) == (False, False)
