"""Parallel sampling (``n > 1``): n engine requests per prompt, gathered back into one output.

Completion i of a seeded request is what a lone request with ``seed + i`` samples (the tiny model's
distribution is nearly flat, so the tokens are the random draws: a wrong seed shows); the children
share the prompt's blocks through the prefix cache; every block comes back.
"""

import pytest

from engine import LLM, SamplingParams
from engine.core import Request
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.parallel_sampling import ParentRequest, child_request_id, child_sampling_params
from engine.request_inputs import Prompt, make_core_request
from tests.engine.model_fixtures import mixed_prompts

SEEDED = SamplingParams(n=3, temperature=1.0, seed=40, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path), max_num_seqs=8, num_gpu_blocks=96)


def assert_all_blocks_free(llm):
    pool = llm.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_usable_blocks


def test_completion_i_is_the_lone_request_with_seed_plus_i(llm):
    prompts = mixed_prompts(llm.model_runner.vocab_size, seed=5, num_prompts=2)
    outputs = llm.generate(prompts, SEEDED, use_tqdm=False)
    assert [len(output.outputs) for output in outputs] == [3, 3]
    for prompt, output in zip(prompts, outputs):
        assert output.finished and [c.index for c in output.outputs] == [0, 1, 2]
        assert all(c.finish_reason == "length" and len(c.token_ids) == 10 for c in output.outputs)
        for completion in output.outputs:
            alone = SamplingParams(temperature=1.0, seed=40 + completion.index, max_tokens=10, ignore_eos=True)
            assert completion.token_ids == llm.generate([prompt], alone, use_tqdm=False)[0].outputs[0].token_ids
        assert len({tuple(c.token_ids) for c in output.outputs}) == 3
        assert output.metrics.num_generation_tokens == 30
    assert_all_blocks_free(llm)


def test_children_share_the_prompt_through_the_prefix_cache(llm):
    llm.scheduler.reset_prefix_cache()
    llm.scheduler.kv_cache_manager.make_prefix_cache_stats()  # start counting afresh
    prompt = list(range(10, 10 + 70))  # four full blocks of 16, and 6 tokens more
    output = llm.generate([prompt], SamplingParams(n=4, temperature=0.0, max_tokens=5, ignore_eos=True),
                          use_tqdm=False)[0]
    # Greedy children are the same completion; three of them read the first one's 64 cached tokens.
    assert len({tuple(c.token_ids) for c in output.outputs}) == 1
    stats = llm.scheduler.kv_cache_manager.make_prefix_cache_stats()
    assert (stats.queries, stats.hits) == (4 * 70, 3 * 64)
    assert_all_blocks_free(llm)


def test_mixed_n_and_prompt_logprobs(llm):
    prompts = mixed_prompts(llm.model_runner.vocab_size, seed=6, num_prompts=3)
    params = [SamplingParams(n=2, max_tokens=4, prompt_logprobs=1, logprobs=1, seed=1), SamplingParams(max_tokens=3),
              SamplingParams(n=5, max_tokens=2, temperature=0.0)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(output.outputs) for output in outputs] == [2, 1, 5]
    assert [output.request_id for output in outputs] == sorted({output.request_id for output in outputs}, key=int)
    first = outputs[0]
    # One set of prompt logprobs (every child computes the same), a position for each prompt token.
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(prompts[0])
    assert all(len(c.logprobs) == 4 for c in first.outputs)
    assert_all_blocks_free(llm)


def test_the_core_refuses_a_request_that_still_says_n(llm):
    with pytest.raises(ValueError, match="the core takes n = 1"):
        llm.engine_core.add_request(Request("x", [5, 6, 7], SamplingParams(n=2)))
    assert not llm.scheduler.requests


def completion_output(request_id, token_ids, finished, first_token_time, finished_time=None):
    completion = CompletionOutput(0, "".join(f"<{t}>" for t in token_ids), token_ids, None, None,
                                  "length" if finished else None)
    return RequestOutput(request_id, None, [1, 2], None, [completion], finished,
                         RequestMetrics(arrival_time=1.0, first_token_time=first_token_time,
                                        finished_time=finished_time))


