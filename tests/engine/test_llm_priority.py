"""Per-request priorities through the Python API, as vLLM's ``LLM.generate(..., priority=[...])`` takes
them: lower is served first under ``scheduling_policy="priority"``, and refused where they would do nothing."""

import asyncio

import pytest

from engine import LLM, AsyncLLM, SamplingParams

PARAMS = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)


def test_lower_priority_values_are_served_first(tiny_llama_path):
    # One sequence at a time: the order in which the requests are first scheduled is the priority order.
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=1, scheduling_policy="priority")
    outputs = llm.generate(["a", "b", "c"], PARAMS, use_tqdm=False, priority=[2, 0, 1])
    order = sorted(range(3), key=lambda index: outputs[index].metrics.first_scheduled_time)
    assert order == [1, 2, 0]
    assert [len(output.outputs[0].token_ids) for output in outputs] == [3, 3, 3]


@pytest.mark.parametrize("policy, priority, message", [
    ("fcfs", [0, 1], r"priority\[1\] 1 needs scheduling_policy='priority'"),
    ("shortest_prompt_first", [0, 1], r"priority\[1\] 1 needs scheduling_policy='priority'"),
    ("priority", [0], r"priority must be a list of one integer per prompt \(2\)"),
    ("priority", [0, 1.5], r"priority\[1\] must be an integer"),
])
def test_priorities_that_would_do_nothing_or_are_malformed_are_refused(tiny_llama_path, policy, priority, message):
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=2, scheduling_policy=policy)
    with pytest.raises(ValueError, match=message):
        llm.generate(["a", "b"], PARAMS, use_tqdm=False, priority=priority)
    assert llm.generate(["a"], PARAMS, use_tqdm=False)[0].finished  # still healthy


def test_async_generate_takes_a_priority(tiny_llama_path):
    async def run():
        engine = AsyncLLM(model=str(tiny_llama_path), max_num_seqs=2, scheduling_policy="fcfs")
        try:
            with pytest.raises(ValueError, match="priority 3 needs scheduling_policy='priority'"):
                async for _ in engine.generate("a", PARAMS, priority=3):
                    pass
            outputs = [output async for output in engine.generate("a", PARAMS, priority=0)]
            assert outputs[-1].finished
        finally:
            engine.shutdown()

    asyncio.run(run())


def test_shortest_prompt_first_serves_the_shortest_prompt_first_on_the_real_engine(tiny_llama_path):
    # One sequence at a time: the first-scheduled order is the prompts' length order, not the submission order.
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=1, scheduling_policy="shortest_prompt_first")
    prompts = [{"prompt_token_ids": list(range(5, 5 + length))} for length in (30, 10, 20)]
    outputs = llm.generate(prompts, PARAMS, use_tqdm=False)
    order = sorted(range(3), key=lambda index: outputs[index].metrics.first_scheduled_time)
    assert order == [1, 2, 0]


def test_a_users_rank_function_and_a_bad_policy(tiny_llama_path):
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=1, scheduling_policy="tests.core.rank_functions:longest_prompt_first")
    prompts = [{"prompt_token_ids": list(range(5, 5 + length))} for length in (10, 30, 20)]
    outputs = llm.generate(prompts, PARAMS, use_tqdm=False, priority=[0, 0, 0])  # a rank function may read it
    assert sorted(range(3), key=lambda index: outputs[index].metrics.first_scheduled_time) == [1, 2, 0]
    with pytest.raises(ValueError, match=r"scheduler\.policy must be one of 'fcfs'.*got 'lifo'"):
        LLM(model=str(tiny_llama_path), scheduling_policy="lifo")


def test_the_real_engine_takes_an_eviction_policy_and_gives_the_same_tokens(tiny_llama_path):
    """LFU eviction changes which cached blocks a small pool keeps, never the tokens (greedy decoding)."""
    from engine.core.eviction_policies import LeastFrequentlyUsed

    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17] + [20 + index] for index in range(4)]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    outputs = {}
    for policy in ("lru", "lfu"):
        llm = LLM(model=str(tiny_llama_path), num_gpu_blocks=12, block_size=4, prefix_cache_eviction_policy=policy)
        pool = llm.scheduler.kv_cache_manager.block_pool
        assert isinstance(pool.eviction_policy, LeastFrequentlyUsed) == (policy == "lfu")
        outputs[policy] = [output.outputs[0].token_ids for output in llm.generate(prompts, params)]
    assert outputs["lru"] == outputs["lfu"]
