"""The reasoning parsers (engine/reasoning_parsers/): what each splits off a whole answer, by name, and that
streaming the answer in any cut of deltas gives the same reasoning and content (a hypothesis property, answers
built from the tags, their fragments and text)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.reasoning_parsers import get_parser, parser_names


@pytest.mark.parametrize("text, deepseek_r1, qwen3", [
    ("weighing</think>Paris", ("weighing", "Paris"), (None, "weighing</think>Paris")),
    ("<think>weighing</think>Paris", ("weighing", "Paris"), ("weighing", "Paris")),
    ("\n<think>cut short", ("cut short", None), ("cut short", None)),
    ("Paris", ("Paris", None), (None, "Paris")),  # R1 always thinks; Qwen3 without <think> does not
    ("<think></think>Paris", (None, "Paris"), (None, "Paris")),
    ("<thi", ("<thi", None), (None, "<thi")),
    ("", (None, None), (None, None)),
])
def test_each_parser_splits_a_whole_answer(text, deepseek_r1, qwen3):
    assert get_parser("deepseek_r1").extract(text) == deepseek_r1
    assert get_parser("qwen3").extract(text) == qwen3
    assert get_parser("glm45").extract(text) == qwen3
    # DeepSeek-V3.1 thinks only when the request turns thinking on; then as R1.
    v3 = get_parser("deepseek_v3")
    assert v3.for_request({"thinking": True}).extract(text) == deepseek_r1
    assert v3.for_request(None) is None and v3.for_request({"thinking": False}) is None
    assert get_parser("deepseek_r1").for_request(None) is get_parser("deepseek_r1")


def test_an_unknown_parser_is_refused_with_the_known_names():
    assert parser_names() == ["deepseek_r1", "deepseek_v3", "ernie45", "glm45", "mistral", "openai_gptoss", "qwen3",
                              "seed_oss"]
    with pytest.raises(ValueError, match=r"unknown reasoning parser 'r2'; known: deepseek_r1, deepseek_v3, ernie45"):
        get_parser("r2")


PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", ">", "a", "bc", " ", "\n"])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(PIECES, max_size=12), cuts=st.lists(st.integers(0, 60), max_size=6),
       name=st.sampled_from(["deepseek_r1", "qwen3", "glm45"]))
def test_streamed_deltas_join_to_the_whole_answers_split(pieces, cuts, name):
    text = "".join(pieces)
    bounds = sorted({min(cut, len(text)) for cut in cuts} | {0, len(text)})
    parser = get_parser(name)
    stream = parser.streaming()
    reasoning, content = "", ""
    for start, end in zip(bounds, bounds[1:]):
        more_reasoning, more_content = stream.feed(text[start:end])
        reasoning, content = reasoning + more_reasoning, content + more_content
    rest_reasoning, rest_content = stream.finish()
    assert ((reasoning + rest_reasoning) or None, (content + rest_content) or None) == parser.extract(text)


@pytest.mark.parametrize("name, start, end", [("mistral", "[THINK]", "[/THINK]"),
                                              ("seed_oss", "<seed:think>", "</seed:think>"),
                                              ("ernie45", "<think>", "</think>")])
def test_parsers_with_their_own_tags(name, start, end):
    parser = get_parser(name)
    assert parser.extract(f"{start}weighing{end}Paris") == ("weighing", "Paris")
    assert parser.extract("Paris") == (None, "Paris")  # no thought opened: all content
    assert parser.extract(f"{start}cut") == ("cut", None)
    assert (parser.start_tag, parser.end_tag) == (start, end)
    assert parser.keeps_special_tokens == (name == "mistral")  # Magistral's tags are special tokens
    text = f"  {start}a{end[:3]}b{end}c{start[:2]}d"
    for cut in range(len(text) + 1):
        stream = parser.streaming()
        first = stream.feed(text[:cut])
        second = stream.feed(text[cut:])
        rest = stream.finish()
        joined = (first[0] + second[0] + rest[0]) or None, (first[1] + second[1] + rest[1]) or None
        assert joined == parser.extract(text), cut
