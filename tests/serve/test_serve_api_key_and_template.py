"""Two vLLM server options: ``--api-key`` (the /v1 routes need ``Authorization: Bearer KEY``; the openai client's
``api_key`` is that header; ``sim.run --executor server --api-key`` sends it) and ``--chat-template`` (a Jinja template
or a file holding one, instead of the tokenizer's; ``LLM.chat(chat_template=...)`` likewise)."""

import json

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM
from engine.chat_template import load_chat_template
from engine.serve import ServerThread, build_app
from sim.run import main as sim_run_main
from tests.serve.serve_helpers import run_cli

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def guarded_server(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=16, num_gpu_blocks=256, max_model_len=512)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True, api_keys=["key-one", "key-two"],
                                chat_template=TEMPLATE)) as server:
        yield server


def test_the_v1_routes_need_one_of_the_keys(guarded_server):
    for key in ("key-one", "key-two"):
        with openai.OpenAI(base_url=f"{guarded_server.url}/v1", api_key=key, max_retries=0, timeout=30) as client:
            assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    with openai.OpenAI(base_url=f"{guarded_server.url}/v1", api_key="wrong", max_retries=0, timeout=30) as client:
        with pytest.raises(openai.AuthenticationError) as error:
            client.models.list()
    assert error.value.body["code"] == "invalid_api_key"
    assert httpx.post(f"{guarded_server.url}/v1/chat/completions", json={"messages": MESSAGES}).status_code == 401
    # Probes and scrapers stay open, as in vLLM.
    assert httpx.get(f"{guarded_server.url}/health").status_code == 200
    assert httpx.get(f"{guarded_server.url}/metrics").status_code == 200


def test_the_chat_template_replaces_the_tokenizers(guarded_server, tiny_model_path):
    tokenized = httpx.post(f"{guarded_server.url}/tokenize", json={"messages": MESSAGES}).json()
    detokenized = httpx.post(f"{guarded_server.url}/detokenize", json={"tokens": tokenized["tokens"]}).json()
    assert detokenized["prompt"] == "<user>hello\n<assistant>"
    with openai.OpenAI(base_url=f"{guarded_server.url}/v1", api_key="key-one", max_retries=0, timeout=30) as client:
        usage = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=1).usage
    assert usage.prompt_tokens == tokenized["count"]
    llm = LLM(model=str(tiny_model_path), max_model_len=256)
    prompt = llm.chat(MESSAGES, SamplingParams(max_tokens=1), use_tqdm=False, chat_template=TEMPLATE)[0].prompt
    assert prompt == "<user>hello\n<assistant>"


def test_a_load_run_sends_the_key(guarded_server, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    args = ["cpu_chat", "--executor", "server", "--url", guarded_server.url, "--set", "workload.num_requests=4",
            "--set", "workload.output_len={type: uniform, min: 2, max: 4}",
            "--set", "workload.prompt_len={type: uniform, min: 8, max: 64}", "--no-progress", "--no-dashboard", "--quiet"]
    assert sim_run_main([*args, "--out", str(tmp_path / "refused")]) != 0
    assert "asks for an API key" in capsys.readouterr().err
    assert sim_run_main([*args, "--api-key", "key-two", "--out", str(tmp_path / "served")]) == 0
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["num_requests"] == 4 and summary["num_request_errors"] == 0


def test_chat_template_values_are_files_or_templates(tmp_path, capsys):
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE == load_chat_template(TEMPLATE)
    status, error = run_cli(["--model", "tiny", "--chat-template", str(tmp_path / "missing.jinja")], capsys)
    assert status == 2 and "--chat-template: " in error and "is neither a file nor a Jinja template" in error


def test_browsers_may_call_from_another_origin(guarded_server, tiny_model_path):
    """CORS as vLLM answers it by default (any origin); the preflight needs no key."""
    preflight = httpx.options(f"{guarded_server.url}/v1/chat/completions", headers={
        "Origin": "http://playground.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "*"
    answer = httpx.get(f"{guarded_server.url}/v1/models", headers={"Origin": "http://playground.example",
                                                                   "Authorization": "Bearer key-one"})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
    from engine.serve.cors import CorsSettings

    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=4, num_gpu_blocks=64, max_model_len=256)
    settings = CorsSettings(allowed_origins=["http://allowed.example"])
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True, cors=settings)) as server:
        refused = httpx.options(f"{server.url}/v1/models", headers={
            "Origin": "http://other.example", "Access-Control-Request-Method": "GET"})
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        allowed = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://allowed.example"})
        assert allowed.headers["access-control-allow-origin"] == "http://allowed.example"


def test_continue_final_message_leaves_the_last_message_open(guarded_server, tiny_model_path):
    """vLLM's continue_final_message: no end of turn after the last message, no generation prompt; and
    add_special_tokens lets the tokenizer add its BOS to the rendered text."""
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "The answer is"}]
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    from engine.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_path)
    tokenizer.chat_template = template
    from engine.chat_template import ChatTemplateError, render_chat

    assert render_chat(tokenizer, messages, add_generation_prompt=False, continue_final_message=True)["prompt"] \
        == "<user>hello\n<assistant>The answer is"
    with pytest.raises(ChatTemplateError, match="cannot both be true"):
        render_chat(tokenizer, messages, add_generation_prompt=True, continue_final_message=True)
    with_bos = render_chat(tokenizer, messages, add_generation_prompt=False, add_special_tokens=True)
    plain = render_chat(tokenizer, messages, add_generation_prompt=False)
    assert with_bos["prompt_token_ids"] == [tokenizer.bos_token_id, *plain["prompt_token_ids"]]
    answer = httpx.post(f"{guarded_server.url}/v1/chat/completions", timeout=30,
                        headers={"Authorization": "Bearer key-one"},
                        json={"messages": messages, "max_tokens": 1, "add_generation_prompt": False,
                              "continue_final_message": True, "return_token_ids": True})
    assert answer.status_code == 200, answer.text
    refused = httpx.post(f"{guarded_server.url}/v1/chat/completions", timeout=30,
                         headers={"Authorization": "Bearer key-one"},
                         json={"messages": messages, "max_tokens": 1, "continue_final_message": True})
    assert refused.status_code == 400 and "cannot both be true" in refused.json()["error"]["message"]
