"""Structured outputs as a request body asks for them, turned into one ``StructuredOutputsParams``.

Three spellings are accepted, on both /v1/completions and /v1/chat/completions, as vLLM's server takes them:
- OpenAI's ``response_format``: ``{"type": "json_object"}``, or ``{"type": "json_schema", "json_schema":
  {"name": ..., "schema": {...}, "strict": ...}}`` (``{"type": "text"}`` asks for nothing);
- vLLM's older fields ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``;
- vLLM's ``structured_outputs``: an object with ``StructuredOutputsParams``' fields (``json``, ``regex``,
  ``choice``, ``grammar``, ``json_object``, ``disable_any_whitespace``).

A request uses one of them: two (say ``guided_json`` and ``response_format``) is a 400 naming both, since
silently preferring one would answer a question the client did not ask. A ``structured_outputs`` object that
sets no kind, only ``disable_any_whitespace``, is an option of the other spelling rather than a second one:
``response_format`` has no way to say it, and over a weak model JSON with optional whitespace may never end. Every error names the parameter as
the client spelled it (``response_format.json_schema.schema``, ``structured_outputs.regex``), including those
the engine raises later when the grammar does not compile: ``param_names`` maps the engine's field names
(``structured_outputs.json``) to the request's.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from engine.core.structured_outputs import KINDS, StructuredOutputsParams, shorten
from engine.serve.errors import OpenAIError

# vLLM's guided_* field -> the StructuredOutputsParams field it sets.
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}
STRUCTURED_OUTPUTS_FIELDS = tuple(field.name for field in dataclasses.fields(StructuredOutputsParams))
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
_PARAMS_FIELD = re.compile(r"StructuredOutputsParams\.(\w+)")


@dataclass
class StructuredRequest:
    params: StructuredOutputsParams
    # SamplingParams field paths ("structured_outputs", "structured_outputs.json") -> the request's parameter.
    param_names: dict[str, str]


@dataclass
class _Way:
    """One way the body asked: the parameter it used, the fields it sets, and each field's name in the body."""
    param: str
    fields: dict[str, Any]
    names: dict[str, str]


def structured_request(body: Any) -> StructuredRequest | None:
    """The body's structured outputs, or None when it asks for none (OpenAIError 400 when malformed)."""
    ways = [_Way(param, {field: getattr(body, param)}, {field: param})
            for param, field in GUIDED_FIELDS.items() if getattr(body, param) is not None]
    options = None  # a structured_outputs object without a kind: options for the kind another field sets
    if body.structured_outputs is not None:
        way = _from_structured_outputs(body.structured_outputs)
        if any(field in KINDS for field in way.fields):
            ways.append(way)
        else:
            options = way
    if body.response_format is not None:
        way = _from_response_format(body.response_format)
        if way is not None:
            ways.append(way)
    if len(ways) > 1:
        names = " and ".join(way.param for way in ways)
        raise OpenAIError(f"structured outputs can be asked for one way per request, got {names}",
                          param=ways[1].param, code="invalid_value")
    if not ways:
        if options is None:
            return None
        ways = [options]  # options alone: StructuredOutputsParams names what is missing
    elif options is not None:
        ways[0].fields.update(options.fields)
        ways[0].names.update(options.names)
    way = ways[0]
    try:
        params = StructuredOutputsParams(**way.fields)
    except ValueError as error:
        raise _renamed(error, way) from None
    names = {f"structured_outputs.{field}": name for field, name in way.names.items()}
    return StructuredRequest(params, {"structured_outputs": way.param, **names})


def _renamed(error: ValueError, way: _Way) -> OpenAIError:
    """StructuredOutputsParams' message with its field written as the body's parameter."""
    message = str(error)
    match = _PARAMS_FIELD.search(message)
    if match is None:  # about the whole (no kind, or several in one structured_outputs object)
        return OpenAIError(message.replace("StructuredOutputsParams", way.param), param=way.param,
                           code="invalid_value")
    param = way.names.get(match.group(1), way.param)
    return OpenAIError(message.replace(match.group(0), param), param=param, code="invalid_value")


def _from_structured_outputs(value: Any) -> _Way:
    if not isinstance(value, dict):
        raise OpenAIError(f"structured_outputs must be an object with one of json, regex, choice, grammar or "
                          f"json_object, got {shorten(value)}", param="structured_outputs", code="invalid_value")
    unknown = sorted(set(value) - set(STRUCTURED_OUTPUTS_FIELDS))
    if unknown:
        raise OpenAIError(f"structured_outputs has unknown field(s) {unknown}; it takes "
                          f"{', '.join(STRUCTURED_OUTPUTS_FIELDS)}", param=f"structured_outputs.{unknown[0]}",
                          code="invalid_value")
    return _Way("structured_outputs", dict(value), {field: f"structured_outputs.{field}" for field in value})


def _from_response_format(value: Any) -> _Way | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in RESPONSE_FORMAT_TYPES:
        raise OpenAIError(f"response_format must be an object whose type is one of "
                          f"{', '.join(RESPONSE_FORMAT_TYPES)}, got {shorten(value)}", param="response_format",
                          code="invalid_value")
    if kind == "text":
        return None
    if kind == "json_object":
        return _Way("response_format", {"json_object": True}, {"json_object": "response_format"})
    json_schema = value.get("json_schema")
    if not isinstance(json_schema, dict) or not isinstance(json_schema.get("schema"), dict):
        # OpenAI lets the schema out; then nothing would constrain the output, which json_schema promises.
        raise OpenAIError(f"response_format.json_schema must be an object with a schema (an object), got "
                          f"{shorten(json_schema)}", param="response_format.json_schema", code="invalid_value")
    return _Way("response_format", {"json": json_schema["schema"]}, {"json": "response_format.json_schema.schema"})
