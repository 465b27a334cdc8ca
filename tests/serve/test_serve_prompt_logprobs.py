"""vLLM's ``prompt_logprobs`` and ``truncate_prompt_tokens`` extensions through the official openai client
(``extra_body``): the prompt's logprobs are the engine's (``LLM`` with ``SamplingParams(prompt_logprobs=k)``),
in vLLM's shape (per choice on completions, on the response on chat); a truncated prompt is exactly the
last k tokens, counted so in usage, and lets an over-long prompt be served."""

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from tests.serve.serve_helpers import metric, wait_until_idle

PROMPT_IDS = [5, 9, 14, 30, 31, 77, 120, 8, 8, 200, 301, 17]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a cache."}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30.0) as client:
        yield client


@pytest.fixture(scope="module")
def offline(tiny_model_path):
    return LLM(model=str(tiny_model_path), max_model_len=512)


def offline_prompt_logprobs(offline, prompt, k):
    output = offline.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k),
                              use_tqdm=False)[0]
    return output.prompt_token_ids, output.prompt_logprobs


def assert_matches_offline(served, token_ids, reference, k):
    """vLLM's shape: one entry per prompt token, the first null; each holds the prompt token's own entry and
    the top k (ranks 1..k), keyed by token id; values and ranks are the offline engine's."""
    assert len(served) == len(token_ids) and served[0] is None
    for position, (entries, token_id, expected) in enumerate(zip(served[1:], token_ids[1:], reference[1:]), 1):
        assert str(token_id) in entries, position
        assert len(entries) in (k, k + 1)
        assert sorted(entry["rank"] for entry in entries.values() if entry["rank"] <= k) == list(range(1, k + 1))
        for key, entry in entries.items():
            reference_entry = expected[int(key)]
            assert entry["logprob"] == pytest.approx(reference_entry.logprob, abs=1e-4)
            assert entry["rank"] == reference_entry.rank
            assert entry["decoded_token"] == reference_entry.decoded_token


def test_completion_prompt_logprobs_are_the_engines(client, offline):
    response = client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=2, temperature=0.0,
                                         extra_body={"prompt_logprobs": 3})
    choice = response.choices[0]
    token_ids, reference = offline_prompt_logprobs(offline, PROMPT_IDS, 3)
    assert_matches_offline(choice.prompt_logprobs, token_ids, reference, 3)
    assert choice.logprobs is None  # logprobs was not asked for: the generated tokens' are not sent
    # A text prompt: one entry per token the prompt tokenized into.
    text = client.completions.create(model="tiny", prompt="The scheduler picks the next batch", max_tokens=1,
                                     extra_body={"prompt_logprobs": 0})
    token_ids, reference = offline_prompt_logprobs(offline, "The scheduler picks the next batch", 0)
    assert len(token_ids) == text.usage.prompt_tokens
    assert_matches_offline(text.choices[0].prompt_logprobs, token_ids, reference, 0)


def test_not_asked_is_null_as_in_vllm(client, server):
    completion = httpx.post(f"{server.url}/v1/completions", timeout=10,
                            json={"model": "tiny", "prompt": "hi", "max_tokens": 1}).json()
    assert completion["choices"][0]["prompt_logprobs"] is None
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=10,
                      json={"model": "tiny", "messages": MESSAGES, "max_tokens": 1}).json()
    assert chat["prompt_logprobs"] is None and "prompt_logprobs" not in chat["choices"][0]


def test_echo_keeps_its_format_and_agrees_where_they_overlap(client):
    response = client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=1, temperature=0.0,
                                         echo=True, logprobs=1, extra_body={"prompt_logprobs": 4})
    choice = response.choices[0]
    served = choice.prompt_logprobs
    assert len(choice.logprobs.tokens) == len(PROMPT_IDS) + 1 and choice.logprobs.token_logprobs[0] is None
    for position, token_id in enumerate(PROMPT_IDS[1:], 1):
        assert choice.logprobs.token_logprobs[position] == pytest.approx(served[position][str(token_id)]["logprob"])
        assert len(choice.logprobs.top_logprobs[position]) <= 2  # echo's own top-1 (+ the token), not 4
        assert len(served[position]) in (4, 5)


