"""The official openai client against ``python -m engine.serve``: completions and chat, streaming and
not, usage, logprobs, stop, seed; greedy streams say exactly what the non-streamed answer says."""

import httpx
import openai
import pytest

from tests.serve.serve_helpers import metric, wait_until_idle

PROMPT = "The scheduler picks the next batch"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a cache."}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30.0) as client:
        yield client


def test_models(client, server):
    models = client.models.list().data
    assert [model.id for model in models] == ["tiny"]
    card = httpx.get(f"{server.url}/v1/models").json()["data"][0]
    assert card["max_model_len"] == 512 and card["vocab_size"] == 512 and card["reserved_token_ids"] == [0, 1, 2, 3]


def test_completion_streamed_equals_non_streamed(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.0,
                                     extra_body={"ignore_eos": True})
    choice = full.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert full.usage.completion_tokens == 12 and full.usage.total_tokens == full.usage.prompt_tokens + 12
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text_chunks = [chunk for chunk in chunks if chunk.choices]
    assert "".join(chunk.choices[0].text for chunk in text_chunks) == choice.text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == []
    # The second request finds the first one's prompt blocks in the prefix cache: only counts compare.
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (full.usage.prompt_tokens, 12)


def test_chat_streamed_equals_non_streamed(client):
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=10,
                                          temperature=0.0, extra_body={"ignore_eos": True})
    message = full.choices[0].message
    assert message.role == "assistant" and message.content and full.choices[0].finish_reason == "length"
    assert full.object == "chat.completion" and full.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=10,
                                                 temperature=0.0, stream=True, extra_body={"ignore_eos": True},
                                                 stream_options={"include_usage": True}))
    text_chunks = [chunk for chunk in chunks if chunk.choices]
    assert text_chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in text_chunks) == message.content
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_chat_prompt_is_the_chat_template(client, tiny_model_path):
    from engine.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_path)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    expected = len(tokenizer(rendered, add_special_tokens=False).input_ids)
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
    assert response.usage.prompt_tokens == expected


def test_completion_logprobs(client):
    extra = {"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
    response = client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=4, temperature=0.0,
                                         logprobs=3, extra_body=extra)
    logprobs = response.choices[0].logprobs
    token_ids = response.choices[0].model_extra["token_ids"]
    assert logprobs.tokens == [f"token_id:{token_id}" for token_id in token_ids] and len(token_ids) == 4
    for token, token_logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        # Greedy: the sampled token is the most likely one, so it is among the top 3.
        assert len(top) == 3 and top[token] == token_logprob == pytest.approx(max(top.values()))
    assert logprobs.text_offset[0] == 0
    # Streamed, the same positions arrive chunk by chunk.
    chunks = list(client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=4, temperature=0.0,
                                            logprobs=3, stream=True, extra_body=extra))
    assert sum((chunk.choices[0].logprobs.tokens for chunk in chunks), []) == logprobs.tokens


def test_chat_logprobs(client):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0.0,
                                              logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = response.choices[0].logprobs.content
    assert len(content) == 3
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_seed_makes_sampling_reproducible(client):
    def sample(seed):
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) > 1


def test_stop_string(client):
    text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = text[3:6]
    for stream in (False, True):
        response = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.0,
                                             stop=[stop], stream=stream, extra_body={"ignore_eos": True})
        chunks = list(response) if stream else [response]
        assert "".join(chunk.choices[0].text for chunk in chunks) == text[:text.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_token_id_prompt_and_model_default(client, server):
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": [9, 10, 11], "max_tokens": 2,
                                                                "ignore_eos": True}).json()
    assert response["model"] == "tiny" and response["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}


def test_prefix_cache_hits_show_in_usage_and_metrics(client, server):
    prompt = list(range(10, 60))  # 50 tokens: three full blocks of 16 to share
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, extra_body={"ignore_eos": True})
    second = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, extra_body={"ignore_eos": True})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 48
    samples = wait_until_idle(server.url)
    assert metric(samples, "servesim_prefix_cache_hits_total") >= 48


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client, route):
    """vLLM's stream_options.continuous_usage_stats: each chunk's usage counts the tokens streamed up to it."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    if route == "completions":
        stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, stream=True,
                                           stream_options=options, extra_body={"ignore_eos": True})
    else:
        stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=8,
                                                stream=True, stream_options=options, extra_body={"ignore_eos": True})
    chunks = list(stream)
    counts = [chunk.usage.completion_tokens for chunk in chunks if chunk.choices]
    assert counts == sorted(counts) and counts[-1] == 8 and len(counts) >= 2
    assert all(chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
               for chunk in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_a_model_is_retrieved_by_its_id(client):
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("gpt-5")
    assert "The model `gpt-5` does not exist" in error.value.body["message"]
