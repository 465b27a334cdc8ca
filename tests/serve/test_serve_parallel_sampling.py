"""``n`` choices per request through the official openai client: completions and chat, streamed and not.

Seeded choices are reproducible and differ from one another; a streamed choice says what the same
choice says unstreamed; the usage counts every choice's tokens and the prompt once; nothing leaks.
"""

import openai
import pytest

from tests.serve.serve_helpers import metric, wait_until_idle

PROMPT = "Several answers to one question"
MESSAGES = [{"role": "user", "content": "Give me three names."}]
SAMPLED = dict(temperature=1.0, seed=123, max_tokens=8, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30.0) as client:
        yield client


def test_completion_choices_streamed_and_not(client, server):
    full = client.completions.create(model="tiny", prompt=PROMPT, n=3, logprobs=1, **SAMPLED)
    assert [choice.index for choice in full.choices] == [0, 1, 2]
    assert all(choice.finish_reason == "length" for choice in full.choices)
    assert len({choice.text for choice in full.choices}) == 3
    assert all(len(choice.logprobs.tokens) == 8 for choice in full.choices)
    assert full.usage.completion_tokens == 24
    assert full.usage.total_tokens == full.usage.prompt_tokens + 24
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, n=3, logprobs=1, stream=True,
                                            stream_options={"include_usage": True}, **SAMPLED))
    text_chunks = [chunk for chunk in chunks if chunk.choices]
    assert all(len(chunk.choices) == 1 for chunk in text_chunks)  # one choice per chunk, as OpenAI sends them
    for choice in full.choices:
        mine = [chunk.choices[0] for chunk in text_chunks if chunk.choices[0].index == choice.index]
        assert "".join(part.text for part in mine) == choice.text
        assert sum((part.logprobs.tokens for part in mine), []) == choice.logprobs.tokens
        assert [part.finish_reason for part in mine][-1] == "length"
        assert all(part.finish_reason is None for part in mine[:-1])
    assert chunks[-1].usage.completion_tokens == 24
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")


def test_chat_choices_streamed_and_not(client):
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, **SAMPLED)
    assert [choice.index for choice in full.choices] == [0, 1]
    assert full.choices[0].message.content != full.choices[1].message.content
    assert full.usage.completion_tokens == 16
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, stream=True, **SAMPLED))
    for choice in full.choices:
        mine = [chunk.choices[0] for chunk in chunks if chunk.choices and chunk.choices[0].index == choice.index]
        assert mine[0].delta.role == "assistant" and all(part.delta.role is None for part in mine[1:])
        assert "".join(part.delta.content for part in mine) == choice.message.content
        assert mine[-1].finish_reason == "length"


def test_a_bad_n_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="tiny", prompt=PROMPT, n=0)
    assert raised.value.body["param"] == "n"


def test_a_batch_of_prompts_gives_n_choices_per_prompt(client, server):
    prompts = ["First prompt of the batch", "Second", "The third prompt"]
    alone = [client.completions.create(model="tiny", prompt=prompt, n=2, **SAMPLED) for prompt in prompts]
    batch = client.completions.create(model="tiny", prompt=prompts, n=2, **SAMPLED)
    # Prompt p's choice i is choice p * n + i, and says what the prompt alone says (seeded).
    assert [choice.index for choice in batch.choices] == list(range(6))
    assert [choice.text for choice in batch.choices] == [choice.text for one in alone for choice in one.choices]
    assert batch.usage.prompt_tokens == sum(one.usage.prompt_tokens for one in alone)
    assert batch.usage.completion_tokens == 6 * 8
    chunks = list(client.completions.create(model="tiny", prompt=prompts, n=2, stream=True,
                                            stream_options={"include_usage": True}, **SAMPLED))
    streamed: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {choice.index: choice.text for choice in batch.choices}
    assert chunks[-1].usage.completion_tokens == 6 * 8
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")


def test_a_bad_prompt_in_a_batch_is_named_and_nothing_runs(client, server):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="tiny", prompt=[[1, 2], [1, 2, 100_000]], max_tokens=4)
    assert raised.value.body["param"] == "prompt" and "prompt[1]:" in raised.value.body["message"]


def test_echo_scores_the_prompt_as_evaluation_harnesses_ask(client, tiny_model_path):
    # What lm-evaluation-harness sends for a log-likelihood: token prompts in a batch, echo, logprobs=1,
    # one greedy token. Each choice starts with its prompt; the prompt's logprobs are the engine's
    # prompt logprobs (the first null: nothing predicts it), then the generated token's.
    from engine import LLM, SamplingParams

    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 42]]
    response = client.completions.create(model="tiny", prompt=prompts, max_tokens=1, logprobs=1, echo=True,
                                         temperature=0.0)
    offline = LLM(model=str(tiny_model_path), max_model_len=512).generate(
        prompts, SamplingParams(max_tokens=1, temperature=0.0, logprobs=1, prompt_logprobs=1), use_tqdm=False)
    for choice, prompt, reference in zip(response.choices, prompts, offline):
        logprobs = choice.logprobs
        assert len(logprobs.tokens) == len(prompt) + 1
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        expected = [position[token].logprob for position, token in zip(reference.prompt_logprobs[1:], prompt[1:])]
        assert logprobs.token_logprobs[1:len(prompt)] == pytest.approx(expected, abs=1e-4)
        sampled = reference.outputs[0].token_ids[0]
        assert logprobs.token_logprobs[-1] == pytest.approx(reference.outputs[0].logprobs[0][sampled].logprob, abs=1e-4)
        assert logprobs.text_offset == sorted(logprobs.text_offset)
        assert choice.text.endswith(reference.outputs[0].text)
    text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, echo=True, temperature=0.0)
    assert text.choices[0].text.startswith(PROMPT) and text.choices[0].logprobs is None
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, echo=True, temperature=0.0,
                                            stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == text.choices[0].text


def test_echo_without_generation_returns_the_prompt_alone(client):
    # max_tokens=0 with echo: vLLM's "echo without generation", what a harness sends to score a whole text.
    prompt = [5, 6, 7, 8, 9, 10]
    response = client.completions.create(model="tiny", prompt=[prompt, prompt[:3]], max_tokens=0, echo=True,
                                         logprobs=1, temperature=0.0)
    for choice, tokens in zip(response.choices, (prompt, prompt[:3])):
        assert len(choice.logprobs.tokens) == len(tokens) and choice.logprobs.token_logprobs[0] is None
        assert choice.finish_reason == "length"
    assert response.usage.completion_tokens == 0 and response.usage.prompt_tokens == 9
    text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True)
    assert text.choices[0].text == PROMPT
    streamed = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, stream=True))
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == PROMPT
    with pytest.raises(openai.BadRequestError) as raised:  # without echo, nothing to return
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0)
    assert raised.value.body["param"] == "max_tokens"
