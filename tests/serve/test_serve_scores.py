"""vLLM's score and rerank on an embedding model: ``LLM.score`` and ``/score``, ``/v1/score``, ``/rerank``,
``/v1/rerank``, ``/v2/rerank`` give the cosine similarity of the texts' embeddings as ``LLM.embed`` computes them
(1:N and N:N), best first for a rerank; bad inputs are 400s naming the field, a generating server answers 404."""

import httpx
import numpy as np
import pytest

from engine import LLM
from engine.async_llm import AsyncLLM
from engine.serve import ServerThread, build_app

ENGINE = dict(max_num_seqs=8, num_gpu_blocks=64, max_model_len=128, max_num_batched_tokens=32,
              runner="pooling", pooler_config={"pooling_type": "MEAN", "normalize": False})
QUERY = "Which blocks does the scheduler free?"
DOCUMENTS = ["The scheduler frees a finished request's blocks.", "Bananas are yellow.",
             "Blocks freed by the scheduler return to the free queue.", "Which blocks does the scheduler free?"]


@pytest.fixture(scope="module")
def offline(tiny_model_path):
    return LLM(model=str(tiny_model_path), **ENGINE)


@pytest.fixture(scope="module")
def server(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), **ENGINE)
    with ServerThread(build_app(engine, "tiny-embed", shutdown_engine=True)) as server:
        yield server, engine


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def expected(offline):
    vectors = [output.outputs.embedding for output in offline.embed([QUERY, *DOCUMENTS], use_tqdm=False)]
    return [cosine(vectors[0], vector) for vector in vectors[1:]]


def test_llm_score_is_the_cosine_of_llm_embed_one_to_n_and_n_to_n(offline, expected):
    outputs = offline.score(QUERY, DOCUMENTS, use_tqdm=False)
    assert [output.outputs.score for output in outputs] == pytest.approx(expected, abs=1e-6)
    assert outputs[3].outputs.score == pytest.approx(1.0, abs=1e-6)  # the query against itself
    ids = offline.get_tokenizer()(QUERY).input_ids
    assert outputs[0].prompt_token_ids[:len(ids)] == ids
    pairwise = offline.score(DOCUMENTS[:2], [QUERY, QUERY], use_tqdm=False)
    assert [output.outputs.score for output in pairwise] == pytest.approx(expected[:2], abs=1e-6)
    with pytest.raises(ValueError, match=r"text_2 must hold one text for each of text_1's 2 .*got 3"):
        offline.score(DOCUMENTS[:2], DOCUMENTS[:3], use_tqdm=False)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_route_equals_llm_score(server, expected, path):
    url, engine = server[0].url, server[1]
    response = httpx.post(url + path, json={"model": "tiny-embed", "text_1": QUERY, "text_2": DOCUMENTS}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and [item["index"] for item in body["data"]] == [0, 1, 2, 3]
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=1e-6)
    assert body["usage"]["prompt_tokens"] > 0
    stats = engine.get_stats()
    assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_documents_best_first(server, expected, path):
    response = httpx.post(server[0].url + path, json={"model": "tiny-embed", "query": QUERY, "documents": DOCUMENTS,
                                                      "top_n": 3}, timeout=60)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    order = sorted(range(4), key=lambda index: -expected[index])[:3]
    assert [result["index"] for result in results] == order and order[0] == 3
    assert [result["document"]["text"] for result in results] == [DOCUMENTS[index] for index in order]
    assert [result["relevance_score"] for result in results] == pytest.approx([expected[i] for i in order], abs=1e-6)


@pytest.mark.parametrize("path, body, param", [
    ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/score", {"text_1": [], "text_2": "a"}, "text_1"),
    ("/score", {"text_1": "a", "text_2": ["a", "word " * 200]}, "text_2[1]"),
    ("/rerank", {"query": "word " * 200, "documents": ["a"]}, "query"),
    ("/rerank", {"query": "a", "documents": ["a"], "top_n": -1}, "top_n"),
])
def test_bad_inputs_are_400s_naming_the_field(server, path, body, param):
    url, engine = server[0].url, server[1]
    response = httpx.post(url + path, json={"model": "tiny-embed", **body}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text
    stats = engine.get_stats()
    assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks


def test_a_generating_server_has_no_score_or_rerank(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=2, num_gpu_blocks=16, max_model_len=64)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as server:
        for path, body in (("/v1/score", {"text_1": "a", "text_2": "b"}), ("/rerank", {"query": "a", "documents": ["b"]})):
            response = httpx.post(server.url + path, json=body, timeout=30)
            assert response.status_code == 404 and "--runner pooling" in response.json()["error"]["message"]
