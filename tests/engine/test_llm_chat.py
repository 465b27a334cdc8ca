"""LLM.chat: conversations through the model's chat template, then generate; bad messages are named."""

import pytest

from engine import LLM, SamplingParams
from engine.chat_template import render_chat

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a cache."}]


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path), max_num_seqs=8)


def test_chat_is_generate_on_the_rendered_conversation(llm):
    rendered = render_chat(llm.get_tokenizer(), CONVERSATION)
    assert rendered["prompt_token_ids"] and "Name a cache." in rendered["prompt"]
    expected = llm.generate([rendered], GREEDY, use_tqdm=False)[0]
    (output,) = llm.chat(CONVERSATION, GREEDY, use_tqdm=False)
    assert output.prompt_token_ids == rendered["prompt_token_ids"]
    assert output.outputs[0].token_ids == expected.outputs[0].token_ids
    # A list of conversations gives one output each, in order.
    second = [{"role": "user", "content": "And another?"}]
    outputs = llm.chat([CONVERSATION, second], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == [rendered["prompt_token_ids"],
                                                     render_chat(llm.get_tokenizer(), second)["prompt_token_ids"]]
    without = llm.chat(second, GREEDY, use_tqdm=False, add_generation_prompt=False)[0]
    assert len(without.prompt_token_ids) < len(outputs[1].prompt_token_ids)


@pytest.mark.parametrize("messages, message", [
    ([], "a conversation"),
    ("hello", "a conversation"),
    ([{"role": "user"}], r"messages\[0\] must be a mapping"),
    ([CONVERSATION, [{"role": "user", "content": 5}]], r"messages\[1\]\[0\] must be a mapping"),
])
def test_bad_messages_are_named(llm, messages, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(messages, GREEDY, use_tqdm=False)
    assert not llm.scheduler.requests
