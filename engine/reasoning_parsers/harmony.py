"""gpt-oss's harmony format, read from an answer's text: vLLM's ``--reasoning-parser openai_gptoss`` (and, through
``HarmonyScanner``, the ``openai`` tool-call parser, engine/serve/tool_parsers/openai.py).

gpt-oss writes its answer as messages (its template ends the prompt with ``<|start|>assistant``, so the first
message's role is implied)::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is 4 degrees.<|return|>

A header (role, ``<|channel|>`` name, a recipient ``to=...`` before or after the channel, ``<|constrain|>`` format)
ends at ``<|message|>``; the body ends at ``<|end|>``, ``<|call|>``, ``<|return|>`` (stop tokens, which the text may
not hold) or the next header. The markers are special tokens: a request parsed here keeps them in its text
(``keeps_special_tokens``: the chat route turns ``skip_special_tokens`` off, as vLLM reads these answers by token).

Where each body goes: the ``analysis`` channel is reasoning; a message to ``functions.NAME`` is a call of NAME with the
body as its arguments; a message to any other recipient (gpt-oss's built-in ``browser`` and ``python`` tools, which
this server does not run) is reasoning too; the ``final`` channel, ``commentary`` without a recipient (gpt-oss's
preambles) and text outside any message are content.

The reasoning parser gives the calls on to the tool-call parser inside the content, written back in the same form
(``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>``), so the ``openai`` tool parser
reads them as it reads a raw answer. Invariant (as for think_tags.py, tested over random cuts): what the streamed
deltas give, joined, equals what the whole text gives; a delta that ends inside a marker is held back until the next
delta or the end says what it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.reasoning_parsers.think_tags import split_whole

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")


@dataclass(frozen=True)
class Piece:
    """What a stretch of the answer is: ``reasoning`` or ``content`` text; a call's ``call_start`` (``text`` is the
    function's name), its ``arguments`` text, its ``call_end``."""
    kind: str
    text: str = ""


class HarmonyScanner:
    """The answer's pieces as its text arrives (``feed``), and those held back at its end (``finish``)."""

    def __init__(self) -> None:
        self._state = "plain"  # -> "header" -> "body" -> "plain" ...
        self._held = ""
        self._body_kind = "content"  # where the open message's body goes: reasoning, content or arguments

    def feed(self, delta: str) -> list[Piece]:
        self._held += delta
        pieces: list[Piece] = []
        while True:
            if self._state == "plain":
                index, marker = _first_marker(self._held, MARKERS)
                if marker is None:
                    self._emit_sure(pieces, "content")
                    return pieces
                _add(pieces, "content", self._held[:index])
                if marker in (START, CHANNEL):
                    self._held, self._state = self._held[index:], "header"
                else:  # a stray end or format marker outside a message: nothing to show
                    self._held = self._held[index + len(marker):]
            elif self._state == "header":
                index = self._held.find(MESSAGE)
                if index < 0:
                    return pieces  # the header is read whole
                header, self._held = self._held[:index], self._held[index + len(MESSAGE):]
                self._open_body(header, pieces)
                self._state = "body"
            else:
                index, marker = _first_marker(self._held, (END, CALL, RETURN, START, CHANNEL))
                if marker is None:
                    self._emit_sure(pieces, self._body_kind)
                    return pieces
                _add(pieces, self._body_kind, self._held[:index])
                self._close_body(pieces)
                if marker in (START, CHANNEL):  # the next message began without an end marker
                    self._held, self._state = self._held[index:], "header"
                else:
                    self._held, self._state = self._held[index + len(marker):], "plain"

    def finish(self) -> list[Piece]:
        """What was held back: the rest of a plain stretch or of a body (a cut header shows nothing)."""
        held, self._held = self._held, ""
        pieces: list[Piece] = []
        if self._state == "plain":
            _add(pieces, "content", held)
        elif self._state == "body":
            _add(pieces, self._body_kind, held)
            self._close_body(pieces)
        self._state = "plain"
        return pieces

    def _emit_sure(self, pieces: list[Piece], kind: str) -> None:
        keep = _marker_prefix_length(self._held)
        _add(pieces, kind, self._held[:len(self._held) - keep])
        self._held = self._held[len(self._held) - keep:]

    def _open_body(self, header: str, pieces: list[Piece]) -> None:
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL_NAME.search(header)
        if recipient is not None and recipient.group(1).startswith(FUNCTIONS):
            pieces.append(Piece("call_start", recipient.group(1)[len(FUNCTIONS):]))
            self._body_kind = "arguments"
        elif recipient is not None or (channel is not None and channel.group(1) == "analysis"):
            self._body_kind = "reasoning"
        else:
            self._body_kind = "content"

    def _close_body(self, pieces: list[Piece]) -> None:
        if self._body_kind == "arguments":
            pieces.append(Piece("call_end"))
        self._body_kind = "content"


def _add(pieces: list[Piece], kind: str, text: str) -> None:
    if text:
        pieces.append(Piece(kind, text))


def _first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    found = [(index, marker) for marker in markers if (index := text.find(marker)) >= 0]
    return min(found) if found else (-1, None)


def _marker_prefix_length(text: str) -> int:
    """The length of the longest end of ``text`` that begins a marker (what may still become one)."""
    for length in range(min(len(text), max(map(len, MARKERS)) - 1), 0, -1):
        if any(marker.startswith(text[-length:]) for marker in MARKERS):
            return length
    return 0


def call_markup(name: str) -> str:
    """The header of a call to ``name``, as the reasoning parser passes calls on in the content."""
    return f"{CHANNEL}commentary to={FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}"


class StreamingHarmonyReasoning:
    """Fed an answer a delta at a time: the (reasoning, content) each delta makes sure of; calls stay in the content
    in harmony form for the tool-call parser."""

    def __init__(self) -> None:
        self._scanner = HarmonyScanner()

    def feed(self, delta: str) -> tuple[str, str]:
        return _split(self._scanner.feed(delta))

    def finish(self) -> tuple[str, str]:
        return _split(self._scanner.finish())


def _split(pieces: list[Piece]) -> tuple[str, str]:
    reasoning, content = [], []
    for piece in pieces:
        if piece.kind == "reasoning":
            reasoning.append(piece.text)
        elif piece.kind == "call_start":
            content.append(call_markup(piece.text))
        elif piece.kind == "call_end":
            content.append(CALL)
        else:
            content.append(piece.text)
    return "".join(reasoning), "".join(content)


@dataclass(frozen=True)
class HarmonyReasoningParser:
    # The thought opens and the answer starts with these (what structured outputs wait for before steering).
    start_tag: str = CHANNEL + "analysis" + MESSAGE
    end_tag: str = CHANNEL + "final" + MESSAGE
    keeps_special_tokens: bool = True

    def for_request(self, chat_template_kwargs: dict | None) -> "HarmonyReasoningParser":
        return self

    def extract(self, text: str) -> tuple[str | None, str | None]:
        return split_whole(self.streaming(), text)

    def streaming(self) -> StreamingHarmonyReasoning:
        return StreamingHarmonyReasoning()
