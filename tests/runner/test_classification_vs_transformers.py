"""Sequence classifiers (transformers' *ForSequenceClassification) in a pooling engine: LLM.classify's
probabilities equal transformers' softmax of the same checkpoint's logits, and LLM.score on a one-label
classifier (a cross-encoder) equals the sigmoid of its logit for the pair read as one prompt.

fp32 on the CPU; the checkpoints are the project's tiny Llama and a tiny Qwen2 with a seeded random score
head, saved by transformers itself. Chunked prefill and prefix caching must not change a probability.
"""

import pytest
import torch

from engine import LLM
from tests.engine.model_fixtures import CLASSIFIER_LABELS, mixed_prompts, save_classifier

ATOL = 1e-5
LABELS = CLASSIFIER_LABELS


def hf_probabilities(path, prompts: list[list[int]]) -> list[torch.Tensor]:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    with torch.no_grad():
        logits = [model(torch.tensor([prompt])).logits[0] for prompt in prompts]
    return [torch.sigmoid(row) if row.shape[-1] == 1 else torch.softmax(row, dim=-1) for row in logits]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def classifier(request, tmp_path_factory, tiny_llama_path, tiny_qwen2_path):
    source = tiny_llama_path if request.param == "llama" else tiny_qwen2_path
    return save_classifier(source, tmp_path_factory.mktemp(f"{request.param}-classifier"), len(LABELS), seed=11)


@pytest.mark.parametrize("config", [dict(enable_prefix_caching=True), dict(max_num_batched_tokens=32)])
def test_classify_matches_transformers(classifier, config):
    llm = LLM(model=str(classifier), runner="pooling", max_num_seqs=8, **config)
    assert llm.labels == LABELS
    prompts = mixed_prompts(llm.model_runner.vocab_size, seed=4, num_prompts=8)
    outputs = llm.classify([{"prompt_token_ids": prompt} for prompt in prompts], use_tqdm=False)
    for index, (output, want) in enumerate(zip(outputs, hf_probabilities(classifier, prompts))):
        got = torch.tensor(output.outputs.probs)
        assert output.outputs.num_classes == 3 and output.prompt_token_ids == prompts[index]
        assert torch.allclose(got, want, atol=ATOL, rtol=0), f"prompt {index}: {got} vs {want}"
    again = llm.classify([{"prompt_token_ids": prompt} for prompt in prompts], use_tqdm=False)  # a warm cache
    assert torch.allclose(torch.tensor([output.outputs.probs for output in again]),
                          torch.tensor([output.outputs.probs for output in outputs]), atol=ATOL, rtol=0)
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_a_classifier_refuses_to_generate_embed_or_score_with_several_labels(classifier):
    with pytest.raises(ValueError, match="runner='pooling'"):
        LLM(model=str(classifier))
    llm = LLM(model=str(classifier), runner="pooling")
    with pytest.raises(ValueError, match="it does not embed"):
        llm.embed("hello")
    with pytest.raises(ValueError, match="has 3 labels"):
        llm.score("a", "b")


def test_classify_needs_a_classifier(tiny_llama_path):
    with pytest.raises(ValueError, match="no classification head"):
        LLM(model=str(tiny_llama_path), runner="pooling").classify("hello")


def test_a_cross_encoder_scores_each_pair_as_one_prompt(tmp_path, tiny_llama_path):
    path = save_classifier(tiny_llama_path, tmp_path / "reranker", 1, seed=5)
    llm = LLM(model=str(path), runner="pooling")
    tokenizer = llm.get_tokenizer()
    query, documents = "what is paged attention?", ["blocks of keys and values", "a recipe for bread", "attention"]
    outputs = llm.score(query, documents, use_tqdm=False)
    pairs = [tokenizer(query, document)["input_ids"] for document in documents]
    want = hf_probabilities(path, pairs)
    assert [output.prompt_token_ids for output in outputs] == pairs
    assert [output.outputs.score for output in outputs] == pytest.approx([float(row[0]) for row in want], abs=ATOL)
    # Token ids on one side: the two sides concatenated.
    ids = llm.score([5, 6, 7], [[8, 9], [10]], use_tqdm=False)
    assert [output.prompt_token_ids for output in ids] == [[5, 6, 7, 8, 9], [5, 6, 7, 10]]
    assert [output.outputs.score for output in ids] == pytest.approx(
        [float(row[0]) for row in hf_probabilities(path, [[5, 6, 7, 8, 9], [5, 6, 7, 10]])], abs=ATOL)
