"""``truncate_prompt_tokens`` (vLLM's): the front end keeps the prompt's last k tokens before the request is
made, so the core serves the cut prompt as if it had been sent; -1 keeps as many as the engine allows, a
count above that is refused by name, and an over-long prompt is served instead of refused."""

import pytest

from engine import LLM, SamplingParams

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path), max_num_seqs=8, max_model_len=MAX_MODEL_LEN)


def greedy(**fields) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 4, "ignore_eos": True, **fields})


def assert_all_blocks_free(llm):
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_keeps_the_last_k_tokens_and_generates_as_that_prompt(llm):
    prompt = list(range(10, 40))
    cut = llm.generate([prompt], greedy(truncate_prompt_tokens=7, prompt_logprobs=2), use_tqdm=False)[0]
    alone = llm.generate([prompt[-7:]], greedy(prompt_logprobs=2), use_tqdm=False)[0]
    assert cut.prompt_token_ids == prompt[-7:]
    assert cut.prompt is None  # the text of the cut prompt is not the text that was sent
    assert cut.outputs[0].token_ids == alone.outputs[0].token_ids
    # Prompt logprobs are the cut prompt's: one per kept token, the first None.
    assert len(cut.prompt_logprobs) == 7 and cut.prompt_logprobs[0] is None
    for mine, reference, token_id in zip(cut.prompt_logprobs[1:], alone.prompt_logprobs[1:], prompt[-6:]):
        assert mine[token_id].logprob == pytest.approx(reference[token_id].logprob, abs=1e-5)
    assert_all_blocks_free(llm)


def test_a_shorter_prompt_and_text_prompts(llm):
    short = llm.generate([[5, 6, 7]], greedy(truncate_prompt_tokens=10), use_tqdm=False)[0]
    assert short.prompt_token_ids == [5, 6, 7]
    text = "the scheduler picks the next batch of requests"
    token_ids = llm.get_tokenizer()(text).input_ids
    cut = llm.generate(text, greedy(truncate_prompt_tokens=3), use_tqdm=False)[0]
    assert cut.prompt_token_ids == token_ids[-3:]


def test_over_long_prompt_is_served_with_truncation_and_refused_without(llm):
    prompt = [7] * 100
    with pytest.raises(ValueError, match="more than the engine allows"):
        llm.generate([prompt], greedy(), use_tqdm=False)
    for keep, expected in ((MAX_MODEL_LEN - 4, MAX_MODEL_LEN - 4), (-1, MAX_MODEL_LEN)):
        output = llm.generate([prompt], greedy(truncate_prompt_tokens=keep, max_tokens=None), use_tqdm=False)[0]
        assert len(output.prompt_token_ids) == expected
        # Generation runs to the engine's limit (the last position's token is still returned).
        assert output.outputs[0].finish_reason == "length" and output.outputs[0].token_ids
    assert_all_blocks_free(llm)


def test_a_count_above_max_model_len_is_refused_by_name(llm):
    with pytest.raises(ValueError, match=r"prompt 1: SamplingParams\.truncate_prompt_tokens must be -1 or at most "
                                         rf"max_model_len \({MAX_MODEL_LEN}\), got {MAX_MODEL_LEN + 1}"):
        llm.generate([[5, 6], [5, 6]], [greedy(), greedy(truncate_prompt_tokens=MAX_MODEL_LEN + 1)], use_tqdm=False)
    assert llm.scheduler.get_num_unfinished_requests() == 0
    assert_all_blocks_free(llm)
