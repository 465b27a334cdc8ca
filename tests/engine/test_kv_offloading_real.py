"""KV offloading on the real engine (LLM(kv_offloading_size_gib=...); engine/runner/host_kv_cache.py).

A prompt whose prefix the GPU's cache has lost loads it from the host cache instead of recomputing it, and
produces the very tokens, with the same log-probabilities, that an engine without offloading produces. The
copies run in the order the scheduler's outputs say: a block freed and handed to another request in the
same step is copied to the host before it is zeroed.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams

# The host cache is pinned memory on a GPU and its copies DMA transfers (benchmarks/gpu_check.sh runs these).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                               reason="needs a CUDA device"))]

PREFIX = [(7 * index + 3) % 500 + 1 for index in range(48)]  # 3 blocks of 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, ignore_eos=True)


def count_loads(llm):
    """Wrap the runner to count the blocks each step loads from the host; the counter list."""
    runner, loaded = llm.model_runner, []
    execute = runner.execute_model

    def counting(scheduler_output):
        loaded.append(sum(len(pairs) for pairs in scheduler_output.offload_loads.values()))
        return execute(scheduler_output)
    runner.execute_model = counting
    return loaded


def generate(llm, prompt):
    """The greedy tokens and each one's log-probability."""
    completion = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0]
    return completion.token_ids, [entry[token].logprob for token, entry in zip(completion.token_ids,
                                                                                completion.logprobs)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_gpu_blocks", [64, 9])
def test_a_prefix_loaded_from_the_host_gives_the_tokens_of_an_engine_without_offloading(tiny_llama_path,
                                                                                          num_gpu_blocks, device):
    # 9 blocks (8 usable): every block is freed and handed on at once, so stores race the zeroing.
    prompts = [PREFIX + [11, 12, 13], PREFIX + [21, 22, 23, 24, 25], PREFIX[:32] + [31, 32]]
    plain = LLM(model=str(tiny_llama_path), num_gpu_blocks=num_gpu_blocks, max_num_seqs=1, max_model_len=128,
                device=device)
    expected = [generate(plain, prompt) for prompt in prompts]
    llm = LLM(model=str(tiny_llama_path), num_gpu_blocks=num_gpu_blocks, max_num_seqs=1, max_model_len=128,
              kv_offloading_size_gib=0.01, device=device)
    loaded = count_loads(llm)
    got = []
    for prompt in prompts:
        assert llm.engine_core.scheduler.reset_prefix_cache()  # the GPU forgets every prefix; the host keeps them
        got.append(generate(llm, prompt))
    assert sum(loaded) == 3 + 2  # the second prompt loads the 3 prefix blocks, the third its first 2
    for (tokens, logprobs), (expected_tokens, expected_logprobs) in zip(got, expected):
        assert tokens == expected_tokens
        assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)
    manager = llm.engine_core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_bad_offloading_sizes_name_the_argument(tiny_llama_path):
    with pytest.raises(ValueError, match="kv_offloading_size_gib must be a number of GiB >= 0, got -1"):
        LLM(model=str(tiny_llama_path), kv_offloading_size_gib=-1)
    with pytest.raises(ValueError, match="kv_offloading_size_gib=1 needs enable_prefix_caching=True"):
        LLM(model=str(tiny_llama_path), kv_offloading_size_gib=1, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="kv_offloading_size_gib=1e-09 holds no block"):
        LLM(model=str(tiny_llama_path), kv_offloading_size_gib=1e-9)


@pytest.mark.parametrize("device", DEVICES)
def test_blocks_stored_as_their_request_ends_reach_the_host_before_the_next_step_zeroes_them(tiny_llama_path, device):
    # The request samples one token and ends in the same update that sends its prompt blocks to the host, so
    # the copies wait for the next step, which hands those very blocks (freed, zeroed as new) to the next
    # request, whose load reads the copies back (4 usable blocks: the next request takes every one).
    prompt = PREFIX + [41, 42]
    plain = LLM(model=str(tiny_llama_path), num_gpu_blocks=5, max_num_seqs=1, max_model_len=64, device=device)
    expected = generate(plain, prompt)
    llm = LLM(model=str(tiny_llama_path), num_gpu_blocks=5, max_num_seqs=1, max_model_len=64,
              kv_offloading_size_gib=0.01, device=device)
    loaded = count_loads(llm)
    llm.generate([PREFIX + [1]], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    stores = llm.engine_core.scheduler.kv_cache_manager.pending_offload_stores
    assert len(stores) == 3  # not copied yet
    assert llm.engine_core.scheduler.reset_prefix_cache()
    assert generate(llm, prompt)[0] == expected[0] and sum(loaded) == 3


def test_a_host_tier_smaller_than_one_update_keeps_the_last_block_of_each_slot(tiny_llama_path):
    # One update stores a prompt's 8 blocks into a 7-block tier: its first slot is handed out twice within it,
    # and must end up holding the block the tier lists there (the last), whatever order the copies land in.
    # Short prompts (no full block, so nothing new for the host) then evict the prompt's tail from the GPU (a
    # freed request's tail goes first), and the prompt comes back as a GPU hit on its head, its tail loaded.
    def engine(**offload):
        return LLM(model=str(tiny_llama_path), num_gpu_blocks=13, max_num_seqs=8, max_model_len=192, **offload)
    blocks_per_gib = engine().model_runner.determine_num_offload_blocks(1.0)
    llm, plain = engine(kv_offloading_size_gib=7.5 / blocks_per_gib), engine()
    assert llm.engine_core.scheduler.kv_cache_manager.offload.capacity_blocks == 7
    first = [(11 * index + 5) % 500 + 1 for index in range(128)]  # 8 blocks
    short = [[(13 * index + row) % 500 + 1 for index in range(10)] for row in range(8)]
    for each in (llm, plain):
        each.generate([first + [1]], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        each.generate(short, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    loaded = count_loads(llm)
    prompt = first + [3, 4]
    (tokens, logprobs), (expected_tokens, expected_logprobs) = generate(llm, prompt), generate(plain, prompt)
    assert tokens == expected_tokens and logprobs == pytest.approx(expected_logprobs, abs=1e-4)
    assert sum(loaded) == 4  # blocks 4-7, block 7 from the slot handed out twice


@pytest.mark.parametrize("size_gib, cached", [(0.01, 48), (0, 0)])
def test_the_openai_server_serves_a_prefix_from_the_host(tiny_llama_path, size_gib, cached):
    # python -m engine.serve --kv-offloading-size, in process: other traffic pushes a prompt's prefix out of the
    # 8-block GPU cache, and the same prompt comes back with the same text and its prefix counted as cached.
    import openai

    from engine.async_llm import AsyncLLM
    from engine.serve import ServerThread, build_app

    engine = AsyncLLM(model=str(tiny_llama_path), num_gpu_blocks=9, max_num_seqs=1, max_model_len=128,
                      kv_offloading_size_gib=size_gib)
    with ServerThread(build_app(engine, "tiny-offload", shutdown_engine=True)) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
            def complete(prompt):
                return client.completions.create(model="tiny-offload", prompt=prompt, max_tokens=6, temperature=0,
                                                  extra_body={"ignore_eos": True})
            first = complete(PREFIX + [1])
            for row in range(3):  # 5 blocks each: the prefix's blocks are evicted from the GPU
                complete([(17 * index + row) % 500 + 1 for index in range(70)])
            again = complete(PREFIX + [1])
    assert again.choices[0].text == first.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens == cached  # without a host tier: recomputed
