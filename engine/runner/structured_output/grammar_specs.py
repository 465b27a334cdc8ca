"""What each kind of ``StructuredOutputsParams`` compiles from: which of xgrammar's compile methods, and its
input. Pure Python, so the translation (a choice becoming a grammar of alternatives) is testable without
xgrammar installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.core.structured_outputs import StructuredOutputsParams

# OpenAI's json_object promises "a valid JSON object". xgrammar's builtin JSON grammar also accepts a top-level
# array, so the object kind compiles this schema instead: any object, any keys.
ANY_JSON_OBJECT_SCHEMA = '{"type": "object"}'


@dataclass(frozen=True)
class GrammarSpec:
    """One compile request: ``method`` is ``json_schema``, ``regex`` or ``ebnf``; ``source`` its input text.
    Frozen and hashable: equal specs are the same grammar (the compiler's cache keys on the same text)."""
    method: str
    source: str
    any_whitespace: bool = True


def grammar_spec(params: StructuredOutputsParams) -> GrammarSpec:
    any_whitespace = not params.disable_any_whitespace
    kind = params.kind
    if kind == "json":
        return GrammarSpec("json_schema", params.json_text, any_whitespace)
    if kind == "json_object":
        return GrammarSpec("json_schema", ANY_JSON_OBJECT_SCHEMA, any_whitespace)
    if kind == "regex":
        return GrammarSpec("regex", params.regex)
    if kind == "choice":
        return GrammarSpec("ebnf", choice_grammar(params.choice))
    return GrammarSpec("ebnf", params.grammar)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the given strings: ``root ::= "a" | "b"``.

    Each option is written as a JSON string literal: xgrammar's EBNF literals take the same escapes
    (``\\"``, ``\\\\``, ``\\n``, ``\\uXXXX``), so quotes, backslashes and control characters in an option
    stand for themselves and cannot end the literal early. Non-ASCII text stays as it is (UTF-8).
    """
    return "root ::= " + " | ".join(json.dumps(option, ensure_ascii=False) for option in choices)
