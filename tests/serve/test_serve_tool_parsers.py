"""The tool-call parsers on crafted texts (hermes, llama3_json, mistral, pythonic, qwen3_coder, glm45, deepseek_v3,
deepseek_v31, kimi_k2): calls, the content around them, malformed ones,
and each streaming parser fed the same texts split at every position (it must agree with the whole-text parse)."""

import json

import pytest

from engine.serve.tool_parsers import ParsedToolCall, get_parser, parser_names, register
from engine.serve.tool_parsers.hermes import HermesToolParser

WEATHER = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'

TEXTS = {
    "one call": (WEATHER, "", [("get_weather", {"city": "Paris", "days": 2})]),
    "two calls": (WEATHER + "\n" + TIME, "\n", [("get_weather", {"city": "Paris", "days": 2}),
                                               ("get_time", {})]),
    "text around": ("Let me check. " + WEATHER + " Done.", "Let me check.  Done.",
                    [("get_weather", {"city": "Paris", "days": 2})]),
    "no arguments key": ('<tool_call>{"name": "ping"}</tool_call>', "", [("ping", {})]),
    "malformed json": ('a <tool_call>{"name": "f", "arguments": {</tool_call> b',
                       'a <tool_call>{"name": "f", "arguments": {</tool_call> b', []),
    "no name": ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    "malformed then good": ('<tool_call>nope</tool_call>' + WEATHER, '<tool_call>nope</tool_call>',
                            [("get_weather", {"city": "Paris", "days": 2})]),
    "never closed": ('x <tool_call>{"name": "f", "arguments": {}}', 'x <tool_call>{"name": "f", "arguments": {}}',
                     []),
    "a partial tag that is not one": ("1 < 2 and <tool_cal is text <", "1 < 2 and <tool_cal is text <", []),
    "plain text": ("just an answer", "just an answer", []),
    "unicode": ('é <tool_call>{"name": "say", "arguments": {"word": "naïve"}}</tool_call>', "é ",
                [("say", {"word": "naïve"})]),
}


def calls_of(calls: list[ParsedToolCall]) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_extract(name):
    text, content, calls = TEXTS[name]
    extracted = HermesToolParser().extract(text)
    assert extracted.content == content
    assert calls_of(extracted.tool_calls) == calls


def stream(text: str, cuts: list[int]) -> tuple[str, list[ParsedToolCall]]:
    parser = HermesToolParser().streaming()
    content, calls = [], []
    for start, end in zip([0, *cuts], [*cuts, len(text)]):
        piece, new_calls = parser.feed(text[start:end])
        content.append(piece)
        calls.extend(new_calls)
    piece, new_calls = parser.finish()
    return "".join([*content, piece]), calls + new_calls


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_streaming_split_anywhere_agrees_with_extract(name):
    text = TEXTS[name][0]
    expected = HermesToolParser().extract(text)
    for cut in range(len(text) + 1):  # one cut at every position, and every character its own delta
        assert stream(text, [cut]) == (expected.content, expected.tool_calls), cut
    assert stream(text, list(range(1, len(text)))) == (expected.content, expected.tool_calls)


def test_streaming_holds_back_only_what_could_open_a_call():
    parser = HermesToolParser().streaming()
    assert parser.feed("Hello <tool") == ("Hello ", [])
    assert parser.feed("box>") == ("<toolbox>", [])  # not a tag after all: released
    assert parser.feed('<tool_call>{"name": "f", "arguments": {"a": 1}}') == ("", [])
    assert parser.feed("</tool_call>") == ("", [ParsedToolCall("f", '{"a": 1}')])


def test_registry_names_the_known_parsers():
    assert "hermes" in parser_names()
    assert isinstance(get_parser("hermes"), HermesToolParser)
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'; known: deepseek_v3, deepseek_v31, glm45, hermes, kimi_k2, llama3_json, mistral, openai, pythonic, "
                                         "qwen3_coder"):
        get_parser("nope")
    with pytest.raises(ValueError, match="already registered"):
        register("hermes", HermesToolParser)


