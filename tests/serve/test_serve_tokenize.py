"""vLLM's utility routes: /tokenize counts tokens as the completion routes will, /detokenize inverts it,
/version answers; bad input is a 400 naming the field."""

import httpx
import openai
import pytest

PROMPT = "Count the tokens of this prompt"


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30.0) as client:
        yield client


def test_tokenize_counts_as_the_completion_routes_do(server, client):
    tokenized = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, timeout=10).json()
    completion = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1)
    assert tokenized["count"] == len(tokenized["tokens"]) == completion.usage.prompt_tokens
    assert tokenized["max_model_len"] == 512
    bare = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT, "add_special_tokens": False,
                                                     "return_token_strs": True}, timeout=10).json()
    assert bare["count"] <= tokenized["count"] and len(bare["token_strs"]) == bare["count"]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": bare["tokens"]}, timeout=10).json()["prompt"]
    assert text.strip() == PROMPT
    messages = [{"role": "user", "content": "Hello"}]
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=10).json()
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert chat["count"] == answer.usage.prompt_tokens


@pytest.mark.parametrize("route, body, param", [
    ("/tokenize", {}, None),
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, None),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/detokenize", {"tokens": [1, 100_000]}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
])
def test_bad_requests_are_named(server, route, body, param):
    response = httpx.post(f"{server.url}{route}", json=body, timeout=10)
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["message"] and (param is None or error["param"] == param)


def test_version(server):
    assert httpx.get(f"{server.url}/version", timeout=10).json()["version"]
