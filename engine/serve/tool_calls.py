"""What a chat request's ``tools`` and ``tool_choice`` ask of this server, decided before it reaches the engine.

The choice, as vLLM's server takes it:
- left out: ``auto`` when the server runs with ``--enable-auto-tool-choice --tool-call-parser NAME``, else
  ``none`` (vLLM's default);
- ``none``: the tools go to the chat template (a template that renders them shows them to the model) and the
  output is plain content;
- ``auto``: the model writes calls in its own format, which the server's parser splits from the content; without
  the two flags it is a 400 saying to pass them;
- ``required`` and a named function: the output is constrained by the structured-outputs path to a JSON schema
  made from the tools: the named function's ``parameters``, or for ``required`` an array of one or more (exactly
  one with ``parallel_tool_calls: false``) ``{"name": <one tool's name>, "parameters": <that tool's schema>}``
  objects. A request that also asks for structured outputs (``response_format``, ``guided_*``) is a 400 naming
  both. A ``structured_outputs`` object with only ``disable_any_whitespace`` is honoured (compact JSON).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from engine.core.structured_outputs import KINDS, StructuredOutputsParams
from engine.serve.errors import OpenAIError
from engine.serve.structured_request import GUIDED_FIELDS, StructuredRequest
from engine.serve.tool_parsers import ToolParser, get_parser, parser_names
from engine.serve.tool_protocol import ChatTool, NamedToolChoice

AUTO_FLAGS = "--enable-auto-tool-choice and --tool-call-parser"
# A function without parameters takes none: its arguments are {}.
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolMode:
    kind: Literal["none", "auto", "required", "named"]
    name: str | None = None  # the function, when named
    parser: ToolParser | None = None  # the server's parser, when auto
    parallel: bool = True  # more than one call allowed


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def resolve_tool_mode(body: Any, tool_parser: str | None) -> ToolMode:
    """The request's tool mode; ``tool_parser`` is the server's (None unless auto tool choice is enabled)."""
    tools = body.tools or []
    choice = body.tool_choice
    if choice is None:
        choice = "auto" if tools and tool_parser is not None else "none"
    if choice == "none" or not tools:
        return ToolMode("none")
    if choice == "auto":
        if tool_parser is None:
            raise OpenAIError(f'tool_choice "auto" needs the server started with {AUTO_FLAGS} NAME (known: '
                              f'{", ".join(parser_names())}); or send tool_choice "required", "none" or a named '
                              f"function", param="tool_choice", code="invalid_value")
        parser = get_parser(tool_parser)
        parser.use_tools(tools)
        return ToolMode("auto", parser=parser, parallel=body.parallel_tool_calls)
    _refuse_structured_outputs(body, choice)
    if isinstance(choice, NamedToolChoice):
        return ToolMode("named", name=choice.function.name, parallel=False)
    return ToolMode("required", parallel=body.parallel_tool_calls)


def _refuse_structured_outputs(body: Any, choice: Any) -> None:
    shown = f"a named function ({choice.function.name!r})" if isinstance(choice, NamedToolChoice) else f'"{choice}"'
    asked = [param for param in GUIDED_FIELDS if getattr(body, param) is not None]
    if isinstance(body.structured_outputs, dict) and any(kind in body.structured_outputs for kind in KINDS):
        asked.append("structured_outputs")
    response_format = body.response_format
    if response_format is not None and not (isinstance(response_format, dict) and response_format.get("type") == "text"):
        asked.append("response_format")  # {"type": "text"} asks for nothing
    if asked:
        raise OpenAIError(f"tool_choice {shown} constrains the output to tool calls, so it cannot be combined "
                          f"with {asked[0]}; send one of tool_choice and {asked[0]}", param=asked[0],
                          code="invalid_value")


def tool_structured_request(body: Any, mode: ToolMode) -> StructuredRequest | None:
    """The structured outputs that make the model write the calls, for required and named; else None."""
    if mode.kind not in ("required", "named"):
        return None
    tools: list[ChatTool] = body.tools
    definitions: dict[str, Any] = {}
    if mode.kind == "named":
        index = next(i for i, tool in enumerate(tools) if tool.function.name == mode.name)
        schema = _hoist_definitions(tools[index].function.parameters or NO_PARAMETERS, definitions, index)
        param = f"tools[{index}].function.parameters"
    else:
        calls = [{"type": "object", "properties": {
                     "name": {"type": "string", "enum": [tool.function.name]},
                     "parameters": _hoist_definitions(tool.function.parameters or NO_PARAMETERS, definitions, i)},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for i, tool in enumerate(tools)]
        schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not mode.parallel:
            schema["maxItems"] = 1
        param = "tools"
    if definitions:
        schema = {**schema, "$defs": definitions}
    compact = isinstance(body.structured_outputs, dict) and body.structured_outputs.get("disable_any_whitespace")
    try:
        params = StructuredOutputsParams(json=schema, disable_any_whitespace=bool(compact))
    except ValueError as error:
        raise OpenAIError(f"{param}: {error}", param=param, code="invalid_value") from None
    return StructuredRequest(params, {"structured_outputs": param, "structured_outputs.json": param})


def _hoist_definitions(schema: dict[str, Any], definitions: dict[str, Any], index: int) -> dict[str, Any]:
    """The schema without its ``$defs``, which move to the top of the combined schema: ``#/$defs/X`` references
    resolve from the document's root, and a tool's schema is no longer the root once wrapped."""
    if "$defs" not in schema:
        return schema
    for name, definition in schema["$defs"].items():
        if definitions.get(name, definition) != definition:
            raise OpenAIError(f"tools[{index}].function.parameters defines $defs.{name} differently from an "
                              f"earlier tool; the tools' schemas are combined into one, so give it another name",
                              param=f"tools[{index}].function.parameters", code="invalid_value")
        definitions[name] = definition
    return {key: value for key, value in schema.items() if key != "$defs"}
