"""Speculative decoding in the real engine (LLM(speculative_config=...); engine/runner/spec_decode/).

Greedy requests produce exactly the tokens that decoding one token per step produces, whatever the drafts,
the batching, the token budget (which may cut a step's drafts), preemption or the prefix cache. Random
sampling keeps each token distributed as the model says (the verification's rejection sampling, checked on
a distribution by counting). Requests whose sampling depends on the tokens of the step are not speculated.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import LLM, SamplingParams
from engine.models import make_test_model
from engine.runner.spec_decode import NgramProposer, SpeculativeConfig, verify_drafts
from engine.runner.spec_decode.verification import can_speculate

# On CUDA the verification steps run eagerly beside CUDA-graph decodes (benchmarks/gpu_check.sh runs these).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                               reason="needs a CUDA device"))]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def looping_llama(tmp_path_factory):
    """A small random Llama whose greedy outputs fall into loops: the n-gram proposer finds drafts there."""
    return make_test_model(tmp_path_factory.mktemp("spec_llama"), "llama", seed=1)


def _prompts(count, length=30, seed=0):
    return [[random.Random(seed + index).randrange(4, 60) for _ in range(length)] for index in range(count)]


def _generate(llm, prompts, params):
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine_kwargs", [
    {},
    {"max_num_batched_tokens": 7},  # a budget that cuts drafts (and chunks the prompts)
    {"num_gpu_blocks": 12, "max_num_seqs": 4},  # a pool small enough to preempt
    {"enable_prefix_caching": False},
])
def test_greedy_tokens_are_those_of_decoding_one_token_per_step(looping_llama, engine_kwargs, device):
    engine_kwargs = {**engine_kwargs, "device": device}
    prompts = _prompts(5)
    prompts.append(prompts[0][:20] + [5, 6])  # shares a block with the first
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = _generate(LLM(model=str(looping_llama), skip_tokenizer_init=True, **engine_kwargs), prompts, params)
    llm = LLM(model=str(looping_llama), skip_tokenizer_init=True, speculative_config=NGRAM, **engine_kwargs)
    assert _generate(llm, prompts, params) == expected
    stats = llm.engine_core.scheduler.make_stats().spec_decoding
    # The test means something only if drafts were verified, some kept and some rejected.
    assert stats["num_drafts"] > 20 and 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]
    if "num_gpu_blocks" in engine_kwargs:
        assert llm.engine_core.scheduler.num_preemptions_total > 0


def test_stop_tokens_and_max_tokens_end_a_request_inside_a_step_of_drafts(looping_llama):
    """A stop token among the kept drafts ends the request there; max_tokens is never exceeded."""
    prompts = _prompts(4, seed=10)
    reference = LLM(model=str(looping_llama), skip_tokenizer_init=True)
    loops = _generate(reference, prompts, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    # Stop on a token each request produces more than once, past its first few tokens.
    stops = [Counter(tokens[5:]).most_common(1)[0][0] for tokens in loops]
    llm = LLM(model=str(looping_llama), skip_tokenizer_init=True, speculative_config=NGRAM)
    for prompt, stop, tokens in zip(prompts, stops, loops):
        for max_tokens in (7, 30):
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=[stop], ignore_eos=True)
            expected = _generate(reference, [prompt], params)[0]
            assert _generate(llm, [prompt], params)[0] == expected
            assert len(expected) <= max_tokens


def test_requests_that_cannot_be_speculated_decode_one_token_per_step(looping_llama):
    prompts = _prompts(2, seed=20)
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, presence_penalty=0.5)]
    reference = LLM(model=str(looping_llama), skip_tokenizer_init=True).generate(prompts, params, use_tqdm=False)
    llm = LLM(model=str(looping_llama), skip_tokenizer_init=True, speculative_config=NGRAM)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in reference]
    assert llm.engine_core.scheduler.make_stats().spec_decoding["num_drafts"] == 0
    assert not can_speculate(SamplingParams(min_tokens=5), 4) and can_speculate(SamplingParams(min_tokens=5), 5)


def test_logprobs_of_speculated_requests_are_those_of_plain_decoding(looping_llama):
    """Each kept token's logprobs come from its own position's raw distribution (the core cutting them at a stop
    token: tests/core/test_spec_decode_core.py)."""
    prompts = _prompts(3, seed=50)
    plain = LLM(model=str(looping_llama), skip_tokenizer_init=True)
    llm = LLM(model=str(looping_llama), skip_tokenizer_init=True, speculative_config=NGRAM)
    for prompt in prompts:
        params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2)
        expected = plain.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        got = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        assert got.token_ids == expected.token_ids and len(got.logprobs) == len(got.token_ids)
        for mine, theirs in zip(got.logprobs, expected.logprobs):
            assert list(mine) == list(theirs)  # the same tokens: the produced one and the top 2
            assert [entry.logprob for entry in mine.values()] == pytest.approx(
                [entry.logprob for entry in theirs.values()], abs=1e-4)
            assert [entry.rank for entry in mine.values()] == [entry.rank for entry in theirs.values()]
        assert got.cumulative_logprob == pytest.approx(expected.cumulative_logprob, abs=1e-3)
    assert llm.engine_core.scheduler.make_stats().spec_decoding["num_accepted_tokens"] > 0


def test_mixed_greedy_and_random_batches_keep_greedy_tokens(looping_llama):
    prompts = _prompts(4, seed=30)
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=20, max_tokens=24, ignore_eos=True, seed=3)] * 2
    expected = _generate(LLM(model=str(looping_llama), skip_tokenizer_init=True), prompts, params)
    got = _generate(LLM(model=str(looping_llama), skip_tokenizer_init=True, speculative_config=NGRAM), prompts, params)
    assert got[0] == expected[0] and got[2] == expected[2]
    assert all(len(tokens) == 24 for tokens in got)


def _distribution(logits_row):
    return torch.softmax(logits_row, dim=-1)


@pytest.mark.parametrize("draft", [0, 3])  # the likeliest token, and an unlikely one
def test_random_verification_keeps_each_token_distributed_as_the_model_says(draft):
    """Rejection sampling with a deterministic draft: the first token is distributed as p_1, whatever the
    draft; the draft is kept with probability p_1(draft)."""
    from engine.runner.request_state import CachedRequestState

    vocab = 6
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 0.3], [0.0, 1.0, 2.0, 0.0, 0.0, 0.0]])
    state = CachedRequestState("r", [1, 2], SamplingParams(temperature=1.0, max_tokens=8), torch.Generator().manual_seed(0),
                               [0], 2, [])
    draws = 20_000
    first = Counter(verify_drafts(logits, [state], [[draft]], vocab)[0][0] for _ in range(draws))
    expected = _distribution(logits[0])
    observed = torch.tensor([first[token] / draws for token in range(vocab)])
    # Binomial standard errors of 20,000 draws are under 0.0036; allow about 4 of them.
    assert torch.allclose(observed, expected, atol=0.015), (observed, expected)


def test_greedy_verification_keeps_drafts_while_they_are_the_argmax():
    from engine.runner.request_state import CachedRequestState

    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    state = CachedRequestState("r", [1], SamplingParams(temperature=0.0), None, [0], 1, [])
    assert verify_drafts(logits, [state], [[1, 2, 0]], 3) == [[1, 2, 0, 1]]  # all kept, then the bonus token
    assert verify_drafts(logits, [state], [[1, 0, 0]], 3) == [[1, 2]]  # the second replaced by the argmax
    assert verify_drafts(logits[:1], [state], [[]], 3) == [[1]]


def test_ngram_proposer_copies_what_followed_the_latest_earlier_occurrence():
    proposer = NgramProposer(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
    tokens = np.array([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7])
    assert proposer.propose(tokens) == [1, 2, 5]  # "5 6 7" last seen before "1 2 5"
    assert proposer.propose(np.array([1, 2, 3, 4])) == []  # no earlier occurrence
    assert proposer.propose(np.array([4, 4])) == [4]  # the match may end right before the tail
    assert NgramProposer(2, 2, 2).propose(np.array([1, 2, 9, 1, 2])) == [9, 1]


def _proposal_by_definition(tokens, k, low, high):
    """The n-gram proposal spelled out: for n from high down to low, the latest earlier window equal to the
    last n tokens; the k tokens after it."""
    for n in range(min(high, len(tokens) - 1), low - 1, -1):
        tail = tokens[len(tokens) - n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=40), k=st.integers(1, 4),
       low=st.integers(1, 3), extra=st.integers(0, 3))
def test_ngram_proposer_matches_its_definition(tokens, k, low, extra):
    proposer = NgramProposer(k, low, low + extra)
    assert proposer.propose(np.array(tokens)) == _proposal_by_definition(tokens, k, low, low + extra)


@pytest.mark.parametrize("value, message", [
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1, got 0"),
    ({"method": "mtp", "num_speculative_tokens": 2}, "speculative_config.method must be one of ngram"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max must be"),
    ({"num_speculative_tokens": 2, "lookahead": 1}, "unknown key\\(s\\) \\['lookahead'\\]"),
    ("{not json", "speculative_config must be a JSON object"),
    ({"method": "ngram"}, "needs num_speculative_tokens"),
])
def test_bad_speculative_configs_name_the_key(value, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(value)


def test_the_openai_server_speculates_and_reports_it(looping_llama):
    import openai
    import urllib.request

    from engine.async_llm import AsyncLLM
    from engine.serve import ServerThread, build_app

    prompt = _prompts(1, seed=40)[0]
    expected = _generate(LLM(model=str(looping_llama), skip_tokenizer_init=True), [prompt],
                         SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0]
    engine = AsyncLLM(model=str(looping_llama), skip_tokenizer_init=True, speculative_config=NGRAM)
    with ServerThread(build_app(engine, "spec", shutdown_engine=True)) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
            completion = client.completions.create(model="spec", prompt=prompt, max_tokens=24, temperature=0,
                                                   extra_body={"ignore_eos": True, "return_token_ids": True})
        metrics = urllib.request.urlopen(f"{server.url}/metrics", timeout=10).read().decode()
    assert completion.choices[0].token_ids == expected
    accepted = [line for line in metrics.splitlines() if line.startswith("servesim_spec_decode_num_accepted_tokens_total")]
    assert accepted and float(accepted[0].split()[-1]) > 0


def test_seeded_random_requests_draw_what_decoding_one_token_per_step_draws(looping_llama):
    """Each verified position samples its token with one draw of the request's generator, as the sampler does,
    and keeps the draft if it is that token: a seeded request's tokens are those of decoding without drafts,
    whatever the token budget let a step verify or which requests share its batch."""
    prompts = [([random.Random(seed).randrange(4, 12) for _ in range(6)] * 5) for seed in range(4)]
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=30, ignore_eos=True)
    plain = LLM(model=str(looping_llama), skip_tokenizer_init=True)
    expected = [_generate(plain, [prompt], params)[0] for prompt in prompts]
    llm = LLM(model=str(looping_llama), skip_tokenizer_init=True, speculative_config=NGRAM, max_num_batched_tokens=5)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt, tokens in zip(prompts, expected):
        assert _generate(llm, [prompt], params)[0] == tokens
        neighbour = [random.Random(len(prompt)).randrange(4, 12) for _ in range(30)]
        assert _generate(llm, [neighbour, prompt], [greedy, params])[1] == tokens
    assert llm.engine_core.scheduler.make_stats().spec_decoding["num_accepted_tokens"] > 0
