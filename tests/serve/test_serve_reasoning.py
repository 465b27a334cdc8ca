"""Reasoning outputs through the server (``--reasoning-parser deepseek_r1``) with the official openai client: the
message's ``reasoning`` and ``content``, streamed and whole, ``include_reasoning: false``, and a hermes tool call
found in the content after the reasoning. The tiny model has random weights, so its answers are forced with
guided_choice over the whole answer (``--structured-outputs-in-reasoning``; by default a grammar steers only the
answer after the thought, tests/engine/test_structured_outputs_after_reasoning.py)."""

import json

import openai
import pytest

from tests.serve.conftest import SERVER_ARGS, start_server

pytest.importorskip("xgrammar")

MESSAGES = [{"role": "user", "content": "Which is larger, 9.11 or 9.8?"}]
ANSWER = "<think>compare the tenths</think>9.8"


@pytest.fixture(scope="module")
def reasoning_server(tiny_model_path, tmp_path_factory):
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("reasoning-log"),
                           [*SERVER_ARGS, "--reasoning-parser", "deepseek_r1", "--structured-outputs-in-reasoning",
                            "--enable-auto-tool-choice",
                            "--tool-call-parser", "hermes", "--max-model-len", "2048"])
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(reasoning_server):
    with openai.OpenAI(base_url=f"{reasoning_server.url}/v1", api_key="x", max_retries=0, timeout=60.0) as client:
        yield client


def forced(client, answer: str, **fields):
    extra_body = {"guided_choice": [answer], **fields.pop("extra_body", {})}
    return client.chat.completions.create(**{"model": "tiny", "messages": MESSAGES, "max_completion_tokens": 200,
                                             "temperature": 0.0, "extra_body": extra_body, **fields})


def test_the_reasoning_is_split_from_the_content_whole_and_streamed(client):
    message = forced(client, ANSWER).choices[0].message
    assert message.reasoning == "compare the tenths" and message.content == "9.8"
    reasoning, content, roles = "", "", []
    for chunk in forced(client, ANSWER, stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            roles.append(delta.role)
            reasoning += getattr(delta, "reasoning", None) or ""
            content += delta.content or ""
    assert (reasoning, content) == ("compare the tenths", "9.8") and roles[0] == "assistant"


def test_an_answer_cut_inside_the_thought_is_all_reasoning(client):
    message = forced(client, "<think>compare the tenths and then the hundredths</think>9.8",
                     max_completion_tokens=4).choices[0].message
    assert message.content is None and message.reasoning and "</think>" not in message.reasoning


def test_include_reasoning_false_drops_it(client):
    message = forced(client, ANSWER, extra_body={"include_reasoning": False}).choices[0].message
    assert getattr(message, "reasoning", None) is None and message.content == "9.8"


def test_a_tool_call_after_the_reasoning_is_parsed_from_the_content(client):
    call = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=300, temperature=0.0,
        tools=[{"type": "function", "function": {"name": "get_time"}}],
        extra_body={"guided_choice": [f"<think>I need the time</think>{call}"]})
    choice = response.choices[0]
    assert choice.message.reasoning == "I need the time" and choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [("get_time", {})]


def test_an_unknown_reasoning_parser_is_refused_by_the_cli(tiny_model_path, tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "engine.serve", "--model", str(tiny_model_path),
                             "--reasoning-parser", "r2"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert ("--reasoning-parser 'r2' is not a known parser; known: deepseek_r1, deepseek_v3, ernie45, glm45, mistral, "
            "openai_gptoss, qwen3, seed_oss") in result.stderr


def test_chat_template_kwargs_reach_the_template(tiny_model_path):
    """vLLM's chat_template_kwargs (Qwen3's enable_thinking turns its thought off by writing an empty one into the
    prompt): LLM.chat passes them to the template, as the server's chat route does."""
    from engine import LLM, SamplingParams

    llm = LLM(model=str(tiny_model_path), max_model_len=256)
    llm.tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                                   "{% if enable_thinking is defined and not enable_thinking %}<think></think>"
                                   "{% endif %}")
    params = SamplingParams(max_tokens=1)
    thinking = llm.chat(MESSAGES, params, use_tqdm=False)[0].prompt
    quiet = llm.chat(MESSAGES, params, use_tqdm=False, chat_template_kwargs={"enable_thinking": False})[0].prompt
    assert quiet == thinking + "<think></think>"


def test_deepseek_v3_thinks_only_when_the_request_turns_thinking_on(tiny_model_path, tmp_path_factory):
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("v3-log"),
                           [*SERVER_ARGS, "--reasoning-parser", "deepseek_v3", "--structured-outputs-in-reasoning"])
    try:
        with openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=60.0) as v3:
            thinking = forced(v3, ANSWER, extra_body={"chat_template_kwargs": {"thinking": True}}).choices[0].message
            assert (thinking.reasoning, thinking.content) == ("compare the tenths", "9.8")
            plain = forced(v3, ANSWER).choices[0].message
            assert getattr(plain, "reasoning", None) is None and plain.content == ANSWER
    finally:
        process.stop()


def test_llm_chat_takes_tools_a_history_with_calls_and_an_open_final_message(tiny_model_path):
    """vLLM's LLM.chat(tools=..., continue_final_message=...): the tools and an assistant turn's tool_calls reach the
    template as they are, and the last message can be left open."""
    from engine import LLM, SamplingParams

    llm = LLM(model=str(tiny_model_path), max_model_len=256)
    llm.tokenizer.chat_template = (
        "{% if tools %}[{% for t in tools %}{{ t['function']['name'] }}{% endfor %}]{% endif %}"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] or '' }}"
        "{% for c in m.get('tool_calls') or [] %}({{ c['function']['name'] }}){% endfor %}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
    params = SamplingParams(max_tokens=1)
    history = [{"role": "user", "content": "time?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "noon"}, {"role": "assistant", "content": "It is"}]
    tools = [{"type": "function", "function": {"name": "get_time"}}]
    prompt = llm.chat(history, params, use_tqdm=False, tools=tools, add_generation_prompt=False,
                      continue_final_message=True)[0].prompt
    # (transformers renders templates with trim_blocks: the newline after each endfor goes.)
    assert prompt == "[get_time]<user>time?<assistant>(get_time)<tool>noon<assistant>It is"