LLAMA3 = {
    "one call": ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "",
                 [("get_weather", {"city": "Paris", "days": 2})]),
    "python tag, two calls, arguments key": (
        '<|python_tag|>{"name": "get_time", "arguments": {}}; {"name": "ping", "parameters": {"n": [1]}}', "",
        [("get_time", {}), ("ping", {"n": [1]})]),
    "leading whitespace, no parameters": ('\n {"name": "ping"}', "", [("ping", {})]),
    "prose": ("The weather is fine.", "The weather is fine.", []),
    "prose quoting an object": ('Call {"name": "f"} yourself', 'Call {"name": "f"} yourself', []),
    "cut short": ('{"name": "f", "parameters": {"a"', '{"name": "f", "parameters": {"a"', []),
    "not a call": ('{"answer": 42}', '{"answer": 42}', []),
    "trailing prose": ('{"name": "f", "parameters": {}} and more', '{"name": "f", "parameters": {}} and more', []),
    "empty": ("", "", []),
}


MISTRAL = {
    "a json array after content": ('Sure. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "ping"}]',
                                   "Sure. ", [("add", {"a": 1}), ("ping", {})]),
    "v11 calls": ('[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]mul[ARGS]{"b": [2]}', "",
                  [("add", {"a": 1}), ("mul", {"b": [2]})]),
    "no marker": ("[TOOL but not a call", "[TOOL but not a call", []),
    "cut arguments": ('x[TOOL_CALLS]add[ARGS]{"a": ', 'x[TOOL_CALLS]add[ARGS]{"a": ', []),
    "a name without arguments": ("[TOOL_CALLS]add", "[TOOL_CALLS]add", []),
    "text after the array": ('[TOOL_CALLS] [{"name": "f"}] ok', '[TOOL_CALLS] [{"name": "f"}] ok', []),
}
PYTHONIC = {
    "two calls": ('[get_weather(city="Paris", days=2), get_time()]', "",
                  [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]),
    "literals and a dotted name": ("\n[api.search(q='naïve', filters={'a': [1, None]}, exact=True)]", "",
                                   [("api.search", {"q": "naïve", "filters": {"a": [1, None]}, "exact": True})]),
    "prose": ("Use get_time() for that.", "Use get_time() for that.", []),
    "a list that is not calls": ("[1, 2]", "[1, 2]", []),
    "a positional argument": ('[f("x")]', '[f("x")]', []),
    "not a literal": ("[f(a=b)]", "[f(a=b)]", []),
    "cut short": ('[get_weather(city="Par', '[get_weather(city="Par', []),
}
V3_CALL = ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
           "<｜tool▁call▁end｜>")
