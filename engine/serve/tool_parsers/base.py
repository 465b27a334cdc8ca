"""What every tool-call parser gives: content and calls from a whole text, and the same from deltas."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI's function.arguments
    # The id the model gave the call (Kimi K2's "functions.NAME:INDEX"), returned as the call's id; None: the server
    # makes one.
    id: str | None = None


@dataclass
class ExtractedToolCalls:
    content: str  # the text outside the calls ("" when there is none)
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


class StreamingToolParser:
    """Fed a choice's text one delta at a time: each ``feed`` returns the content that is certainly not part
    of a call, and the calls completed by that delta; ``finish`` returns what was held back when the text ends.
    The content of all the deltas, joined, and the calls, in order, equal ``extract`` on the whole text."""

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        raise NotImplementedError

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        raise NotImplementedError


class WholeAnswerStreamingParser(StreamingToolParser):
    """For formats whose calls are the whole answer (llama3_json, pythonic): prose streams as content at once; an
    answer that opens like a call (``opens``: True, False, or None while too little is known) is held until
    ``finish``, then parsed whole (``extract``)."""

    def __init__(self, opens, extract) -> None:
        self._opens, self._extract = opens, extract
        self._text = ""
        self._calls: bool | None = None

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        self._text += delta
        if self._calls is None:
            self._calls = self._opens(self._text)
        if self._calls is False:
            content, self._text = self._text, ""
            return content, []
        return "", []

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        text, self._text = self._text, ""
        extracted = self._extract(text) if self._calls is not False else ExtractedToolCalls(text)
        return extracted.content, extracted.tool_calls


class ToolParser:
    # Whether the parser reads special tokens the answer's text drops by default (Mistral's [TOOL_CALLS]): the chat
    # route then keeps them (skip_special_tokens off) for requests it parses.
    keeps_special_tokens = False

    def use_tools(self, tools: list) -> None:
        """The request's tools (OpenAI's function definitions), for a format whose values take their types from
        the schemas (Qwen3-Coder's); most formats carry JSON and need none. A parser serves one request."""

    def extract(self, text: str) -> ExtractedToolCalls:
        raise NotImplementedError

    def streaming(self) -> StreamingToolParser:
        raise NotImplementedError
