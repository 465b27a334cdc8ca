"""The Responses API's parts without a server: a request's input items as the chat messages it is served as
(responses_protocol.py), the output items and events built from chat deltas (responses_output.py), and the
bounded store (responses_store.py)."""

import pytest
from pydantic import ValidationError

from engine.serve.errors import OpenAIError
from engine.serve.responses_output import ResponseOutput
from engine.serve.responses_protocol import ResponsesRequest, to_chat_request
from engine.serve.responses_store import ResponseStore


def chat_messages(body: dict, history: list | None = None) -> list[dict]:
    form = to_chat_request(ResponsesRequest.model_validate(body), history or [])
    return [message.model_dump(exclude_none=True) for message in form.request.messages]


def test_a_text_input_is_one_user_message_after_the_instructions():
    assert chat_messages({"input": "hi", "instructions": "be brief"}) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_items_become_the_chat_history_they_stand_for():
    items = [{"role": "user", "content": [{"type": "input_text", "text": "weather?"},
                                          {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "4 degrees"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]}]
    assert chat_messages({"input": items}) == [
        {"role": "user", "content": [{"type": "text", "text": "weather?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
        # The thought goes with the turn it preceded; the text and both calls are one assistant turn.
        {"role": "assistant", "reasoning_content": "t", "content": [{"type": "text", "text": "Let me look."}],
         "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4 degrees"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"}]


def test_a_previous_responses_items_come_first():
    history = [{"type": "message", "role": "user", "content": "one"},
               {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "two", "annotations": [], "logprobs": []}]}]
    assert chat_messages({"input": "three"}, history) == [
        {"role": "user", "content": "one"}, {"role": "assistant", "content": [{"type": "text", "text": "two"}]},
        {"role": "user", "content": "three"}]


def test_tools_choice_and_format_take_chats_spelling():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
    body = ResponsesRequest.model_validate({
        "input": "x", "tools": [tool], "tool_choice": {"type": "function", "name": "f"},
        "max_output_tokens": 7, "top_logprobs": 2, "reasoning": {"effort": "low"}})
    chat = to_chat_request(body, []).request
    assert chat.tools[0].function.name == "f" and chat.tools[0].function.strict is True
    assert chat.tool_choice.function.name == "f" and chat.max_completion_tokens == 7
    assert chat.logprobs and chat.top_logprobs == 2 and chat.chat_template_kwargs == {"reasoning_effort": "low"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat_request(ResponsesRequest.model_validate(
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}}), []).request
    assert chat.response_format == {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "n": 2}, "n"),
    ({"input": "x", "background": True, "stream": True}, "background"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "max_tool_calls": 0}, "max_tool_calls"),
])
def test_what_this_server_cannot_do_is_refused_by_name(body, param):
    with pytest.raises(ValidationError) as error:
        ResponsesRequest.model_validate(body)
    assert error.value.errors()[0]["loc"][0] == param


def test_a_named_choice_of_no_such_tool_is_a_400_in_the_responses_names():
    body = ResponsesRequest.model_validate({"input": "x", "tools": [{"type": "function", "name": "f"}],
                                            "tool_choice": {"type": "function", "name": "g"}})
    with pytest.raises(OpenAIError) as error:
        to_chat_request(body, [])
    assert error.value.param == "tool_choice" and "'g'" in error.value.message


def chat_delta(content=None, reasoning=None, tool_calls=None, finish=None, token_ids=(1,)):
    delta = {key: value for key, value in (("content", content), ("reasoning", reasoning),
                                           ("tool_calls", tool_calls)) if value is not None}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": list(token_ids)}


def test_output_items_and_their_events():
    output = ResponseOutput()
    events = []
    for delta in [chat_delta(reasoning="think"), chat_delta(reasoning="ing"), chat_delta(content="\n"),
                  chat_delta(content="Sure."),
                  chat_delta(tool_calls=[{"index": 0, "id": "c1", "type": "function",
                                          "function": {"name": "f", "arguments": '{"a": 1}'}}]),
                  chat_delta(content="\n\n"),  # blank between calls: no message of its own
                  chat_delta(tool_calls=[{"index": 1, "id": "c2", "type": "function",
                                          "function": {"name": "g", "arguments": ""}}]),
                  chat_delta(tool_calls=[{"index": 1, "function": {"arguments": "{}"}}], finish="stop")]:
        events += output.feed(delta)
    assert [(item["type"], item["status"]) for item in output.items] == [
        ("reasoning", "completed"), ("message", "completed"), ("function_call", "completed"),
        ("function_call", "completed")]
    assert output.items[0]["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    assert output.output_text() == "\nSure." and output.token_ids == [1] * 8
    assert [(item["name"], item["arguments"]) for item in output.items[2:]] == [("f", '{"a": 1}'), ("g", "{}")]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    kinds = [event["type"] for event in events]
    assert kinds[:4] == ["response.output_item.added", "response.content_part.added",
                         "response.reasoning_text.delta", "response.reasoning_text.delta"]
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
    assert done == output.items  # each item as it was closed: what the final response carries
    assert output.status == "completed"


def test_an_answer_cut_short_leaves_its_last_item_incomplete():
    output = ResponseOutput()
    output.feed(chat_delta(content="Hel"))
    events = output.feed(chat_delta(content="lo", finish="length"))
    assert output.status == "incomplete" and output.items[0]["status"] == "incomplete"
    assert events[-1]["item"]["content"][0]["text"] == "Hello"


def test_the_store_forgets_the_oldest_past_its_capacity():
    store = ResponseStore(capacity=2)
    for name in ("a", "b", "c"):
        store.put({"id": name, "output": []}, [{"type": "message", "role": "user", "content": name}])
    assert len(store) == 2
    with pytest.raises(OpenAIError) as error:
        store.get("a", param="previous_response_id")
    assert error.value.status == 404 and error.value.param == "previous_response_id"
    assert store.get("b").input_items[0]["id"].startswith("msg_")
    store.delete("b")
    with pytest.raises(OpenAIError):
        store.get("b")


def test_a_past_thought_reaches_the_template_as_reasoning_content():
    """Templates of reasoning models read an assistant turn's thought (Qwen3's reasoning_content, gpt-oss's
    thinking): a chat message's reasoning_content (or reasoning) is given to them under both names."""
    from types import SimpleNamespace

    from engine.serve.protocol import ChatCompletionRequest
    from engine.serve.tool_prompt import template_messages

    body = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello", "reasoning": "greet back"}]})
    rendered = template_messages(body, SimpleNamespace(chat_template="{{ messages }}"))
    assert rendered[1]["reasoning_content"] == rendered[1]["thinking"] == "greet back"
    assert "reasoning_content" not in rendered[0]


def test_calls_past_max_tool_calls_are_dropped():
    output = ResponseOutput(max_tool_calls=2)
    for index in range(3):
        output.feed(chat_delta(tool_calls=[{"index": index, "id": f"c{index}", "type": "function",
                                            "function": {"name": f"f{index}", "arguments": "{"}}]))
        output.feed(chat_delta(tool_calls=[{"index": index, "function": {"arguments": "}"}}]))
    output.feed(chat_delta(finish="stop"))
    assert [(item["name"], item["arguments"]) for item in output.items] == [("f0", "{}"), ("f1", "{}")]