def test_echo_with_logprobs_carries_them_too_as_in_vllm(client):
    # vLLM computes prompt logprobs at echo's top-k and returns what it computed on the choice.
    choice = client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=1, echo=True, logprobs=2).choices[0]
    assert len(choice.prompt_logprobs) == len(PROMPT_IDS) and choice.prompt_logprobs[0] is None
    for position, token_id in enumerate(PROMPT_IDS[1:], 1):
        assert choice.logprobs.token_logprobs[position] == pytest.approx(
            choice.prompt_logprobs[position][str(token_id)]["logprob"])


def test_prompt_token_ids_come_with_return_token_ids(client):
    prompts = [PROMPT_IDS, PROMPT_IDS[:4]]
    response = client.completions.create(model="tiny", prompt=prompts, max_tokens=3, n=2,
                                         extra_body={"return_token_ids": True})
    assert [choice.model_extra["prompt_token_ids"] for choice in response.choices] == [
        PROMPT_IDS, PROMPT_IDS, PROMPT_IDS[:4], PROMPT_IDS[:4]]
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=3, stream=True,
                                            extra_body={"return_token_ids": True, "ignore_eos": True}))
    carrying = [chunk.choices[0].model_extra.get("prompt_token_ids") for chunk in chunks]
    assert carrying[0] == PROMPT_IDS and not any(carrying[1:])


def test_every_choice_carries_its_prompts(client, offline):
    prompts = [PROMPT_IDS, PROMPT_IDS[:5]]
    response = client.completions.create(model="tiny", prompt=prompts, max_tokens=2, n=2, seed=3,
                                         extra_body={"prompt_logprobs": 2})
    assert [choice.index for choice in response.choices] == [0, 1, 2, 3]
    for choice in response.choices:
        prompt = prompts[choice.index // 2]
        token_ids, reference = offline_prompt_logprobs(offline, prompt, 2)
        assert_matches_offline(choice.prompt_logprobs, token_ids, reference, 2)


def test_chat_prompt_logprobs_are_on_the_response(client, server, offline):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=2, n=2,
                                              extra_body={"prompt_logprobs": 2})
    rendered = httpx.post(f"{server.url}/tokenize", json={"messages": MESSAGES}, timeout=10).json()["tokens"]
    assert len(rendered) == response.usage.prompt_tokens
    served = response.model_extra["prompt_logprobs"]
    token_ids, reference = offline_prompt_logprobs(offline, rendered, 2)
    assert_matches_offline(served, token_ids, reference, 2)
    assert all("prompt_logprobs" not in (choice.model_extra or {}) for choice in response.choices)


def test_streaming_refuses_them_as_vllm_does(client, server):
    for route, body in (("completions", {"prompt": "hi"}), ("chat/completions", {"messages": MESSAGES})):
        response = httpx.post(f"{server.url}/v1/{route}", timeout=10,
                              json={"model": "tiny", "max_tokens": 2, "stream": True, "prompt_logprobs": 1, **body})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "prompt_logprobs" and "not available when stream=true" in error["message"]
    # 0 asks only for the prompt tokens' own logprobs: vLLM lets it through with stream and sends none.
    chunks = list(client.completions.create(model="tiny", prompt="hi", max_tokens=2, stream=True,
                                            extra_body={"prompt_logprobs": 0}))
    assert chunks and all("prompt_logprobs" not in (choice.model_extra or {})
                          for chunk in chunks for choice in chunk.choices)


