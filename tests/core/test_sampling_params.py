"""SamplingParams validates every field with vLLM's meanings and names the bad field."""

from __future__ import annotations

import pytest

from engine.core import SamplingParams, SamplingType


@pytest.mark.parametrize("field, value", [
    ("n", 0), ("n", True), ("max_tokens", 0), ("max_tokens", -3), ("min_tokens", -1), ("temperature", -0.1),
    ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.5),
    ("seed", 1.5), ("stop", [""]), ("stop_token_ids", [-1]), ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0), ("repetition_penalty", 0.0), ("logprobs", -1), ("prompt_logprobs", -2),
    ("logit_bias", {"x": 1.0}), ("allowed_token_ids", []), ("bad_words", [""]), ("ignore_eos", "yes"),
    # torch.Generator.manual_seed's range is [-2**63, 2**64 - 1]; one past either end failed the engine step.
    ("seed", 2**64), ("seed", -(2**63) - 1),
    # Non-finite or past OpenAI's [-100, 100] (1e39 is inf in float32): sampling then picked arbitrary tokens.
    ("logit_bias", {5: float("inf")}), ("logit_bias", {5: float("nan")}), ("logit_bias", {5: 1e39}),
    ("logit_bias", {5: -100.5}),
    # Infinity passed the bare "> 0" / ">= 0" checks, and turned logits into NaN.
    ("repetition_penalty", float("inf")), ("temperature", float("inf")),
    # vLLM's ceiling (VLLM_MAX_N_SEQUENCES): n=10**9 held the server's event loop while it built the children.
    ("n", 16385),
    # vLLM's rule: a count of tokens to keep, or -1 for the engine's limit; 0 would keep nothing.
    ("truncate_prompt_tokens", 0), ("truncate_prompt_tokens", -2), ("truncate_prompt_tokens", 2.0),
    ("truncate_prompt_tokens", True),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_is_rejected():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_defaults_and_normalization_follow_vllm():
    params = SamplingParams()
    assert params.max_tokens == 16 and params.temperature == 1.0 and params.top_k == 0
    assert params.sampling_type == SamplingType.RANDOM
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(logit_bias={"5": 2}).logit_bias == {5: 2.0}
    assert SamplingParams(stop_token_ids=[7, 9]).all_stop_token_ids == frozenset({7, 9})
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.2)
    assert greedy.is_greedy and (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)


def test_the_seed_and_bias_ranges_include_their_ends():
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1 and SamplingParams(seed=-(2**63)).seed == -(2**63)
    assert SamplingParams(logit_bias={1: -100, 2: 100.0}).logit_bias == {1: -100.0, 2: 100.0}
    with pytest.raises(ValueError, match=r"SamplingParams\.seed must be .* got 18446744073709551616$"):
        SamplingParams(seed=2**64)
    with pytest.raises(ValueError, match=r"SamplingParams\.logit_bias .* got 1e\+39 for token id 5$"):
        SamplingParams(logit_bias={5: 1e39})


def test_seed_minus_one_means_unseeded_as_in_vllm():
    # vLLM (and many clients) send seed=-1 for "no seed"; taken literally it repeated one output forever.
    params = SamplingParams(seed=-1, n=2)
    assert params.seed is None and params.sampling_type == SamplingType.RANDOM
    assert SamplingParams(seed=-2).seed == -2  # only -1 is special


@pytest.mark.parametrize("temperature, expected", [(1e-6, 0.01), (1e-4, 0.01), (0.005, 0.01), (0.01, 0.01),
                                                   (0.02, 0.02)])
def test_a_positive_temperature_below_one_hundredth_is_raised_to_it_as_in_vllm(temperature, expected):
    # vLLM samples any positive temperature below 0.01 at 0.01; only temperature 0 is greedy.
    params = SamplingParams(temperature=temperature)
    assert params.temperature == expected and params.sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.0).is_greedy
