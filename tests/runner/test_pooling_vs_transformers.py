"""Embeddings from LLM.embed equal transformers' base model (AutoModel, no LM head) pooled the same way.

fp32 on the CPU: the last hidden state (after the final norm) of each prompt run alone, pooled by the
last token, the mean or the first token, then L2-normalized; the engine's vectors must agree within
1e-5 for one batch of mixed-length prompts, with prefix caching, prompts cut into several chunks by a
small token budget, and a pool small enough to preempt. Also: ``dimensions`` truncates then renormalizes,
prefix-cache hits (LAST) give the vectors a cold cache gives, and a batch mixing a generation request
with pooling ones gives both the right tokens and the right vectors.
"""

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, PoolingParams, SamplingParams
from engine.request_inputs import Prompt
from tests.engine.model_fixtures import hf_greedy, load_hf_model, mixed_prompts

ATOL = 1e-5
CONFIGS = {
    "prefix_caching": dict(enable_prefix_caching=True),
    "chunked_prefill": dict(max_num_batched_tokens=32, enable_prefix_caching=False),
    "preemption": dict(num_gpu_blocks=8, max_num_batched_tokens=48, long_prefill_token_threshold=16,
                       enable_prefix_caching=False),
}


def hf_pool(hidden: torch.Tensor, pooling_type: str) -> torch.Tensor:
    if pooling_type == "LAST":
        return hidden[-1]
    if pooling_type == "MEAN":
        return hidden.mean(dim=0)
    return hidden[0]


