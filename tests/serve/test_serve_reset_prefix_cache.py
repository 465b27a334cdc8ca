"""Forgetting the prefix cache between runs (vLLM's ``reset_prefix_cache``): ``LLM.reset_prefix_cache()`` and the
development-mode route ``POST /reset_prefix_cache``, refused (409) while a request holds blocks, absent (404)
outside development mode."""

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM
from engine.serve import ServerThread, build_app

PROMPT = "the same long prompt, " * 8  # several full blocks: a second run hits them


def test_llm_forgets_its_prefixes(tiny_model_path):
    llm = LLM(model=str(tiny_model_path), max_model_len=256, block_size=16)
    params = SamplingParams(max_tokens=1)
    assert llm.generate([PROMPT], params, use_tqdm=False)[0].num_cached_tokens == 0
    assert llm.generate([PROMPT], params, use_tqdm=False)[0].num_cached_tokens > 0
    assert llm.reset_prefix_cache() is True
    assert llm.generate([PROMPT], params, use_tqdm=False)[0].num_cached_tokens == 0


@pytest.fixture
def dev_server(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=8, num_gpu_blocks=256, max_model_len=2048,
                      block_size=16)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True, dev_mode=True)) as server:
        yield server


def cached_tokens(client) -> int:
    response = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1)
    return response.usage.prompt_tokens_details.cached_tokens


def test_the_route_resets_between_runs_and_refuses_while_a_request_runs(dev_server):
    with openai.OpenAI(base_url=f"{dev_server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        cached_tokens(client)
        assert cached_tokens(client) > 0
        assert httpx.post(f"{dev_server.url}/reset_prefix_cache", timeout=10).status_code == 200
        assert cached_tokens(client) == 0
        stream = client.completions.create(model="tiny", prompt="a long one", max_tokens=1500, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))  # running: it holds blocks
        refused = httpx.post(f"{dev_server.url}/reset_prefix_cache", timeout=10)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "prefix_cache_in_use"
        stream.close()
        assert cached_tokens(client) > 0  # nothing was forgotten


def test_outside_development_mode_there_is_no_such_route(tiny_model_path, monkeypatch):
    monkeypatch.delenv("SERVESIM_SERVER_DEV_MODE", raising=False)
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=4, num_gpu_blocks=64, max_model_len=256)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as server:
        assert httpx.post(f"{server.url}/reset_prefix_cache", timeout=10).status_code == 404
