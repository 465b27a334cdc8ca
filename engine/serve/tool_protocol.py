"""The tool-calling parts of a chat request body, as OpenAI's API spells them.

- ``tools``: ``[{"type": "function", "function": {"name", "description"?, "parameters"?}}]``; ``parameters``
  is a JSON schema (an object); a function without it takes no arguments.
- ``tool_choice``: ``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name"}}``.
- in ``messages``: an assistant message's ``tool_calls`` (its content may then be null) and a ``tool``
  message's ``tool_call_id``.

The checks that relate fields (a named choice names a tool in ``tools``; a choice needs tools) are in
``ChatCompletionRequest`` (protocol.py); what the choice means for this server is tool_calls.py's.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

_STRICT = ConfigDict(extra="ignore", strict=True)
# OpenAI's rule for function names.
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class FunctionDefinition(BaseModel):
    model_config = _STRICT
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _openai_name(cls, name: str) -> str:
        if not _FUNCTION_NAME.fullmatch(name):
            raise ValueError("a function name is 1 to 64 letters, digits, underscores or dashes")
        return name


class ChatTool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = _STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionName


TOOL_CHOICE_MODES = ("none", "auto", "required")
_TOOL_CHOICE_FORMS = 'none, auto, required or {"type": "function", "function": {"name": ...}}'


def parse_tool_choice(value: Any, tool_names: list[str]) -> str | NamedToolChoice | None:
    """``tool_choice`` checked against the request's tools; a ValueError says what is wrong (the 400's message
    starts with ``tool_choice: ``, so the message does not name it again)."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in TOOL_CHOICE_MODES:
            raise ValueError(f"must be one of {_TOOL_CHOICE_FORMS}")
        choice: str | NamedToolChoice = value
    else:
        try:
            choice = NamedToolChoice.model_validate(value)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"must be one of {_TOOL_CHOICE_FORMS}; tool_choice.{where}: "
                             f"{first['msg']}") from None
    if choice == "none":
        return choice
    if not tool_names:
        raise ValueError("needs tools: send the functions the model may call in tools")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in tool_names:
        raise ValueError(f"names the function {choice.function.name!r}, which is not in tools "
                         f"({', '.join(repr(name) for name in tool_names)})")
    return choice


class FunctionCall(BaseModel):
    model_config = _STRICT
    name: str
    arguments: str  # a JSON text, as the server returned it


class MessageToolCall(BaseModel):
    """A call an earlier assistant turn made, sent back in the history."""
    model_config = _STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
