"""Greedy generation through LLM equals transformers' generate, token for token (fp32, CPU).

One batch of 16 mixed-length prompts (half of them sharing 32-token prefixes), fixed output lengths
(ignore_eos), in every configuration that changes what the runner sees: prefix-cache hits, no prefix
caching, prompts cut into chunks by a small token budget, and a pool so small that requests are
preempted and recomputed. transformers generates each prompt alone, so padding plays no part.
"""

import pytest

from engine import LLM, SamplingParams
from tests.engine.model_fixtures import hf_greedy, load_hf_model, mixed_prompts

CONFIGS = {
    "prefix_caching": dict(enable_prefix_caching=True),
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "chunked_prefill": dict(max_num_batched_tokens=32, long_prefill_token_threshold=0),
    "preemption": dict(num_gpu_blocks=14, enable_prefix_caching=False),
}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def reference(request, tiny_llama_path, tiny_qwen2_path):
    """(model path, prompts, max_tokens per prompt, transformers' greedy outputs)."""
    path = tiny_llama_path if request.param == "llama" else tiny_qwen2_path
    hf_model = load_hf_model(path)
    prompts = mixed_prompts(hf_model.config.vocab_size, seed=11)
    max_tokens = [4 + index % 9 for index in range(len(prompts))]
    expected = [hf_greedy(hf_model, prompt, n) for prompt, n in zip(prompts, max_tokens)]
    return path, prompts, max_tokens, expected


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_matches_transformers(reference, config):
    path, prompts, max_tokens, expected = reference
    llm = LLM(model=str(path), max_num_seqs=16, **CONFIGS[config])
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = llm.generate(prompts, params, use_tqdm=False)

    assert [o.prompt_token_ids for o in outputs] == prompts
    for index, (output, want) in enumerate(zip(outputs, expected)):
        assert output.outputs[0].token_ids == want, f"prompt {index} ({len(prompts[index])} tokens), {config}"
        assert output.outputs[0].finish_reason == "length"
    scheduler = llm.scheduler
    if config == "prefix_caching":
        assert any(o.num_cached_tokens > 0 for o in outputs)
        # A second call hits every full block the first one left cached (all but the last token can
        # hit), and still matches.
        again = llm.generate(prompts[:4], params[:4], use_tqdm=False)
        assert [o.num_cached_tokens for o in again] == [(len(p) - 1) // 16 * 16 for p in prompts[:4]]
        assert [o.outputs[0].token_ids for o in again] == expected[:4]
    if config == "no_prefix_caching":
        assert all(o.num_cached_tokens == 0 for o in outputs)
    if config == "chunked_prefill":
        assert max(len(p) for p in prompts) > 32  # some prompt really was split
    if config == "preemption":
        assert scheduler.num_preemptions_total > 0
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