@pytest.mark.parametrize("kind", ["final", "delta", "cumulative"])
def test_parent_output_kinds(kind):
    parent = ParentRequest("p", SamplingParams(n=2, seed=9), kind)
    assert parent.child_ids == [child_request_id("p", 0), child_request_id("p", 1)] == ["0_p", "1_p"]
    assert [params.seed for params in parent.child_params] == [9, 10]
    assert all(params.n == 1 for params in parent.child_params)
    first = parent.add_child_output(completion_output("1_p", [7], False, first_token_time=3.0))
    second = parent.add_child_output(completion_output("0_p", [5, 6], True, first_token_time=3.5, finished_time=6.0))
    last = parent.add_child_output(completion_output("1_p", [7, 8] if kind != "delta" else [8], True,
                                                     first_token_time=3.0, finished_time=5.0))
    if kind == "final":
        assert first is None and second is None
    else:
        assert not first.finished and not second.finished and first.request_id == "p"
    assert last.finished and last.request_id == "p"
    if kind == "delta":
        assert [(c.index, c.token_ids) for c in first.outputs] == [(1, [7])]
        assert [(c.index, c.token_ids) for c in last.outputs] == [(1, [8])]
    else:
        assert [(c.index, c.token_ids, c.finish_reason) for c in last.outputs] == [(0, [5, 6], "length"),
                                                                                  (1, [7, 8], "length")]
    # The user's timing: the first token of any completion, the finish of the last.
    assert (last.metrics.first_token_time, last.metrics.finished_time) == (3.0, 6.0)


class CountedMetrics(RequestMetrics):
    """RequestMetrics that count every attribute read: the parent's work per child output, without a clock."""
    reads = 0

    def __getattribute__(self, name):
        type(self).reads += 1
        return super().__getattribute__(name)


def test_the_parent_folds_each_child_output_in_constant_work():
    """The merged timing was recomputed over every child for each output: O(n**2) on the server's event loop,
    which answered nothing else for 44 s while n=16384 (vLLM's ceiling) completions came in. Counted, not
    timed: the reads of the children's metrics per output must not grow with n."""
    reads_per_output = {}
    for n in (100, 1000):
        parent = ParentRequest("p", SamplingParams(n=n), "delta")
        CountedMetrics.reads = 0
        for index in range(n):
            completion = CompletionOutput(0, "x", [index], None, None, "length")
            last = parent.add_child_output(RequestOutput(
                child_request_id("p", index), None, [1, 2], None, [completion], True,
                CountedMetrics(arrival_time=1.0, first_token_time=2.0 + index, finished_time=9.0 + index)))
        reads_per_output[n] = CountedMetrics.reads / n
        assert last.finished and (last.metrics.first_token_time, last.metrics.finished_time) == (2.0, 9.0 + n - 1)
    # Recomputing over all children read ~6 fields of every child per output: 10x the reads at 10x the children.
    assert reads_per_output[1000] < 1.5 * reads_per_output[100]


def test_merged_timing_counts_each_child_once_however_often_it_reports():
    parent = ParentRequest("p", SamplingParams(n=2), "delta")
    for tokens, last_token_time, finished_time in ((1, 3.0, None), (2, 4.0, None), (3, 5.0, 5.0)):
        output = parent.add_child_output(RequestOutput(
            "0_p", None, [1, 2], None, [CompletionOutput(0, "x", [tokens], None, None, None)],
            finished_time is not None,
            RequestMetrics(arrival_time=1.0, first_token_time=3.0, last_token_time=last_token_time,
                           finished_time=finished_time, num_generation_tokens=tokens)))
    assert (output.metrics.num_generation_tokens, output.metrics.last_token_time) == (3, 5.0)
    assert output.metrics.finished_time is None  # child 1 has not finished
    final = parent.add_child_output(RequestOutput(
        "1_p", None, [1, 2], None, [CompletionOutput(0, "y", [7, 8], None, None, "length")], True,
        RequestMetrics(arrival_time=0.5, first_token_time=2.5, last_token_time=4.5, finished_time=4.5,
                       num_generation_tokens=2)))
    assert final.metrics == RequestMetrics(arrival_time=0.5, first_token_time=2.5, last_token_time=5.0,
                                           finished_time=5.0, num_generation_tokens=5)


def test_a_derived_seed_of_minus_one_stays_a_seed():
    # seed=-1 from a user means "unseeded", but completion 1 of seed=-2 must still sample with seed -1,
    # also when the request gains extra EOS ids as stop tokens (a second construction).
    child = child_sampling_params(SamplingParams(n=2, seed=-2), 1)
    assert child.seed == -1 and child.n == 1
    request = make_core_request("r", Prompt(None, [1, 2]), child, eos_token_ids=[2, 3], arrival_time=0.0)
    assert request.sampling_params.seed == -1 and 3 in request.sampling_params.all_stop_token_ids