@pytest.fixture(scope="module")
def reference(tiny_llama_path):
    """(prompts, each prompt's last hidden states from transformers' base model)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(tiny_llama_path), dtype=torch.float32, attn_implementation="eager").eval()
    prompts = mixed_prompts(model.config.vocab_size, seed=5, num_prompts=8)
    with torch.no_grad():
        hidden = [model(torch.tensor([prompt])).last_hidden_state[0] for prompt in prompts]
    return prompts, hidden


def assert_close(outputs, prompts, hidden, pooling_type, dimensions=None, normalize=True, label=""):
    assert [output.prompt_token_ids for output in outputs] == prompts
    for index, (output, states) in enumerate(zip(outputs, hidden)):
        want = hf_pool(states, pooling_type)[:dimensions]
        if normalize:
            want = F.normalize(want, dim=-1)
        got = torch.tensor(output.outputs.embedding)
        assert got.shape == want.shape, f"prompt {index} {label}"
        assert torch.allclose(got, want, atol=ATOL, rtol=0), \
            f"prompt {index} ({len(prompts[index])} tokens) {pooling_type} {label}: max error " \
            f"{(got - want).abs().max().item():.2e}"


def assert_no_leaked_blocks(llm):
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_embeddings_match_transformers(reference, tiny_llama_path, pooling_type, config):
    prompts, hidden = reference
    llm = LLM(model=str(tiny_llama_path), runner="pooling", pooler_config={"pooling_type": pooling_type},
              max_num_seqs=8, **CONFIGS[config])
    outputs = llm.embed(prompts, use_tqdm=False)
    assert_close(outputs, prompts, hidden, pooling_type, label=config)
    scheduler = llm.scheduler
    if config == "chunked_prefill":
        assert max(len(p) for p in prompts) > 32  # some prompt really was split
    if config == "preemption":
        assert scheduler.num_preemptions_total > 0
    if config == "prefix_caching":
        # Again, on a warm cache: LAST reads the cached prefixes (only the last position is pooled); MEAN and
        # CLS must not (they pool positions a hit would skip), and every vector stays the same.
        scheduler.kv_cache_manager.make_prefix_cache_stats()
        again = llm.embed(prompts, use_tqdm=False)
        hits = scheduler.kv_cache_manager.make_prefix_cache_stats().hits
        assert (hits > 0) == (pooling_type == "LAST")
        assert_close(again, prompts, hidden, pooling_type, label="warm prefix cache")
    assert_no_leaked_blocks(llm)


def test_dimensions_truncate_and_renormalize(reference, tiny_llama_path):
    prompts, hidden = reference
    llm = LLM(model=str(tiny_llama_path), runner="pooling", pooler_config='{"pooling_type": "MEAN"}')
    truncated = llm.embed(prompts, PoolingParams(dimensions=16), use_tqdm=False)
    assert_close(truncated, prompts, hidden, "MEAN", dimensions=16)
    assert all(abs(torch.tensor(o.outputs.embedding).norm().item() - 1) < 1e-5 for o in truncated)
    raw = llm.embed(prompts, PoolingParams(normalize=False), use_tqdm=False)
    assert_close(raw, prompts, hidden, "MEAN", normalize=False)
    hidden_size = llm.model_runner.model_config.hidden_size
    with pytest.raises(ValueError, match=rf"prompt 1: dimensions must be <= the model's hidden size {hidden_size}"):
        llm.embed(prompts[:2], [PoolingParams(), PoolingParams(dimensions=hidden_size + 1)], use_tqdm=False)
    assert_no_leaked_blocks(llm)


def test_generation_and_pooling_share_a_batch(reference, tiny_llama_path):
    """An engine serves one task (as vLLM's), but the runner pools and samples rows of one batch alike: a
    generation request added beside pooling ones through the engine's internals gets transformers' tokens."""
    prompts, hidden = reference
    llm = LLM(model=str(tiny_llama_path), runner="pooling", max_num_batched_tokens=32, enable_prefix_caching=False)
    generated = prompts[0]
    llm._add_request("generate", Prompt(None, generated), SamplingParams(temperature=0.0, max_tokens=6,
                                                                         ignore_eos=True))
    from engine.pooling_requests import POOLING_SAMPLING_PARAMS
    for index, prompt in enumerate(prompts[1:4]):
        llm._add_request(f"embed-{index}", Prompt(None, prompt), POOLING_SAMPLING_PARAMS,
                         pooling_params=PoolingParams(normalize=True, pooling_type="LAST"))
    finished = llm._run_engine({"generate", "embed-0", "embed-1", "embed-2"}, {}, use_tqdm=False)
    hf_model = load_hf_model(tiny_llama_path)
    assert finished["generate"].outputs[0].token_ids == hf_greedy(hf_model, generated, 6)
    assert finished["generate"].pooler_output is None
    from engine.pooling_outputs import EmbeddingRequestOutput
    outputs = [EmbeddingRequestOutput.from_request_output(finished[f"embed-{index}"]) for index in range(3)]
    assert_close(outputs, prompts[1:4], hidden[1:4], "LAST")
    assert_no_leaked_blocks(llm)


def test_a_checkpoint_without_an_lm_head_embeds(reference, tiny_llama_path, tmp_path):
    """transformers' AutoModel saved as it is (architecture LlamaModel, names without "model.", no lm_head, as
    e5-mistral-7b-instruct ships): an embedding engine loads it and pools the same vectors; a generating one
    refuses it by name."""
    from transformers import AutoModel

    AutoModel.from_pretrained(str(tiny_llama_path), dtype=torch.float32).save_pretrained(tmp_path)
    prompts, hidden = reference
    llm = LLM(model=str(tmp_path), tokenizer=str(tiny_llama_path), runner="pooling")
    assert llm.model_runner.model_config.architecture == "LlamaModel"
    assert_close(llm.embed(prompts, use_tqdm=False), prompts, hidden, "LAST")
    with pytest.raises(ValueError, match=r"has no LM head \(lm_head.weight\): it can only embed; create the "
                                         r"engine with runner='pooling'"):
        LLM(model=str(tmp_path), tokenizer=str(tiny_llama_path))


def test_refusals_leave_the_engine_clean(reference, tiny_llama_path):
    prompts, hidden = reference
    llm = LLM(model=str(tiny_llama_path), runner="pooling", max_model_len=64, num_gpu_blocks=32)
    with pytest.raises(ValueError, match=r"prompt 1 has 70 tokens, more than the engine allows"):
        llm.embed([prompts[0][:10], list(range(1, 71))], use_tqdm=False)
    with pytest.raises(ValueError, match=r"runner='pooling'.*generates no text"):
        llm.generate(["hello"], use_tqdm=False)
    with pytest.raises(ValueError, match=r"pooling_params must be a PoolingParams, or a list of one per prompt"):
        llm.embed(prompts[:2], [PoolingParams()], use_tqdm=False)
    assert_no_leaked_blocks(llm)
    assert not llm.scheduler.requests
    assert_close(llm.embed(prompts[:2], use_tqdm=False), prompts[:2], hidden[:2], "LAST")  # still serves
    generating = LLM(model=str(tiny_llama_path), max_model_len=64, num_gpu_blocks=32)
    with pytest.raises(ValueError, match=r"embeddings need an engine created with runner='pooling'"):
        generating.embed(["hello"], use_tqdm=False)
    for bad, message in (({"runner": "embed"}, r"runner must be one of \['generate', 'pooling'\], got 'embed'"),
                         ({"pooler_config": {"pooling_type": "MEAN"}}, r"pooler_config needs runner='pooling'"),
                         ({"runner": "pooling", "pooler_config": '{"pooling": 1}'}, r"unknown key\(s\) \['pooling'\]"),
                         ({"runner": "pooling", "enable_lora": True}, r"does not take enable_lora"),
                         ({"runner": "pooling", "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
                          r"does not take speculative_config")):
        with pytest.raises(ValueError, match=message):
            LLM(model=str(tiny_llama_path), **bad)


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN"])
def test_qwen2_embeddings_match_transformers(tiny_qwen2_path, pooling_type):
    """Qwen2 (q/k/v biases; gte-Qwen2's architecture), with prompts cut into chunks."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(tiny_qwen2_path), dtype=torch.float32, attn_implementation="eager").eval()
    prompts = mixed_prompts(model.config.vocab_size, seed=9, num_prompts=6)
    with torch.no_grad():
        hidden = [model(torch.tensor([prompt])).last_hidden_state[0] for prompt in prompts]
    llm = LLM(model=str(tiny_qwen2_path), runner="pooling", pooler_config={"pooling_type": pooling_type},
              max_num_batched_tokens=32, enable_prefix_caching=False)
    assert_close(llm.embed(prompts, use_tqdm=False), prompts, hidden, pooling_type, label="qwen2")
    assert_no_leaked_blocks(llm)
