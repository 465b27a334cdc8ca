"""Images through the OpenAI-compatible server (the official openai client, the generated tiny LLaVA): an ``image_url`` part
with a base64 data: URL reaches the model as the engine's own ``multi_modal_data`` does, whether the chat template
reads content as a string (a mark per image in front of the text) or walks its parts; URLs the server cannot read,
and images for a text-only model, are 400s that name the message."""

from __future__ import annotations

import base64
import io
import re
import shutil

import httpx
import numpy as np
import openai
import pytest

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM
from engine.serve import ServerThread, build_app
from engine.models import default_model_path
from tests.models.test_llava_images import TOKENS_PER_IMAGE, image

@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    """The generated tiny LLaVA: its tokenizer marks images with ``<image>`` (id 511, the model's image token) and
    its chat template walks content parts."""
    return default_model_path("tiny-llava", cache_dir=tmp_path_factory.mktemp("servesim-cache"))


def with_string_template(path, tmp_path):
    """A copy of ``path`` whose chat template reads each message's content as a string."""
    from transformers import AutoTokenizer

    from engine.models.synthetic_tokenizer import CHAT_TEMPLATE

    copy = tmp_path / "string-template"
    shutil.copytree(path, copy)
    tokenizer = AutoTokenizer.from_pretrained(str(copy))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(copy))
    return copy


def data_url(picture: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("template", ["string", "parts"], ids=["string-content", "content-parts"])
def test_an_image_url_reaches_the_model(tiny_llava, tmp_path, template):
    path = with_string_template(tiny_llava, tmp_path) if template == "string" else tiny_llava
    options = dict(model=str(path), dtype="float32", max_model_len=128, num_gpu_blocks=64)
    picture = image(7)
    engine = AsyncLLM(**options)
    with ServerThread(build_app(engine, "llava", shutdown_engine=True)) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
            response = client.chat.completions.create(
                model="llava", max_tokens=5, temperature=0.0,
                messages=[{"role": "system", "content": "be brief"},
                          {"role": "user", "content": [
                              {"type": "image_url", "image_url": {"url": data_url(picture)}},
                              {"type": "text", "text": "what is shown here?"}]}],
                extra_body={"ignore_eos": True, "return_token_ids": True})
    prompt_ids = response.prompt_token_ids
    marks = [position for position, token in enumerate(prompt_ids) if token == 511]
    assert len(marks) == TOKENS_PER_IMAGE and marks == list(range(marks[0], marks[0] + TOKENS_PER_IMAGE))
    tokens = response.choices[0].token_ids
    assert len(tokens) == 5 and response.usage.prompt_tokens == len(prompt_ids)
    # The engine's own path, given the server's prompt and the same picture, samples the same tokens.
    llm = LLM(**options)
    expected = llm.generate([{"prompt_token_ids": prompt_ids, "multi_modal_data": {"image": picture}}],
                            SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True), use_tqdm=False)[0]
    assert list(expected.outputs[0].token_ids) == list(tokens)


@pytest.mark.parametrize("url,message", [
    ("https://example.com/cat.png", r"messages\[0\].content\[0\].image_url.url: only data: URLs"),
    ("data:image/png,rawbytes", r"a data: URL must be base64"),
    ("data:image/png;base64,bm90IGFuIGltYWdl", r"not a readable image"),
])
def test_unreadable_image_urls_are_400s(tiny_llava, url, message):
    engine = AsyncLLM(model=str(tiny_llava), dtype="float32", max_model_len=128,
                      num_gpu_blocks=64)
    with ServerThread(build_app(engine, "llava", shutdown_engine=True)) as server:
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": "hi"}]}], "max_tokens": 2}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"
        assert re.search(message, answer.json()["error"]["message"])
        # Still serving.
        ok = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "ignore_eos": True})
        assert ok.status_code == 200


def test_a_text_model_refuses_images(server):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(image(1))}}, {"type": "text", "text": "hi"}]}],
        "max_tokens": 2}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400
    assert "messages[0]: image content needs a vision-language model" in answer.json()["error"]["message"]


def test_beam_search_refuses_images(tiny_llava):
    engine = AsyncLLM(model=str(tiny_llava), dtype="float32", max_model_len=128,
                      num_gpu_blocks=64)
    with ServerThread(build_app(engine, "llava", shutdown_engine=True)) as server:
        body = {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(image(2))}}, {"type": "text", "text": "hi"}]}],
            "max_tokens": 2, "use_beam_search": True, "n": 2}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"
        assert "use_beam_search does not take image_url content" in answer.json()["error"]["message"]
