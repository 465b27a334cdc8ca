"""Stop strings end requests in the core (blocks freed, reported as "stop" with the string), and
logprobs come back as vLLM-style dicts whose values and ranks match transformers' distribution."""

import pytest

from engine import LLM, SamplingParams
from tests.engine.model_fixtures import hf_logits, load_hf_model

PROMPT = "The scheduler preempts a request when"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path), max_num_seqs=8, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def free_run(llm):
    """The greedy output without any stop string."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]


def all_blocks_free(llm):
    manager = llm.scheduler.kv_cache_manager
    return manager.num_free_blocks == manager.num_usable_blocks


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_truncates_and_finishes(llm, free_run, include):
    text = free_run.text
    middle = len(text) // 2
    stop = text[middle:middle + 2]
    first = text.find(stop)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop],
                            include_stop_str_in_output=include)
    # A neighbor without stop strings keeps running after the stopped request leaves.
    neighbor = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    output, other = llm.generate([PROMPT, PROMPT + " it"], [params, neighbor], use_tqdm=False)
    completion = output.outputs[0]
    assert completion.text == (text[:first + len(stop)] if include else text[:first])
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    # Generation stopped at the token that completed the string; the tokens are a prefix of the free run.
    assert len(completion.token_ids) < MAX_TOKENS
    assert completion.token_ids == free_run.token_ids[:len(completion.token_ids)]
    assert len(other.outputs[0].token_ids) == MAX_TOKENS
    assert all_blocks_free(llm)
    assert llm.scheduler.get_num_unfinished_requests() == 0


def test_stop_token_id_and_eos(llm, free_run):
    stop_token = free_run.token_ids[5]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_token])
    completion = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert completion.token_ids == free_run.token_ids[:free_run.token_ids.index(stop_token) + 1]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_token)
    # The stop token stays in token_ids but, like vLLM, not in the text (unless asked for).
    tokenizer = llm.get_tokenizer()
    assert completion.text == tokenizer.decode(completion.token_ids[:-1], skip_special_tokens=True)
    params.include_stop_str_in_output = True
    included = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert included.text == tokenizer.decode(included.token_ids, skip_special_tokens=True)


def test_logprobs_match_transformers(llm, tiny_llama_path):
    hf_model = load_hf_model(tiny_llama_path)
    tokenizer = llm.get_tokenizer()
    for params in (SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2),
                   SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, logprobs=0)):
        output = llm.generate(PROMPT, params, use_tqdm=False)[0]
        completion = output.outputs[0]
        sequence = output.prompt_token_ids + completion.token_ids
        reference = hf_logits(hf_model, sequence).log_softmax(dim=-1)
        num_prompt = len(output.prompt_token_ids)
        assert len(completion.logprobs) == len(completion.token_ids)
        total = 0.0
        for step, (token_id, entries) in enumerate(zip(completion.token_ids, completion.logprobs)):
            row = reference[num_prompt - 1 + step]
            assert token_id in entries
            assert len(entries) in (params.logprobs, params.logprobs + 1)
            for candidate, logprob in entries.items():
                assert logprob.logprob == pytest.approx(row[candidate].item(), abs=1e-4)
                assert logprob.rank == int((row > row[candidate] + 1e-6).sum()) + 1
                assert logprob.decoded_token == tokenizer.decode([candidate])
            top = sorted(entries.values(), key=lambda lp: lp.rank)
            if params.logprobs:
                assert [lp.rank for lp in top[:params.logprobs]] == list(range(1, params.logprobs + 1))
            if params.temperature == 0.0:
                assert entries[token_id].rank == 1
            total += entries[token_id].logprob
        assert completion.cumulative_logprob == pytest.approx(total, abs=1e-4)

        if params.prompt_logprobs is None:
            assert output.prompt_logprobs is None
            continue
        # Prompt logprobs: None for the first token, then each prompt token's logprob given its prefix,
        # gathered across the chunks the 16-token budget cut the prompt into.
        assert num_prompt > 16
        assert len(output.prompt_logprobs) == num_prompt and output.prompt_logprobs[0] is None
        for position in range(1, num_prompt):
            entries = output.prompt_logprobs[position]
            token_id = output.prompt_token_ids[position]
            assert entries[token_id].logprob == pytest.approx(reference[position - 1][token_id].item(), abs=1e-4)
            assert len(entries) <= params.prompt_logprobs + 1
    assert all_blocks_free(llm)


def test_no_logprobs_by_default(llm):
    completion = llm.generate(PROMPT, SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0]
    assert completion.logprobs is None and completion.cumulative_logprob is None
    assert 1 <= len(completion.token_ids) <= 3
