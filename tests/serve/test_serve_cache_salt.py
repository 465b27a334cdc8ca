"""vLLM's per-request options for shared engines: ``cache_salt`` (prefix-cache hits only among requests of the same
salt: in ``LLM.generate`` dict prompts and on every generation route) and ``allowed_token_ids`` / ``bad_words``."""

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM
from engine.serve import ServerThread, build_app

PROMPT = "a prompt long enough to fill a few blocks of the cache, " * 3


def test_llm_hits_only_among_requests_of_the_same_salt(tiny_model_path):
    llm = LLM(model=str(tiny_model_path), max_model_len=256, block_size=16)
    params = SamplingParams(max_tokens=1)

    def cached(**salt) -> int:
        return llm.generate([{"prompt": PROMPT, **salt}], params, use_tqdm=False)[0].num_cached_tokens

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-a") > 0
    assert cached(cache_salt="tenant-b") == 0 and cached() == 0  # another salt, or none, shares nothing
    assert cached() > 0
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string, got ''"):
        llm.generate([{"prompt": PROMPT, "cache_salt": ""}], params, use_tqdm=False)


@pytest.fixture(scope="module")
def client(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=8, num_gpu_blocks=256, max_model_len=512, block_size=16)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
            yield client


@pytest.mark.parametrize("route", ["completions", "chat", "responses"])
def test_every_route_takes_a_salt(client, route):
    def cached(salt: str) -> int:
        extra = {"cache_salt": salt}
        if route == "completions":
            usage = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, extra_body=extra).usage
            return usage.prompt_tokens_details.cached_tokens
        if route == "chat":
            usage = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                                   max_completion_tokens=1, extra_body=extra).usage
            return usage.prompt_tokens_details.cached_tokens
        usage = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=1, extra_body=extra).usage
        return usage.input_tokens_details.cached_tokens

    assert cached(f"{route}-1") == 0 and cached(f"{route}-1") > 0 and cached(f"{route}-2") == 0


def test_allowed_token_ids_and_bad_words(client):
    allowed = [10, 11, 12]
    response = client.completions.create(model="tiny", prompt="x", max_tokens=12, temperature=1.0, seed=1,
                                         extra_body={"allowed_token_ids": allowed, "ignore_eos": True,
                                                     "return_token_ids": True})
    assert set(response.choices[0].token_ids) <= set(allowed)
    plain = client.completions.create(model="tiny", prompt="x", max_tokens=12, temperature=0.0,
                                      extra_body={"ignore_eos": True})
    assert plain.choices[0].text.startswith(" have")  # the tiny model's greedy answer to "x"
    banned = client.completions.create(model="tiny", prompt="x", max_tokens=12, temperature=0.0,
                                       extra_body={"ignore_eos": True, "bad_words": ["have"]})
    assert "have" not in banned.choices[0].text


def test_bad_values_are_400s(client):
    base = client.base_url
    for body, param in [({"prompt": "x", "cache_salt": ""}, "cache_salt"),
                        ({"prompt": "x", "cache_salt": "s", "use_beam_search": True, "n": 2}, "cache_salt"),
                        ({"prompt": "x", "allowed_token_ids": [99999]}, "allowed_token_ids")]:
        answer = httpx.post(f"{base}completions", json=body, timeout=10)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
