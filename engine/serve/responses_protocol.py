"""The body of ``POST /v1/responses`` (OpenAI's Responses API), and the chat request it is served as.

The fields, as OpenAI spells them: ``input`` (a text, or a list of items: messages with ``input_text``,
``input_image`` and, for earlier assistant turns, ``output_text`` parts; ``function_call`` and
``function_call_output`` items; ``reasoning`` items), ``instructions`` (a system message ahead of the input),
``max_output_tokens``, ``temperature``, ``top_p``, ``tools`` (functions, flat: ``{"type": "function", "name",
"parameters"}``), ``tool_choice``, ``parallel_tool_calls``, ``text.format`` (``text``, ``json_object``,
``json_schema``), ``reasoning.effort`` (given to the chat template as ``reasoning_effort``, which gpt-oss'
template reads), ``top_logprobs`` and ``include: ["message.output_text.logprobs"]``, ``previous_response_id``,
``store``, ``metadata``, ``max_tool_calls``, ``stream``, ``background`` (answered at once, generated after: responses_background.py).
vLLM's sampling extensions (``top_k``, ``min_p``, ``seed``, ``stop``,
``ignore_eos``, ``guided_*``, ``structured_outputs``, ``chat_template_kwargs``, ``priority``...) are accepted as
on chat.

A response is one assistant turn, so the request is served as a chat completion of one choice
(``to_chat_request``): the same template, tool modes, reasoning parser and structured outputs. What the Responses
API asks and this server cannot do is refused by name, not ignored: tools other than functions, ``truncation:
"auto"``, ``n`` above 1, beam search, prompt logprobs, ``response_format`` (``text.format`` is its spelling here),
images by ``file_id``, ``background`` with ``stream`` or without ``store``, stored ``prompt`` templates and
``conversation`` objects. A reasoning item goes with the assistant
turn after it as that message's ``reasoning_content`` (templates of reasoning models show it where they show past
thoughts, and drop it elsewhere).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator

from engine.serve.errors import OpenAIError, validation_error
from engine.serve.protocol import MAX_LOGPROBS, ChatCompletionRequest, _SamplingRequest

_STRICT = ConfigDict(extra="ignore", strict=True)
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class InputText(BaseModel):
    model_config = _STRICT
    type: Literal["input_text"]
    text: str


class OutputText(BaseModel):
    """An earlier assistant turn's text, sent back as input."""
    model_config = _STRICT
    type: Literal["output_text"]
    text: str


class Refusal(BaseModel):
    model_config = _STRICT
    type: Literal["refusal"]
    refusal: str


class InputImage(BaseModel):
    model_config = _STRICT
    type: Literal["input_image"]
    image_url: str | None = None  # a data: URL (this server fetches nothing)
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None

    @field_validator("file_id")
    @classmethod
    def _no_files(cls, file_id: str | None) -> str | None:
        if file_id is not None:
            raise ValueError("this server stores no files; send the image as image_url (a data: URL)")
        return file_id


ContentPart = Annotated[InputText | OutputText | Refusal | InputImage, Field(discriminator="type")]


class MessageItem(BaseModel):
    model_config = _STRICT
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    status: str | None = None


class FunctionCallItem(BaseModel):
    """A call an earlier turn made (a response's ``function_call`` output item, sent back)."""
    model_config = _STRICT
    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    arguments: str
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = _STRICT
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str
    output: str | list[InputText]
    status: str | None = None


class ReasoningText(BaseModel):
    model_config = _STRICT
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(BaseModel):
    model_config = _STRICT
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


def _item_kind(value: Any) -> str | None:
    # OpenAI lets a message leave its type out ({"role": "user", "content": ...}).
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", None)


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                      | Annotated[ReasoningItem, Tag("reasoning")], Discriminator(_item_kind)]


class FunctionTool(BaseModel):
    """A function the model may call, as the Responses API spells it (chat nests these under ``function``)."""
    model_config = _STRICT
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _STRICT
    format: dict[str, Any] | None = None  # checked where chat checks response_format, named text.format
    verbosity: str | None = None


