"""gpt-oss's tool calls (vLLM's ``--tool-call-parser openai``): harmony messages addressed ``to=functions.NAME``, their
body the call's JSON arguments (engine/reasoning_parsers/harmony.py reads the format).

It reads an answer as the ``openai_gptoss`` reasoning parser passes it on (content with the calls in harmony form) or a
raw answer: calls come out of messages to ``functions.*``; content is the ``final`` channel, preambles and text outside
messages; reasoning (the ``analysis`` channel, calls to built-in tools) is not content, so without the reasoning parser
it is dropped from the message. Streamed, each call goes out in one delta once its message has ended.
"""

from __future__ import annotations

from engine.reasoning_parsers.harmony import HarmonyScanner, Piece
from engine.serve.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, StreamingToolParser, ToolParser


class _StreamingOpenAIParser(StreamingToolParser):
    def __init__(self) -> None:
        self._scanner = HarmonyScanner()
        self._name: str | None = None
        self._arguments: list[str] = []

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        return self._read(self._scanner.feed(delta))

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        return self._read(self._scanner.finish())

    def _read(self, pieces: list[Piece]) -> tuple[str, list[ParsedToolCall]]:
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        for piece in pieces:
            if piece.kind == "content":
                content.append(piece.text)
            elif piece.kind == "call_start":
                self._name, self._arguments = piece.text, []
            elif piece.kind == "arguments":
                self._arguments.append(piece.text)
            elif piece.kind == "call_end":
                calls.append(ParsedToolCall(self._name or "", "".join(self._arguments).strip() or "{}"))
                self._name = None
        return "".join(content), calls


class OpenAIToolParser(ToolParser):
    keeps_special_tokens = True

    def extract(self, text: str) -> ExtractedToolCalls:
        stream = self.streaming()
        content, calls = stream.feed(text)
        rest, more = stream.finish()
        return ExtractedToolCalls(content + rest, calls + more)

    def streaming(self) -> StreamingToolParser:
        return _StreamingOpenAIParser()
