"""The OpenAI request bodies the server accepts, as pydantic models, and their sampling parameters.

Field names and defaults follow OpenAI's API (``max_tokens`` 16 for completions, the remaining context
for chat; ``temperature`` 1). A few vLLM extensions are accepted because load generators and vLLM
clients send them: ``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p``, ``repetition_penalty``,
``stop_token_ids``, ``skip_special_tokens``, ``spaces_between_special_tokens``,
``include_stop_str_in_output``, ``return_token_ids``
(each choice then carries the ids of its new tokens, so a client can count tokens per chunk, and vLLM's
``prompt_token_ids``: the prompt the model ran, after any truncation),
``return_tokens_as_token_ids`` (logprob entries named ``token_id:<id>``), ``priority`` (lower is
served first, with ``--scheduling-policy priority``), ``cache_salt``, ``allowed_token_ids``, ``bad_words``,
``prompt_logprobs`` (k: each prompt token's logprob and
the top k, per choice on completions and on the response on chat, as vLLM places them; not with ``stream``,
which vLLM refuses too) and ``truncate_prompt_tokens`` (keep the prompt's last k tokens, -1: as many as the
engine allows; on chat, of the rendered template).
Structured outputs: OpenAI's ``response_format`` (``json_object``, ``json_schema``) and vLLM's ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar`` and ``structured_outputs`` (structured_request.py).
Tool calling on chat: OpenAI's ``tools``, ``tool_choice`` (none, auto, required or a named function) and
``parallel_tool_calls``, with assistant ``tool_calls`` and ``tool`` messages in the history (tool_protocol.py
for the fields, tool_calls.py for what each choice does; auto needs the server's
``--enable-auto-tool-choice --tool-call-parser NAME``).
Unknown fields are ignored, as OpenAI-compatible servers usually do; known ones that ask for what this
server cannot do (the deprecated ``functions``) are refused, not ignored. vLLM's ``use_beam_search`` (with
``n`` the beam width and ``length_penalty``) is served on both routes.
Types are strict, as OpenAI's are: ``"max_tokens": true`` or ``"stream": "yes"`` is a 400, not 1 or true.

Validation happens in two places, both reported as 400s naming the parameter: types and ranges here
(pydantic), and everything ``SamplingParams`` checks, mapped back to the request's own field names.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from engine.core import SamplingParams
from engine.core.sampling_params import MAX_ABS_LOGIT_BIAS, MAX_N, MAX_SEED, MIN_SEED
from engine.serve.errors import OpenAIError
from engine.serve.structured_request import StructuredRequest, structured_request
from engine.serve.tool_protocol import ChatTool, MessageToolCall, parse_tool_choice

# OpenAI's documented ceiling for top_logprobs / completions logprobs.
MAX_LOGPROBS = 20

# Strict: JSON's types as they are (no true -> 1, "yes" -> true, "5" -> 5); ints still fill float fields.
_STRICT = ConfigDict(extra="ignore", strict=True)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk carries the usage so far (not only the last, choice-less one).
    continuous_usage_stats: bool = False


class _SamplingRequest(BaseModel):
    model_config = _STRICT

    model: str | None = None
    # Choices per request: n engine requests (engine/parallel_sampling.py), at most vLLM's ceiling.
    n: int = Field(default=1, ge=1, le=MAX_N)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    # Checked here as well as in SamplingParams so the 400 comes from the same place as other range errors.
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    priority: int = 0
    # Each prompt token's logprob and the top k (response shape: logprobs_format.prompt_logprobs_json).
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # Keep the prompt's last k tokens (-1: as many as the engine allows); SamplingParams checks the value.
    truncate_prompt_tokens: int | None = None
    # Structured outputs, OpenAI's (both routes take response_format in vLLM) and vLLM's own fields; typed
    # loosely here so that structured_request.py reports a bad value under the name the client used.
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    # vLLM's: beam search of width n (engine/beam_search.py; beam_search_params.py checks the other fields),
    # ranked at the end by cum_logprob / length ** length_penalty.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # vLLM's: prefix-cache hits only among requests with the same salt (tenants cannot time each other's prompts).
    cache_salt: str | None = Field(default=None, min_length=1)
    # vLLM's: sample only among these token ids; never produce these words.
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None

    @field_validator("cache_salt")
    @classmethod
    def _salt_not_with_beam_search(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("use_beam_search"):
            raise ValueError("not taken with use_beam_search (each beam runs as a prompt of its own)")
        return value

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_not_streamed(cls, value: int | None, info: ValidationInfo) -> int | None:
        # vLLM's rule: no chunk carries them, so asking for any with stream is refused (0, which asks for
        # the prompt tokens' own logprobs only, vLLM lets through and returns nothing; so does this server).
        if value and info.data.get("stream"):
            raise ValueError("prompt_logprobs are not available when stream=true")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_in_openai_range(cls, logit_bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (logit_bias or {}).items():
            if not (math.isfinite(bias) and abs(bias) <= MAX_ABS_LOGIT_BIAS):
                raise ValueError(f"biases must be finite numbers in [-{MAX_ABS_LOGIT_BIAS:g}, "
                                 f"{MAX_ABS_LOGIT_BIAS:g}]; token {token!r} has {bias!r}")
        return logit_bias

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatTextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = _STRICT
    # A data: URL (base64 PNG, JPEG...): this server fetches nothing from the network (chat_images.py).
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ChatImagePart(BaseModel):
    """An image for a vision-language model (OpenAI's ``image_url`` part)."""
    model_config = _STRICT
    type: Literal["image_url"]
    image_url: ImageURL


ChatContentPart = Annotated[ChatTextPart | ChatImagePart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = _STRICT
    # OpenAI's roles ("function" is deprecated there). Fields are checked in this order, so the validators of
    # the later ones can see the earlier (content last: whether it may be null depends on role and tool_calls).
    role: Literal["system", "developer", "user", "assistant", "tool"]
    name: str | None = None
    # An earlier assistant turn's thought (vLLM's reasoning_content, or reasoning as its responses spell it): templates
    # of reasoning models render it where they show past thoughts (Qwen3's within a tool-calling turn, gpt-oss's
    # analysis before its calls, which it reads as "thinking").
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = Field(default=None, validate_default=True)
    content: str | list[ChatContentPart] | None = Field(default=None, validate_default=True)

    @field_validator("tool_calls")
    @classmethod
    def _only_assistants_call(cls, tool_calls: list[MessageToolCall] | None, info: ValidationInfo) -> Any:
        if tool_calls is not None and info.data.get("role") != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {info.data.get('role')} messages")
        return tool_calls

    @field_validator("tool_call_id")
    @classmethod
    def _tool_results_name_their_call(cls, tool_call_id: str | None, info: ValidationInfo) -> str | None:
        if tool_call_id is None and info.data.get("role") == "tool":
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return tool_call_id

    @field_validator("content")
    @classmethod
    def _content_unless_calling(cls, content: Any, info: ValidationInfo) -> Any:
        # As OpenAI: only an assistant message with tool_calls may leave its content out (or null).
        if content is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise ValueError("content is required (only an assistant message with tool_calls may omit it)")
        return content

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, ChatTextPart))

    def image_urls(self) -> list[str]:
        """Its images' URLs, in order (none for text content)."""
        if not isinstance(self.content, list):
            return []
        return [part.image_url.url for part in self.content if isinstance(part, ChatImagePart)]


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    # vLLM's: leave the last message open for the model to continue (with add_generation_prompt false), and let the
    # tokenizer add its special tokens (BOS) to the rendered text.
    continue_final_message: bool = False
    add_special_tokens: bool = False
    # Extra variables for the chat template (vLLM's: Qwen3's enable_thinking, Granite's thinking...).
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: with a reasoning parser, whether the message carries its reasoning (False: dropped).
    include_reasoning: bool = True
    # Tool calling (tool_protocol.py; what the choice does is tool_calls.py's). Declared in this order so that
    # tool_choice's validator sees the tools.
    tools: list[ChatTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    # OpenAI's deprecated spelling of tools, accepted only to refuse it by name: ignoring it would answer as if
    # it had been honoured.
    functions: Any = None
    echo: bool = False  # vLLM's: prepend the last message to the answer; not done here

    @field_validator("echo")
    @classmethod
    def _no_chat_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("not supported on chat completions (echo is a /v1/completions field here)")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(cls, value: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        return parse_tool_choice(value, [tool.function.name for tool in tools])

    @field_validator("functions")
    @classmethod
    def _no_legacy_functions(cls, value: Any) -> Any:
        if value is not None and value != []:  # some clients send an empty list for "no functions"; honoured
            raise ValueError("not supported: functions is OpenAI's deprecated form; send tools instead")
        return value


# SamplingParams field -> the request parameter a user set, per endpoint (for error messages).
_COMPLETION_PARAM_NAMES = {"n": "n"}
_CHAT_PARAM_NAMES = {"logprobs": "top_logprobs", "max_tokens": "max_completion_tokens"}
# A field, or a field's field (structured_outputs.json): a dot only counts when a name follows it.
_FIELD_IN_MESSAGE = re.compile(r"SamplingParams\.(\w+(?:\.\w+)?)")


def completion_param_names(request: CompletionRequest) -> dict[str, str]:
    return {**_COMPLETION_PARAM_NAMES, **_structured_param_names(request)}


def chat_param_names(request: ChatCompletionRequest,
                     tool_structured: StructuredRequest | None = None) -> dict[str, str]:
    names = dict(_CHAT_PARAM_NAMES)
    if request.max_completion_tokens is None:
        names["max_tokens"] = "max_tokens"
    return {**names, **_structured_param_names(request, tool_structured)}


def _structured_param_names(request: _SamplingRequest,
                            tool_structured: StructuredRequest | None = None) -> dict[str, str]:
    structured = tool_structured or structured_request(request)
    return structured.param_names if structured is not None else {}


def sampling_error(error: ValueError, param_names: dict[str, str], default_param: str | None) -> OpenAIError:
    """A ValueError from SamplingParams or the engine's checks, as a 400 naming the request's parameter.

    A message about ``SamplingParams.<field>`` names that field's parameter, even when the engine raised it
    while checking the prompt (``prompt: SamplingParams.logit_bias has token id(s) ...``): the parameter is
    what the client has to change. Anything else is about ``default_param``.
    """
    message = str(error)
    match = _FIELD_IN_MESSAGE.search(message)
    if match is None:
        return OpenAIError(message, param=default_param, code="invalid_value")
    field = match.group(1)
    top = field.split(".")[0]
    param = param_names.get(field) or param_names.get(top, top) + field[len(top):]
    return OpenAIError(message[match.start():].replace(f"SamplingParams.{field}", param), param=param,
                       code="invalid_value")


def sampling_params_for(request: _SamplingRequest, *, max_tokens: int | None, logprobs: int | None,
                        param_names: dict[str, str], prompt_logprobs: int | None = None,
                        tool_structured: StructuredRequest | None = None) -> SamplingParams:
    """The request's SamplingParams; a ValueError becomes a 400 naming the request's parameter.
    ``tool_structured`` (tool_choice required or named) takes the place of the request's structured outputs."""
    try:
        logit_bias = ({int(token): bias for token, bias in request.logit_bias.items()}
                      if request.logit_bias is not None else None)
    except ValueError:
        raise OpenAIError("logit_bias keys must be token ids (integers as strings)", param="logit_bias",
                          code="invalid_value") from None
    fields: dict[str, Any] = dict(
        n=request.n, max_tokens=max_tokens, min_tokens=request.min_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p, seed=request.seed, stop=request.stop,
        stop_token_ids=request.stop_token_ids, ignore_eos=request.ignore_eos,
        presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
        logit_bias=logit_bias, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        truncate_prompt_tokens=request.truncate_prompt_tokens)
    structured = tool_structured or structured_request(request)  # a 400 naming the parameter when malformed
    if structured is not None:
        fields["structured_outputs"] = structured.params
    for name in ("top_k", "min_p", "repetition_penalty", "allowed_token_ids", "bad_words"):
        value = getattr(request, name)
        if value is not None:
            fields[name] = value
    try:
        return SamplingParams(**fields)
    except ValueError as error:
        raise sampling_error(error, param_names, default_param=None) from None


def completion_sampling_params(request: CompletionRequest) -> SamplingParams:
    if request.best_of not in (None, 1):
        raise OpenAIError(f"best_of must be 1, got {request.best_of}", param="best_of")
    if request.suffix is not None:
        raise OpenAIError("suffix is not supported", param="suffix")
    # echo with logprobs scores the prompt too (what evaluation harnesses ask for: a continuation's
    # log-likelihood given its context), as vLLM does: prompt logprobs at the same top-k. With the
    # prompt_logprobs field as well, the engine computes the larger top-k and each view keeps its own.
    echo_logprobs = request.logprobs if request.echo else None
    asked = [k for k in (echo_logprobs, returned_prompt_logprobs(request)) if k is not None]
    prompt_logprobs = max(asked) if asked else None
    # echo with max_tokens 0 returns the prompt alone (vLLM's "echo without generation"): the engine
    # still produces one token, which the response leaves out (completions.py).
    max_tokens = 1 if echo_only(request) else request.max_tokens
    return sampling_params_for(request, max_tokens=max_tokens, logprobs=request.logprobs,
                               param_names=completion_param_names(request), prompt_logprobs=prompt_logprobs)


def returned_prompt_logprobs(request: _SamplingRequest) -> int | None:
    """The top-k of the ``prompt_logprobs`` the response carries: None when not asked, or when streamed (only
    0 gets this far with stream, and no chunk carries them, so the engine is not asked to compute them)."""
    return None if request.stream else request.prompt_logprobs


def echo_only(request: CompletionRequest) -> bool:
    """An echo that asks for no new tokens: the response is the prompt (and its logprobs) alone."""
    return request.echo and request.max_tokens == 0


def chat_sampling_params(request: ChatCompletionRequest,
                         tool_structured: StructuredRequest | None = None) -> SamplingParams:
    if request.top_logprobs is not None and not request.logprobs:
        raise OpenAIError("top_logprobs requires logprobs to be true", param="top_logprobs")
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return sampling_params_for(request, max_tokens=max_tokens, logprobs=logprobs,
                               param_names=chat_param_names(request, tool_structured),
                               prompt_logprobs=returned_prompt_logprobs(request), tool_structured=tool_structured)


def completion_prompts(prompt: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a completions request: a text or a token-id list is one, a list of them a batch."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], (str, list)):
        return list(prompt)
    return [prompt]
