"""gpt-oss's harmony answers (engine/reasoning_parsers/harmony.py): the ``openai_gptoss`` reasoning parser and the
``openai`` tool-call parser on whole answers, the two chained as the chat route chains them, and streaming over any
cut of deltas agreeing with the whole (a hypothesis property over answers built from the markers and text)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.reasoning_parsers import get_parser
from engine.serve.tool_parsers import ParsedToolCall
from engine.serve.tool_parsers import get_parser as get_tool_parser

THOUGHT = "<|channel|>analysis<|message|>Need the weather.<|end|>"
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Oslo"}<|call|>')
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 4 degrees.<|return|>"


@pytest.mark.parametrize("text, reasoning, content", [
    (THOUGHT + FINAL, "Need the weather.", "It is 4 degrees."),
    # The stop tokens are not in the text: a body ends at the next header or the end.
    ("<|channel|>analysis<|message|>hm<|start|>assistant<|channel|>final<|message|>Yes", "hm", "Yes"),
    ("<|channel|>analysis<|message|>cut sho", "cut sho", None),
    ("<|channel|>commentary<|message|>Let me check.<|end|>" + FINAL, None, "Let me check.It is 4 degrees."),
    # Built-in tools (not run here) are part of the thought.
    ("<|channel|>analysis to=browser.search <|constrain|>json<|message|>{\"q\": 1}<|call|>", '{"q": 1}', None),
    ("plain text without markers", None, "plain text without markers"),
    ("<|channel|>analy", None, None),  # a cut header shows nothing
    ("", None, None),
])
def test_the_reasoning_parser_splits_channels(text, reasoning, content):
    assert get_parser("openai_gptoss").extract(text) == (reasoning, content)


def test_calls_pass_through_the_reasoning_parser_to_the_tool_parser():
    reasoning, content = get_parser("openai_gptoss").extract(THOUGHT + CALL)
    assert reasoning == "Need the weather."
    extracted = get_tool_parser("openai").extract(content)
    assert extracted.content == "" and extracted.tool_calls == [ParsedToolCall("get_weather", '{"city": "Oslo"}')]
    # A raw answer too (no reasoning parser): the thought is not content.
    raw = get_tool_parser("openai").extract(THOUGHT + CALL + CALL.replace("Oslo", "Paris") + FINAL)
    assert raw.content == "It is 4 degrees."
    assert [call.arguments for call in raw.tool_calls] == ['{"city": "Oslo"}', '{"city": "Paris"}']
    # The recipient may come before the channel; a call without arguments has {}.
    before = get_tool_parser("openai").extract("<|start|>assistant to=functions.get_time<|channel|>commentary "
                                               "json<|message|><|call|>")
    assert before.tool_calls == [ParsedToolCall("get_time", "{}")]


def test_both_read_special_tokens():
    assert get_parser("openai_gptoss").keeps_special_tokens and get_tool_parser("openai").keeps_special_tokens
    assert not get_parser("qwen3").keeps_special_tokens
    # Structured outputs steer what follows the final channel's header.
    assert get_parser("openai_gptoss").end_tag == "<|channel|>final<|message|>"


PIECES = st.sampled_from(["<|channel|>", "analysis", "final", "commentary", " to=functions.f ", " to=python ",
                          "<|message|>", "<|end|>", "<|start|>", "assistant", "<|call|>", "<|return|>",
                          "<|constrain|>", "json", "<|", "<", "|>", "a", "{}", " "])


def streamed(stream, text: str, bounds: list[int]) -> tuple[str, object]:
    first, second = "", None
    for start, end in zip(bounds, bounds[1:]):
        more_first, more_second = stream.feed(text[start:end])
        first, second = first + more_first, more_second if second is None else second + more_second
    rest_first, rest_second = stream.finish()
    return first + rest_first, rest_second if second is None else second + rest_second


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(PIECES, max_size=16), cuts=st.lists(st.integers(0, 120), max_size=8))
def test_streamed_deltas_join_to_the_whole_answers_split(pieces, cuts):
    text = "".join(pieces)
    bounds = sorted({min(cut, len(text)) for cut in cuts} | {0, len(text)})
    parser = get_parser("openai_gptoss")
    reasoning, content = streamed(parser.streaming(), text, bounds)
    assert (reasoning or None, content or None) == parser.extract(text)
    tool_parser = get_tool_parser("openai")
    extracted = tool_parser.extract(text)
    assert streamed(tool_parser.streaming(), text, bounds) == (extracted.content, extracted.tool_calls)


def test_the_routes_keep_special_tokens_for_a_parser_that_reads_them():
    from engine.core import SamplingParams
    from engine.serve.chat import keeping_parsed_special_tokens
    from engine.serve.tool_calls import ToolMode

    params = SamplingParams(max_tokens=4)
    assert not keeping_parsed_special_tokens(params, ToolMode("none"), "openai_gptoss").skip_special_tokens
    assert keeping_parsed_special_tokens(params, ToolMode("none"), "qwen3").skip_special_tokens
    auto = ToolMode("auto", parser=get_tool_parser("openai"))
    assert not keeping_parsed_special_tokens(params, auto, None).skip_special_tokens
    assert keeping_parsed_special_tokens(params, ToolMode("auto", parser=get_tool_parser("hermes")), None
                                         ).skip_special_tokens