class ReasoningConfig(BaseModel):
    model_config = _STRICT
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(_SamplingRequest):
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    include: list[str] | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    background: bool = False
    truncation: Literal["auto", "disabled"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # At most this many function calls in the output (later ones are dropped); None: no limit.
    max_tool_calls: int | None = Field(default=None, ge=1)
    # OpenAI's stored prompt templates and conversations: nothing here stores them, so asking for one is refused.
    prompt: Any = None
    conversation: Any = None

    @field_validator("prompt", "conversation")
    @classmethod
    def _not_stored_here(cls, value: Any, info: Any) -> Any:
        if value is not None:
            what = "prompt templates" if info.field_name == "prompt" else "conversations (continue a response with " \
                "previous_response_id)"
            raise ValueError(f"this server stores no {what}")
        return value

    @field_validator("n")
    @classmethod
    def _one_output(cls, n: int) -> int:
        if n != 1:
            raise ValueError("a response is one assistant turn; send n requests for n answers")
        return n

    @field_validator("use_beam_search")
    @classmethod
    def _not_served(cls, value: bool) -> bool:
        if value:
            raise ValueError("not supported on /v1/responses")
        return value

    @field_validator("background")
    @classmethod
    def _background_is_stored(cls, value: bool, info: Any) -> bool:
        if value and not info.data.get("store", True):
            raise ValueError("a background response is read back later, so it needs store: true")
        if value and info.data.get("stream"):
            raise ValueError("not taken with stream here; poll GET /v1/responses/{id} instead")
        return value

    @field_validator("prompt_logprobs", "response_format")
    @classmethod
    def _chat_only(cls, value: Any, info: Any) -> Any:
        if value is not None:
            hint = "; send text.format" if info.field_name == "response_format" else ""
            raise ValueError(f"not supported on /v1/responses{hint}")
        return value

    @field_validator("truncation")
    @classmethod
    def _no_automatic_truncation(cls, value: str | None) -> str | None:
        if value == "auto":
            raise ValueError('"auto" (dropping the oldest input) is not supported: an input longer than the '
                             'model allows is a 400; send "disabled" or leave it out')
        return value

    @property
    def returns_logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS_INCLUDE in (self.include or [])


@dataclass
class ChatForm:
    """The chat request a Responses request is served as, and where each of its messages came from (an error
    about ``messages[3]`` is reported about ``input[5]``)."""
    request: ChatCompletionRequest
    sources: list[str] = field(default_factory=list)

    def renamed(self, error: OpenAIError) -> OpenAIError:
        """``error`` (about the chat request) with the Responses request's names."""
        error.message = self._rename(error.message)
        error.param = self._rename(error.param) if error.param is not None else None
        return error

    def _rename(self, text: str) -> str:
        text = re.sub(r"messages\[(\d+)\]", lambda match: self.sources[int(match.group(1))], text)
        for chat_name, responses_name in _RENAMES:
            text = re.sub(chat_name, responses_name, text)
        return text


_RENAMES = [(r"\bmessages\b", "input"), (r"\bmax_completion_tokens\b", "max_output_tokens"),
            (r"\bresponse_format\.json_schema\.schema\b", "text.format.schema"),
            (r"\bresponse_format\.json_schema\b", "text.format"), (r"\bresponse_format\b", "text.format"),
            (r"\btools\[(\d+)\]\.function\.", r"tools[\1].")]


def input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as a list of item dicts (a text is one user message)."""
    if isinstance(request.input, str):
        return [{"type": "message", "role": "user", "content": request.input}]
    return [item.model_dump(exclude_none=True) for item in request.input]


def to_chat_request(request: ResponsesRequest, history: list[dict[str, Any]]) -> ChatForm:
    """The chat completion that serves ``request``, after the items of its ``history`` (the earlier turns of a
    ``previous_response_id``: their input and output items)."""
    form = ChatForm(request=None)  # type: ignore[arg-type]
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
        form.sources.append("instructions")
    items = [*history, *input_items(request)]
    first_new = len(history)
    thought = None  # a reasoning item's text, for the assistant turn it preceded
    for index, item in enumerate(items):
        source = f"input[{index - first_new}]" if index >= first_new else "previous_response_id"
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = "".join(part["text"] for part in item.get("content") or item.get("summary") or [])
            continue
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant":
                previous.setdefault("tool_calls", []).append(call)  # one assistant turn: its text, then its calls
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call],
                                 **({"reasoning_content": thought} if thought is not None else {})})
                form.sources.append(source)
            thought = None
            continue
        if kind == "function_call_output":
            output = item["output"]
            text = output if isinstance(output, str) else "".join(part["text"] for part in output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            message = {"role": item["role"], "content": _chat_content(item["content"])}
            if item["role"] == "assistant" and thought is not None:
                message["reasoning_content"] = thought
            messages.append(message)
        thought = None
        form.sources.append(source)
    body = _chat_fields(request, messages)
    try:
        form.request = ChatCompletionRequest.model_validate(body)
    except ValidationError as error:
        raise form.renamed(validation_error(error)) from None
    return form


def _chat_content(content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part["type"] == "input_image":
            image_url = {"url": part.get("image_url", "")}
            if "detail" in part:
                image_url["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image_url})
        else:
            parts.append({"type": "text", "text": part.get("text", part.get("refusal", ""))})
    return parts


def _chat_fields(request: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = request.model_dump(include=set(_SamplingRequest.model_fields), exclude_none=True)
    kwargs = dict(request.chat_template_kwargs or {})
    if request.reasoning is not None and request.reasoning.effort is not None:
        kwargs.setdefault("reasoning_effort", request.reasoning.effort)
    body.update(messages=messages, max_completion_tokens=request.max_output_tokens,
                parallel_tool_calls=request.parallel_tool_calls, chat_template_kwargs=kwargs or None,
                logprobs=request.returns_logprobs, top_logprobs=request.top_logprobs if request.returns_logprobs
                else None, return_token_ids=True, stream_options=None)
    if request.tools:
        body["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
                         for tool in request.tools]
    if request.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(request.tool_choice)
    if request.text is not None and request.text.format is not None:
        body["response_format"] = _chat_response_format(request.text.format)
    return body


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, str) or (isinstance(choice, dict) and "function" in choice):
        return choice  # a mode; or chat's spelling, which parse_tool_choice checks
    raise OpenAIError(f'tool_choice must be none, auto, required or {{"type": "function", "name": ...}}, got '
                      f"{choice!r}", param="tool_choice", code="invalid_value")


def _chat_response_format(text_format: dict[str, Any]) -> dict[str, Any]:
    if text_format.get("type") != "json_schema":
        return text_format
    json_schema = {key: text_format[key] for key in ("name", "schema", "strict", "description") if key in text_format}
    return {"type": "json_schema", "json_schema": json_schema}