def test_truncation_keeps_exactly_the_last_k_tokens(client, offline):
    prompt = list(range(10, 40))
    response = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0.0, echo=True,
                                         logprobs=0, extra_body={"truncate_prompt_tokens": 7, "prompt_logprobs": 1,
                                                                 "return_token_ids": True})
    choice = response.choices[0]
    assert response.usage.prompt_tokens == 7
    token_ids, reference = offline_prompt_logprobs(offline, prompt[-7:], 1)
    assert token_ids == prompt[-7:]
    assert_matches_offline(choice.prompt_logprobs, token_ids, reference, 1)
    # vLLM's prompt_token_ids (return_token_ids) are the kept tokens; so is the echo, one logprob entry each.
    assert choice.model_extra["prompt_token_ids"] == prompt[-7:]
    assert len(choice.logprobs.tokens) == 7 + 2
    alone = client.completions.create(model="tiny", prompt=prompt[-7:], max_tokens=2, temperature=0.0,
                                      extra_body={"return_token_ids": True})
    assert choice.model_extra["token_ids"] == alone.choices[0].model_extra["token_ids"]


def test_chat_truncates_the_rendered_prompt(client, server):
    rendered = httpx.post(f"{server.url}/tokenize", json={"messages": MESSAGES}, timeout=10).json()["tokens"]
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=1,
                                              extra_body={"truncate_prompt_tokens": 5, "prompt_logprobs": 0,
                                                          "return_token_ids": True})
    assert response.usage.prompt_tokens == 5 and response.model_extra["prompt_token_ids"] == rendered[-5:]
    served = response.model_extra["prompt_logprobs"]
    assert [next(iter(entries)) if entries else None for entries in served] == [None] + [
        str(token_id) for token_id in rendered[-4:]]


def test_over_long_prompt_is_served_with_truncation_and_refused_without(client, server):
    long_prompt = [7, 8, 9] * 200  # 600 tokens, past the server's 512
    with pytest.raises(openai.BadRequestError, match="more than the engine allows"):
        client.completions.create(model="tiny", prompt=long_prompt, max_tokens=2)
    response = client.completions.create(model="tiny", prompt=long_prompt, max_tokens=2,
                                         extra_body={"truncate_prompt_tokens": 100})
    assert response.usage.prompt_tokens == 100 and response.usage.completion_tokens == 2
    # -1 keeps the engine's limit, 512 tokens, which leaves no room for 2 more: the context-length 400.
    with pytest.raises(openai.BadRequestError) as no_room:
        client.completions.create(model="tiny", prompt=long_prompt, max_tokens=2,
                                  extra_body={"truncate_prompt_tokens": -1})
    assert no_room.value.body["param"] == "max_tokens" and "512 in the prompt" in no_room.value.body["message"]
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")


@pytest.mark.parametrize("route,change,message", [
    ("completions", {"prompt_logprobs": -1}, "greater than or equal to 0"),
    ("completions", {"prompt_logprobs": 21}, "less than or equal to 20"),
    ("completions", {"prompt_logprobs": "2"}, "valid integer"),
    ("completions", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens must be None, -1"),
    ("completions", {"truncate_prompt_tokens": 513}, "truncate_prompt_tokens must be -1 or at most max_model_len "
                                                     "(512), got 513"),
    ("chat/completions", {"prompt_logprobs": 21}, "less than or equal to 20"),
    ("chat/completions", {"truncate_prompt_tokens": -2}, "truncate_prompt_tokens must be None, -1"),
    ("chat/completions", {"truncate_prompt_tokens": 600}, "at most max_model_len (512), got 600"),
])
def test_bad_values_are_400s_naming_the_field(server, route, change, message):
    body = {"model": "tiny", "max_tokens": 1, **({"prompt": "hi"} if route == "completions" else
                                                 {"messages": MESSAGES}), **change}
    response = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == next(iter(change)) and message in error["message"], error


def test_format_keeps_the_token_and_top_k_and_clamps_minus_infinity():
    from engine.outputs import Logprob
    from engine.serve.logprobs_format import prompt_logprobs_json

    # The engine may hold more than k (echo asked for more): only the token and ranks 1..k go out.
    position = {9: Logprob(float("-inf"), 40, "x"), 3: Logprob(-0.1, 1, "a"), 4: Logprob(-2.0, 2, "b")}
    assert prompt_logprobs_json([None, position], [1, 9], 1) == [
        None, {"9": {"logprob": -9999.0, "rank": 40, "decoded_token": "x"},
               "3": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}}]
    assert prompt_logprobs_json(None, [1, 9], 1) is None