DEEPSEEK_V3 = {
    "two calls after content": ("Checking.<｜tool▁calls▁begin｜>" + V3_CALL + "\n" + V3_CALL.replace("Oslo", "Rome")
                                + "<｜tool▁calls▁end｜>", "Checking.",
                                [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})]),
    "arguments that are not json": ("<｜tool▁calls▁begin｜>" + V3_CALL.replace('{"city": "Oslo"}', "{city") +
                                    "<｜tool▁calls▁end｜>", "<｜tool▁calls▁begin｜>" +
                                    V3_CALL.replace('{"city": "Oslo"}', "{city") + "<｜tool▁calls▁end｜>", []),
    "never closed": ("<｜tool▁calls▁begin｜>" + V3_CALL, "<｜tool▁calls▁begin｜>" + V3_CALL, []),
}
DEEPSEEK_V31 = {
    "a call": ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>'
               '<｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "",
               [("get_time", {}), ("add", {"a": 1})]),
    "text between calls": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>x"
                           "<｜tool▁calls▁end｜>", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
                           "<｜tool▁call▁end｜>x<｜tool▁calls▁end｜>", []),
    "plain": ("<｜ but no call", "<｜ but no call", []),
}
KIMI_K2 = {
    "two calls": ("Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                  '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
                  "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>", "Sure.",
                  [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    "an empty section": ("<|tool_calls_section_begin|><|tool_calls_section_end|>",
                         "<|tool_calls_section_begin|><|tool_calls_section_end|>", []),
}
GLM45 = {
    "a call typed by json": ("Let me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo"
                             "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
                             "Let me look.\n", [("get_weather", {"city": "Oslo", "days": 2})]),
    "no arguments": ("<tool_call>get_time\n</tool_call>", "", [("get_time", {})]),
    "a key without its value": ("<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>",
                                "<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>", []),
}
PARSED = {"llama3_json": LLAMA3, "mistral": MISTRAL, "pythonic": PYTHONIC, "deepseek_v3": DEEPSEEK_V3,
          "deepseek_v31": DEEPSEEK_V31, "kimi_k2": KIMI_K2, "glm45": GLM45}


@pytest.mark.parametrize("parser_name, name", [(parser, name) for parser, texts in sorted(PARSED.items())
                                               for name in sorted(texts)])
def test_json_call_parsers_extract_and_streaming_agree(parser_name, name):
    text, content, calls = PARSED[parser_name][name]
    parser = get_parser(parser_name)
    extracted = parser.extract(text)
    assert (extracted.content, calls_of(extracted.tool_calls)) == (content, calls)
    for cuts in [[cut] for cut in range(len(text) + 1)] + [list(range(1, len(text)))]:
        streamed = parser.streaming()
        pieces, found = [], []
        for start, end in zip([0, *cuts], [*cuts, len(text)]):
            piece, new_calls = streamed.feed(text[start:end])
            pieces.append(piece)
            found.extend(new_calls)
        piece, new_calls = streamed.finish()
        assert ("".join([*pieces, piece]), found + new_calls) == (extracted.content, extracted.tool_calls), cuts


def test_llama3_json_streams_prose_at_once():
    streamed = get_parser("llama3_json").streaming()
    assert streamed.feed("  ") == ("", [])  # too little to tell
    assert streamed.feed("Sure") == ("  Sure", [])
    calls = get_parser("llama3_json").streaming()
    assert calls.feed('{"name": "f", ') == ("", []) and calls.feed('"parameters": {}}') == ("", [])
    assert calls.finish() == ("", [ParsedToolCall("f", "{}")])


def test_mistral_keeps_special_tokens_and_streams_content_before_the_marker():
    parser = get_parser("mistral")
    assert parser.keeps_special_tokens and not get_parser("hermes").keeps_special_tokens
    streamed = parser.streaming()
    assert streamed.feed("Sure. [TOOL") == ("Sure. ", [])
    assert streamed.feed('_CALLS]add[ARGS]{"a": 1}') == ("", [])
    assert streamed.finish() == ("", [ParsedToolCall("add", '{"a": 1}')])


QWEN3_CODER_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "<parameter=days>\n2\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n</function>\n</tool_call>")
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "zip": {"type": "string"}}}}}


def qwen3_coder():
    parser = get_parser("qwen3_coder")
    parser.use_tools([WEATHER_TOOL])
    return parser


@pytest.mark.parametrize("text, content, calls", [
    ("Checking.\n" + QWEN3_CODER_CALL, "Checking.\n", [("get_weather", {"city": "Paris", "days": 2, "zip": "75001"})]),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call>', '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
     []),  # Hermes' JSON is not this format: content
    ("<tool_call>\n<function=ping>\n</function>\n</tool_call>", "", [("ping", {})]),
    ("<tool_call>\n<function=f>\nstray<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=f>\nstray<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>", []),
])
def test_qwen3_coder_reads_xml_calls_typed_by_the_schema(text, content, calls):
    extracted = qwen3_coder().extract(text)
    assert (extracted.content, calls_of(extracted.tool_calls)) == (content, calls)
    for cut in range(len(text) + 1):
        streamed = qwen3_coder().streaming()
        first, first_calls = streamed.feed(text[:cut])
        second, second_calls = streamed.feed(text[cut:])
        rest, rest_calls = streamed.finish()
        assert (first + second + rest, first_calls + second_calls + rest_calls) == (
            extracted.content, extracted.tool_calls), cut


def test_qwen3_coder_without_a_schema_reads_json_values_as_json():
    extracted = get_parser("qwen3_coder").extract(QWEN3_CODER_CALL)
    assert calls_of(extracted.tool_calls) == [("get_weather", {"city": "Paris", "days": 2, "zip": 75001})]


def test_kimi_k2_calls_keep_their_ids_and_glm45_types_values_by_the_schema():
    parser = get_parser("kimi_k2")
    assert parser.keeps_special_tokens
    extracted = parser.extract(KIMI_K2["two calls"][0])
    assert [call.id for call in extracted.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]
    glm = get_parser("glm45")
    glm.use_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "string"}}}}}])
    assert calls_of(glm.extract(GLM45["a call typed by json"][0]).tool_calls) == [
        ("get_weather", {"city": "Oslo", "days": "2"})]
