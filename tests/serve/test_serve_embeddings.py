"""``POST /v1/embeddings`` with the official openai client: the vectors equal ``LLM.embed``'s for every input
form, in float and base64; bad inputs are 400s naming the field and leave no block behind; a generating
server answers the route with a 404 and an embedding server so answers the generation routes, as current vLLM's
do (it registers each route only for the engines that serve it)."""

import base64

import httpx
import numpy as np
import openai
import pytest

from engine import LLM, PoolingParams
from engine.async_llm import AsyncLLM
from engine.serve import ServerThread, build_app
from engine.serve.cli import main

ENGINE = dict(max_num_seqs=8, num_gpu_blocks=64, max_model_len=128, max_num_batched_tokens=32,
              runner="pooling", pooler_config={"pooling_type": "MEAN"})
TEXTS = ["The capital of France is", "a longer input, long enough to take several prefill chunks of the "
         "thirty-two token budget this engine has, so that its positions are pooled across steps"]


@pytest.fixture(scope="module")
def embedding_server(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), **ENGINE)
    with ServerThread(build_app(engine, "tiny-embed", shutdown_engine=True)) as server:
        yield server, engine


@pytest.fixture(scope="module")
def offline(tiny_model_path):
    return LLM(model=str(tiny_model_path), **ENGINE)


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)


def assert_no_blocks_held(engine: AsyncLLM) -> None:
    stats = engine.get_stats()
    assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks, stats


def test_embeddings_equal_llm_embed(embedding_server, offline):
    server, engine = embedding_server
    token_ids = offline.get_tokenizer()(TEXTS[0]).input_ids
    want = [np.array(output.outputs.embedding) for output in offline.embed(TEXTS, use_tqdm=False)]
    with client_for(server) as client:
        for inputs, expected in ((TEXTS, want), (TEXTS[0], want[:1]), (token_ids, want[:1]),
                                 ([token_ids, token_ids], [want[0], want[0]])):
            response = client.embeddings.create(model="tiny-embed", input=inputs, encoding_format="float")
            assert response.model == "tiny-embed" and response.object == "list"
            assert [item.index for item in response.data] == list(range(len(expected)))
            for item, vector in zip(response.data, expected):
                assert np.allclose(item.embedding, vector, atol=1e-6, rtol=0)
        # The openai client asks for base64 by default and decodes the float32 values itself.
        response = client.embeddings.create(model="tiny-embed", input=TEXTS)
        for item, vector in zip(response.data, want):
            assert np.allclose(item.embedding, vector, atol=1e-6, rtol=0)
        num_tokens = sum(len(offline.get_tokenizer()(text).input_ids) for text in TEXTS)
        assert response.usage.prompt_tokens == response.usage.total_tokens == num_tokens
        truncated = client.embeddings.create(model="tiny-embed", input=TEXTS, dimensions=16, encoding_format="float")
        want_truncated = offline.embed(TEXTS, PoolingParams(dimensions=16), use_tqdm=False)
        for item, output in zip(truncated.data, want_truncated):
            assert len(item.embedding) == 16 and np.allclose(item.embedding, output.outputs.embedding, atol=1e-6)
            assert abs(np.linalg.norm(item.embedding) - 1) < 1e-5
    raw = httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64",
                                                          "user": "ignored"}, timeout=30).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, want[0], atol=1e-6, rtol=0)
    assert_no_blocks_held(engine)


@pytest.mark.parametrize("body,param,message", [
    ({"input": "x" * 400}, "input", "input has"),
    ({"input": ["ok", "x" * 400]}, "input[1]", "input[1] has"),
    ({"input": [[1, 2], [10**9]]}, "input[1]", "outside the vocabulary"),
    ({"input": ""}, "input", "input is empty"),
    ({"input": []}, "input", "input must not be empty"),
    ({"input": "ok", "dimensions": 10**6}, "dimensions", "dimensions must be <= the model's hidden size"),
    ({"input": "ok", "dimensions": 0}, "dimensions", None),
    ({"input": "ok", "encoding_format": "int8"}, "encoding_format", None),
    ({"input": "ok", "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens", "truncate_prompt_tokens must be"),
    ({"input": 5}, "input", None),
])
def test_bad_inputs_are_400s_naming_the_field(embedding_server, body, param, message):
    server, engine = embedding_server
    answer = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    if message is not None:
        assert message in error["message"], error
    assert_no_blocks_held(engine)


def test_truncate_prompt_tokens_keeps_the_last_tokens(embedding_server, offline):
    server, _ = embedding_server
    token_ids = list(range(5, 205))  # 200 tokens, past max_model_len 128
    answer = httpx.post(f"{server.url}/v1/embeddings", timeout=30,
                        json={"input": token_ids, "truncate_prompt_tokens": 50})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 50
    want = offline.embed([token_ids[-50:]], use_tqdm=False)[0].outputs.embedding
    assert np.allclose(answer.json()["data"][0]["embedding"], want, atol=1e-6)


def test_an_embedding_server_refuses_generation_and_a_generating_one_embeddings(embedding_server, tiny_model_path):
    server, _ = embedding_server
    for route, body in (("completions", {"prompt": "p", "max_tokens": 2}),
                        ("chat/completions", {"messages": [{"role": "user", "content": "p"}]})):
        answer = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=30)
        assert answer.status_code == 404 and "does not support" in answer.json()["error"]["message"], answer.text
    answer = httpx.post(f"{server.url}/v1/embeddings", json={"input": "p", "model": "other"}, timeout=30)
    assert answer.status_code == 404 and answer.json()["error"]["param"] == "model"
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=2, num_gpu_blocks=32, max_model_len=64)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as generating:
        answer = httpx.post(f"{generating.url}/v1/embeddings", json={"input": "p"}, timeout=30)
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["message"].startswith("The model does not support Embeddings API")


def test_pooling_flags(tiny_model_path, never_serve, capsys):
    with pytest.raises(AssertionError, match="would have started"):
        main(["--model", str(tiny_model_path), "--runner", "pooling", "--num-gpu-blocks", "16",
              "--max-model-len", "64", "--pooler-config", '{"pooling_type": "MEAN", "normalize": true}'])
    status = main(["--model", str(tiny_model_path), "--runner", "pooling", "--pooler-config", '{"pooling_type": "MAX"}'])
    assert status == 2
    assert "pooler_config.pooling_type must be one of ['LAST', 'MEAN', 'CLS'], got 'MAX'" in capsys.readouterr().err


def test_a_cancelled_embedding_is_aborted_and_frees_its_blocks(tiny_model_path):
    import asyncio

    from tests.serve.test_serve_async_llm import wait_idle

    # A 4-token budget: a 120-token prompt takes 30 steps, so the cancel lands while it is in flight.
    engine = AsyncLLM(model=str(tiny_model_path), **{**ENGINE, "max_num_batched_tokens": 4})

    async def run():
        long_prompt = list(range(5, 125))
        before = engine.get_stats().finished_requests["abort"]
        task = asyncio.ensure_future(engine.embed(long_prompt, request_id="to-cancel"))
        while engine.get_stats().num_running_reqs == 0 and not task.done():  # until it is being prefilled
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = await wait_idle(engine)
        assert stats.finished_requests["abort"] == before + 1
        assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks
        # The id is free again, and the engine still embeds.
        output = await engine.embed(long_prompt, request_id="to-cancel")
        assert len(output.prompt_token_ids) == 120 and len(output.outputs.embedding) == engine.hidden_size

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
