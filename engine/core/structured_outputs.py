"""What a request asks its output to match (vLLM's ``StructuredOutputsParams``, with its field names).

Exactly one kind is set: ``json`` (a JSON schema, as a dict or a JSON string), ``regex``, ``choice``
(the output is one of these strings), ``grammar`` (EBNF, the GBNF dialect xgrammar reads) or
``json_object`` (any JSON object). ``disable_any_whitespace`` keeps JSON output compact (no optional
whitespace between tokens), which also stops a weak model from padding with spaces forever.

Checked here, in pure Python, at construction: the types, that exactly one kind is set, and that a JSON
string parses. Whether a schema, regex or grammar compiles is the grammar backend's question
(engine/runner/structured_output/), asked when a request is added, so that a bad one never reaches the
scheduler. The core itself only carries these parameters: it neither reads nor enforces them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The kinds in the order error messages list them.
KINDS = ("json", "regex", "choice", "grammar", "json_object")

# Values in error messages are cut to this many characters: a schema can be kilobytes long.
MAX_SHOWN_CHARS = 80


def shorten(value: object) -> str:
    """``repr(value)`` cut to MAX_SHOWN_CHARS, for messages that must name a possibly huge value."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def _field_error(name: str, value: object, requirement: str) -> ValueError:
    return ValueError(f"StructuredOutputsParams.{name} must be {requirement}, got {shorten(value)}")


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        if self.json is not None:
            self._check_json()
        if self.regex is not None and not (isinstance(self.regex, str) and self.regex):
            raise _field_error("regex", self.regex, "a non-empty string")
        if self.choice is not None:
            # A tuple is accepted and stored as a list; an empty choice could never be produced, and an empty
            # string would make the whole output empty, which no tokenizer can express as a token.
            if isinstance(self.choice, tuple):
                self.choice = list(self.choice)
            if not (isinstance(self.choice, list) and self.choice
                    and all(isinstance(option, str) and option for option in self.choice)):
                raise _field_error("choice", self.choice, "a non-empty list of non-empty strings")
        if self.grammar is not None and not (isinstance(self.grammar, str) and self.grammar.strip()):
            raise _field_error("grammar", self.grammar, "a non-empty string (EBNF with a root rule)")
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise _field_error("json_object", self.json_object, "a boolean")
        if not isinstance(self.disable_any_whitespace, bool):
            raise _field_error("disable_any_whitespace", self.disable_any_whitespace, "a boolean")
        chosen = self.kinds_set()
        if len(chosen) != 1:
            found = ", ".join(chosen) if chosen else "none"
            raise ValueError(f"StructuredOutputsParams needs exactly one of {', '.join(KINDS)}; got {found}")

    def _check_json(self) -> None:
        schema = self.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise _field_error("json", self.json, f"a JSON schema; the string is not JSON ({error})") from None
        # JSON Schema also allows the booleans true and false as schemas, but neither constrains usefully
        # (anything, or nothing at all), so only an object is taken, as OpenAI's json_schema does.
        if not isinstance(schema, dict):
            raise _field_error("json", self.json, "a JSON schema: a dict, or a string holding a JSON object")
        try:
            json.dumps(schema)
        except (TypeError, ValueError) as error:  # a set, an arbitrary object, a cycle: no schema
            raise _field_error("json", self.json, f"a JSON schema of JSON values ({error})") from None

    def kinds_set(self) -> list[str]:
        """The kinds this request sets, in KINDS order (``json_object=False`` asks for nothing)."""
        return [kind for kind in KINDS if getattr(self, kind) not in (None, False)]

    @property
    def kind(self) -> str:
        return self.kinds_set()[0]

    @property
    def json_text(self) -> str | None:
        """The schema as a JSON string: a string as given, a dict dumped in its own key order. Keys are never
        sorted: a grammar emits an object's properties in the order its schema lists them."""
        if self.json is None:
            return None
        return self.json if isinstance(self.json, str) else json.dumps(self.json, ensure_ascii=False)
