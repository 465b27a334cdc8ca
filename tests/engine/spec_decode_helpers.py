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
