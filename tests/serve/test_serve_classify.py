"""A sequence classifier served with --runner pooling: ``/classify`` gives what ``LLM.classify`` gives, and on a
cross-encoder (one label) ``/score`` and ``/rerank`` give what ``LLM.score`` gives; bad inputs are 400s naming
the field, routes a model does not serve are 404s."""

import httpx
import pytest

from engine import LLM
from engine.async_llm import AsyncLLM
from engine.serve import ServerThread, build_app
from tests.engine.model_fixtures import CLASSIFIER_LABELS, save_classifier

ENGINE = dict(max_num_seqs=8, num_gpu_blocks=64, max_model_len=128, runner="pooling")
TEXTS = ["The scheduler frees a finished request's blocks.", "Bananas are yellow.", "paged attention"]


@pytest.fixture(scope="module")
def classifier_path(tmp_path_factory, tiny_model_path):
    return save_classifier(tiny_model_path, tmp_path_factory.mktemp("classifier"), len(CLASSIFIER_LABELS), seed=2)


@pytest.fixture(scope="module")
def reranker_path(tmp_path_factory, tiny_model_path):
    return save_classifier(tiny_model_path, tmp_path_factory.mktemp("reranker"), 1, seed=3)


def serve(path, name):
    engine = AsyncLLM(model=str(path), **ENGINE)
    return ServerThread(build_app(engine, name, shutdown_engine=True))


def test_classify_gives_the_offline_probabilities_and_names_a_bad_input(classifier_path):
    offline = LLM(model=str(classifier_path), **ENGINE).classify(TEXTS, use_tqdm=False)
    with serve(classifier_path, "tiny-classifier") as server:
        for route in ("/classify", "/v1/classify"):
            body = httpx.post(f"{server.url}{route}", json={"model": "tiny-classifier", "input": TEXTS},
                              timeout=60).json()
            assert [row["index"] for row in body["data"]] == [0, 1, 2]
            for row, want in zip(body["data"], offline):
                assert row["probs"] == pytest.approx(want.outputs.probs, abs=1e-6) and row["num_classes"] == 3
                assert row["label"] == CLASSIFIER_LABELS[max(range(3), key=want.outputs.probs.__getitem__)]
            assert body["usage"]["prompt_tokens"] == sum(len(output.prompt_token_ids) for output in offline)
        one = httpx.post(f"{server.url}/classify", json={"input": TEXTS[0]}, timeout=60).json()
        assert one["data"][0]["probs"] == pytest.approx(offline[0].outputs.probs, abs=1e-6)
        bad = httpx.post(f"{server.url}/classify", json={"input": [[5, 6], [5, 10**9]]}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]"
        embeddings = httpx.post(f"{server.url}/v1/embeddings", json={"input": "hi"}, timeout=60)
        assert embeddings.status_code == 404 and "sequence classifier" in embeddings.json()["error"]["message"]
        several = httpx.post(f"{server.url}/score", json={"text_1": "a", "text_2": "b"}, timeout=60)
        assert several.status_code == 400 and "has 3 labels" in several.json()["error"]["message"]


def test_a_cross_encoder_scores_and_reranks_as_llm_score_does(reranker_path):
    query, documents = "Which blocks are freed?", TEXTS
    offline = [output.outputs.score for output in LLM(model=str(reranker_path), **ENGINE).score(
        query, documents, use_tqdm=False)]
    with serve(reranker_path, "tiny-reranker") as server:
        scored = httpx.post(f"{server.url}/score", json={"text_1": query, "text_2": documents}, timeout=60).json()
        assert [row["score"] for row in scored["data"]] == pytest.approx(offline, abs=1e-6)
        ranked = httpx.post(f"{server.url}/v1/rerank", json={"query": query, "documents": documents, "top_n": 2},
                            timeout=60).json()["results"]
        best = sorted(range(3), key=lambda index: -offline[index])[:2]
        assert [row["index"] for row in ranked] == best
        assert [row["relevance_score"] for row in ranked] == pytest.approx([offline[i] for i in best], abs=1e-6)
        too_long = httpx.post(f"{server.url}/score", json={"text_1": "a", "text_2": ["b", "c " * 200]}, timeout=60)
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "text_2[1]"
        classified = httpx.post(f"{server.url}/classify", json={"input": "x"}, timeout=60).json()["data"][0]
        assert classified["num_classes"] == 1 and classified["label"] == "LABEL_0"


def test_classify_is_a_404_where_the_model_has_no_classification_head(tiny_model_path):
    with serve(tiny_model_path, "tiny-embed") as server:
        response = httpx.post(f"{server.url}/classify", json={"input": "hello"}, timeout=60)
        assert response.status_code == 404 and "no classification head" in response.json()["error"]["message"]
