"""``use_beam_search`` through the official openai client (``extra_body``), as vLLM serves it: ``n`` is the beam
width; on /v1/completions prompt p's n best sequences are choices p * n .. p * n + n - 1, on /v1/chat/completions
the conversation's n best messages are choices 0 .. n - 1, best first, equal to ``LLM.beam_search`` on the same
model and prompt."""

import httpx
import openai
import pytest

from engine import LLM
from engine.beam_search import BeamSearchParams
from engine.chat_template import render_chat
from tests.serve.serve_helpers import wait_until_idle

PROMPTS = ["The scheduler picks the next batch", "Blocks are freed when"]
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Which blocks are freed?"}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60.0) as client:
        yield client


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_beam_search_completion_equals_llm_beam_search(client, server, tiny_model_path, ignore_eos):
    response = client.completions.create(model="tiny", prompt=PROMPTS, n=3, max_tokens=5, temperature=0.0,
                                         extra_body={"use_beam_search": True, "ignore_eos": ignore_eos,
                                                     "return_token_ids": True})
    llm = LLM(model=str(tiny_model_path), max_model_len=512)
    expected = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=ignore_eos))
    want = [sequence for output in expected for sequence in output.sequences]
    assert [choice.index for choice in response.choices] == list(range(6))
    assert [choice.model_extra["token_ids"] for choice in response.choices] == [s.output_token_ids for s in want]
    assert [choice.text for choice in response.choices] == [s.text for s in want]
    assert [choice.finish_reason for choice in response.choices] == [s.finish_reason for s in want]
    assert response.usage.completion_tokens == sum(len(s.output_token_ids) for s in want)
    wait_until_idle(server.url)


def test_beam_search_streams_each_choice_whole_at_the_end(client):
    """vLLM streams beam search too: each choice's whole text in one chunk, then the usage, then [DONE]."""
    extra = {"use_beam_search": True, "ignore_eos": True, "return_token_ids": True}
    full = client.completions.create(model="tiny", prompt=PROMPTS, n=2, max_tokens=4, extra_body=extra)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS, n=2, max_tokens=4, stream=True,
                                            stream_options={"include_usage": True}, extra_body=extra))
    assert [(c.choices[0].index, c.choices[0].text, c.choices[0].finish_reason) for c in chunks[:-1]] == \
        [(c.index, c.text, c.finish_reason) for c in full.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 16


@pytest.mark.parametrize("change", [{"logprobs": 2}, {"echo": True}, {"stop": ["x"]},
                                    {"top_p": 0.5}])
def test_beam_search_refuses_what_it_would_ignore(server, change):
    name = next(iter(change))
    response = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 3,
                                                                 "use_beam_search": True, **change}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "use_beam_search" and f"does not take {name}" in error["message"], error


@pytest.fixture(scope="module")
def offline_llm(tiny_model_path):
    return LLM(model=str(tiny_model_path), max_model_len=512)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_beam_search_chat_equals_llm_beam_search_on_the_rendered_conversation(client, server, offline_llm,
                                                                             length_penalty):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, n=3, max_completion_tokens=5,
                                              extra_body={"use_beam_search": True, "ignore_eos": True,
                                                          "length_penalty": length_penalty,
                                                          "return_token_ids": True})
    rendered = render_chat(offline_llm.tokenizer, MESSAGES, True)
    prompt_token_ids = response.model_extra["prompt_token_ids"]
    assert prompt_token_ids == offline_llm.tokenizer.encode(rendered["prompt"], add_special_tokens=False)
    expected = offline_llm.beam_search([{"prompt_token_ids": prompt_token_ids}],
                                       BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True,
                                                        length_penalty=length_penalty))[0].sequences
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    assert [choice.model_extra["token_ids"] for choice in response.choices] == [s.output_token_ids for s in expected]
    assert [choice.message.content for choice in response.choices] == [s.text for s in expected]
    assert {choice.message.role for choice in response.choices} == {"assistant"}
    assert [choice.finish_reason for choice in response.choices] == ["length"] * 3
    assert response.object == "chat.completion" and response.usage.completion_tokens == 15
    assert response.usage.prompt_tokens == len(prompt_token_ids)
    wait_until_idle(server.url)


def test_beam_search_chat_streams_each_message_whole_at_the_end(client, server):
    extra = {"use_beam_search": True, "ignore_eos": True}
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, max_tokens=4, extra_body=extra)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=extra))
    assert [c.object for c in chunks] == ["chat.completion.chunk"] * 3
    assert [(c.choices[0].index, c.choices[0].delta.role, c.choices[0].delta.content, c.choices[0].finish_reason)
            for c in chunks[:-1]] == [(c.index, "assistant", c.message.content, c.finish_reason) for c in full.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 8
    wait_until_idle(server.url)


@pytest.mark.parametrize("change", [{"logprobs": True}, {"min_tokens": 2}, {"stop": ["x"]},
                                    {"tools": [{"type": "function", "function": {"name": "f"}}]},
                                    {"response_format": {"type": "json_object"}}, {"seed": 3}])
def test_beam_search_chat_refuses_what_it_would_ignore(server, change):
    name = next(iter(change))
    response = httpx.post(f"{server.url}/v1/chat/completions",
                          json={"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "use_beam_search": True,
                                **change}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "use_beam_search" and f"does not take {name}" in error["message"], error
    wait_until_idle(server.url)
