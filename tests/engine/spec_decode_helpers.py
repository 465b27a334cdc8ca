"""What the tests of proposers with a network of their own share (draft models, EAGLE heads): prompts of random ids,
greedy generation, and the configurations a proposer must keep the target's tokens through."""

from __future__ import annotations

import random

from engine import SamplingParams

GREEDY_30 = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
# Chunked prompts with a budget that cuts drafts; a pool small enough to preempt; no prefix cache.
ENGINE_VARIANTS = [{}, {"max_num_batched_tokens": 7}, {"num_gpu_blocks": 14, "max_num_seqs": 4},
                   {"enable_prefix_caching": False}]


def random_prompts(count: int, length: int = 30, seed: int = 0) -> list[list[int]]:
    return [[random.Random(seed + index).randrange(4, 500) for _ in range(length)] for index in range(count)]


def generate_tokens(llm, prompts, params) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params, use_tqdm=False)]


def assert_greedy_tokens_unchanged(target, speculative_config: dict, engine_kwargs: dict, params=GREEDY_30):
    """Greedy requests (one sharing a block with another) produce exactly plain decoding's tokens with
    ``speculative_config``, some drafts are made, and every block comes back. Returns the speculating LLM."""
    from engine import LLM

    prompts = random_prompts(5)
    prompts.append(prompts[0][:20] + [5, 6])  # shares a block with the first
    expected = generate_tokens(LLM(model=str(target), skip_tokenizer_init=True, **engine_kwargs), prompts, params)
    llm = LLM(model=str(target), skip_tokenizer_init=True, speculative_config=speculative_config, **engine_kwargs)
    assert generate_tokens(llm, prompts, params) == expected
    assert llm.engine_core.scheduler.make_stats().spec_decoding["num_drafts"] > 0
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    return llm
