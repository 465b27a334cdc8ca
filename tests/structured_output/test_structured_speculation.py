"""Structured outputs with speculative decoding: drafts are cut to what the grammar accepts, and each drafted
position is verified under the grammar's state after the drafts before it (as vLLM V1 verifies them). Greedy and
seeded requests then produce exactly the tokens of decoding one token per step, grammar and all."""

import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.structured_output.helpers import SCHEMA, assert_healthy

PROMPTS = ["The answer is", "Pick a color:", "Hello world", "Once upon"]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _structures():
    return [StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(regex=r"([0-9]{3}-){3}[0-9]{3}"),
            StructuredOutputsParams(choice=["yes yes yes", "no no no"]), StructuredOutputsParams(json_object=True)]


@pytest.fixture(scope="module")
def engines(small_model_path):
    options = dict(model=str(small_model_path), max_num_seqs=8, max_model_len=256, num_gpu_blocks=96)
    return LLM(**options), LLM(**options, speculative_config=NGRAM), LLM(**options, speculative_config={
        "model": str(small_model_path), "num_speculative_tokens": 3})


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (0.9, 7)])
def test_tokens_are_those_of_decoding_one_token_per_step(engines, temperature, seed):
    plain, ngram, drafted = engines
    params = [SamplingParams(temperature=temperature, seed=seed, max_tokens=24, structured_outputs=structure)
              for structure in _structures()]
    expected = [output.outputs[0].token_ids for output in plain.generate(PROMPTS, params, use_tqdm=False)]
    for llm in (ngram, drafted):
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        assert [output.outputs[0].token_ids for output in outputs] == expected


def test_drafts_are_verified_under_the_grammar(engines):
    """The n-gram proposer finds the grammar's repetitions: drafts are proposed, cut to the grammar and kept, so the
    path is exercised, not skipped. (The draft model drafts without the grammar, its random weights' argmax, which
    the grammar mostly cuts away: its requests still come out right.)"""
    _, ngram, drafted = engines
    params = SamplingParams(temperature=0.0, max_tokens=24,
                            structured_outputs=StructuredOutputsParams(regex=r"(ab){10}"))
    before = ngram.engine_core.scheduler.make_stats().spec_decoding["num_accepted_tokens"]
    assert ngram.generate(["x"], params, use_tqdm=False)[0].outputs[0].text == "ab" * 10
    assert ngram.engine_core.scheduler.make_stats().spec_decoding["num_accepted_tokens"] > before
    assert drafted.generate(["x"], params, use_tqdm=False)[0].outputs[0].text == "ab" * 10
    for llm in (ngram, drafted):
        assert_healthy(llm)
