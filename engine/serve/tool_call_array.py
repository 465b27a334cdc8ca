"""Reading ``tool_choice: "required"`` output as it is generated: ``[{"name": "f", "parameters": {...}}, ...]``.

The grammar guarantees the shape, so a character scanner (strings, escapes and nesting depth) is enough to
say, delta by delta, when a call's name is complete and which characters belong to its ``parameters`` value.
Those characters are sent as they come, as OpenAI streams ``function.arguments``: joined, they are the value's
JSON text as the model wrote it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class ArrayCall:
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class ToolCallArrayScanner:
    """``feed(text)`` returns the events the text completes, in order: ``("name", index, name)`` once a call's
    name is read, ``("arguments", index, fragment)`` for the characters of its parameters."""

    CALL_DEPTH = 2  # inside [ and then { : a call object's own keys and values

    def __init__(self) -> None:
        self.calls: list[ArrayCall] = []
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._expecting_key = False
        self._key: str | None = None  # the call key whose value is being read
        self._string: list[str] | None = None  # the key or name string being read
        self._string_is_key = False
        self._value_pending = False  # after a call key's colon, before its value
        self._capturing = False  # inside a parameters value

    def feed(self, text: str) -> list[tuple[str, int, str]]:
        events: list[tuple[str, int, str]] = []
        for character in text:
            self._step(character, events)
        return events

    def _step(self, character: str, events: list[tuple[str, int, str]]) -> None:
        at_call_level = not self._in_string and self._depth == self.CALL_DEPTH
        if self._capturing and at_call_level and character in ",}":
            self._capturing = False
        if self._value_pending and not character.isspace():
            self._value_pending = False
            self._capturing = self._key == "parameters"
        if self._capturing:
            self.calls[-1].arguments.append(character)
            events.append(("arguments", len(self.calls) - 1, character))
        if self._in_string:
            self._in_string_step(character, events)
            return
        if character == '"':
            self._in_string = True
            if at_call_level and (self._expecting_key or self._key == "name"):
                self._string, self._string_is_key = [], self._expecting_key
        elif character in "[{":
            self._depth += 1
            if self._depth == self.CALL_DEPTH and character == "{":
                self.calls.append(ArrayCall())
                self._expecting_key, self._key = True, None
        elif character in "]}":
            self._depth -= 1
        elif at_call_level and character == ":":
            self._expecting_key, self._value_pending = False, True
        elif at_call_level and character == ",":
            self._expecting_key, self._key = True, None

    def _in_string_step(self, character: str, events: list[tuple[str, int, str]]) -> None:
        if self._escape:
            self._escape = False
        elif character == "\\":
            self._escape = True
        elif character == '"':
            self._in_string = False
            if self._string is not None:
                value = json.loads('"' + "".join(self._string) + '"')
                if self._string_is_key:
                    self._key = value
                else:
                    self.calls[-1].name = value
                    events.append(("name", len(self.calls) - 1, value))
                self._string = None
            return
        if self._string is not None:
            self._string.append(character)
