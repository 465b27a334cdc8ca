"""Call sections of DeepSeek-V3 / R1 (vLLM's ``deepseek_v3``), DeepSeek-V3.1 (``deepseek_v31``) and Kimi K2
(``kimi_k2``): one section of calls after the content, each call between its own markers.

    DeepSeek-V3, R1:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
                      ```json
                      {"city": "Oslo"}
                      ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    DeepSeek-V3.1:    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo"}<｜tool▁call▁end｜>
                      <｜tool▁calls▁end｜>
    Kimi K2:          <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
                      {"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>

A section is the block (block_calls.py): it is read whole once it closes, and is a section of calls only when every
call in it reads (a JSON object of arguments) and nothing but whitespace lies between them; otherwise it stays
content. Kimi K2 names each call ``functions.NAME:INDEX``: that is the call's id, as vLLM returns it (Kimi's template
writes the ids of earlier calls back), and its markers are special tokens, which the routes keep in the text for it.
"""

from __future__ import annotations

import re

from engine.serve.tool_parsers.base import ParsedToolCall
from engine.serve.tool_parsers.block_calls import BlockToolParser, json_object_text


class _SectionParser(BlockToolParser):
    call_pattern: re.Pattern

    def read_block(self, inside: str) -> list[ParsedToolCall] | None:
        calls, position = [], 0
        for match in self.call_pattern.finditer(inside):
            if inside[position:match.start()].strip():
                return None
            call = self.read_call(match)
            if call is None:
                return None
            calls.append(call)
            position = match.end()
        return calls if calls and not inside[position:].strip() else None

    def read_call(self, match: re.Match) -> ParsedToolCall | None:
        arguments = json_object_text(match.group("arguments"))
        return None if arguments is None else ParsedToolCall(match.group("name").strip(), arguments)


_DEEPSEEK_CALL = re.escape("<｜tool▁call▁begin｜>") + "{}" + re.escape("<｜tool▁call▁end｜>")


class DeepSeekV3ToolParser(_SectionParser):
    open_tag, close_tag = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    call_pattern = re.compile(_DEEPSEEK_CALL.format(
        r"\s*function\s*" + re.escape("<｜tool▁sep｜>") + r"(?P<name>[^\n]+)\n```(?:json)?\n(?P<arguments>.*?)\n```\s*"),
        re.DOTALL)


class DeepSeekV31ToolParser(_SectionParser):
    open_tag, close_tag = DeepSeekV3ToolParser.open_tag, DeepSeekV3ToolParser.close_tag
    call_pattern = re.compile(_DEEPSEEK_CALL.format(
        r"(?P<name>[^<]+?)" + re.escape("<｜tool▁sep｜>") + r"(?P<arguments>.*?)"), re.DOTALL)


class KimiK2ToolParser(_SectionParser):
    open_tag, close_tag = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    keeps_special_tokens = True
    call_pattern = re.compile(re.escape("<|tool_call_begin|>") + r"\s*(?P<id>[\w.\-]+:\d+)\s*"
                              + re.escape("<|tool_call_argument_begin|>") + r"(?P<arguments>.*?)"
                              + re.escape("<|tool_call_end|>"), re.DOTALL)

    def read_call(self, match: re.Match) -> ParsedToolCall | None:
        arguments = json_object_text(match.group("arguments"))
        call_id = match.group("id")
        name = call_id.rsplit(":", 1)[0].removeprefix("functions.")
        return None if arguments is None else ParsedToolCall(name, arguments, id=call_id)
