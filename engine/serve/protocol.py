"""The OpenAI request bodies the server accepts, as pydantic models, and their sampling parameters.

Field names and defaults follow OpenAI's API (``max_tokens`` 16 for completions, the remaining context
for chat; ``temperature`` 1). A few vLLM extensions are accepted because load generators and vLLM
clients send them: ``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p``, ``repetition_penalty``,
``stop_token_ids``, ``skip_special_tokens``, ``include_stop_str_in_output``, ``return_token_ids``
(each choice then carries the ids of its new tokens, so a client can count tokens per chunk) and
``return_tokens_as_token_ids`` (logprob entries named ``token_id:<id>``).
Unknown fields are ignored, as OpenAI-compatible servers usually do.

Validation happens in two places, both reported as 400s naming the parameter: types and ranges here
(pydantic), and everything ``SamplingParams`` checks, mapped back to the request's own field names.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.core import SamplingParams
from engine.serve.errors import OpenAIError

# OpenAI's documented ceiling for top_logprobs / completions logprobs.
MAX_LOGPROBS = 20


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = 1
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
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
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ChatContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True


# SamplingParams field -> the request parameter a user set, per endpoint (for error messages).
_COMPLETION_PARAM_NAMES = {"n": "n"}
_CHAT_PARAM_NAMES = {"logprobs": "top_logprobs", "max_tokens": "max_completion_tokens"}
_FIELD_IN_MESSAGE = re.compile(r"SamplingParams\.(\w+)")


def sampling_params_for(request: _SamplingRequest, *, max_tokens: int | None, logprobs: int | None,
                        param_names: dict[str, str]) -> SamplingParams:
    """The request's SamplingParams; a ValueError becomes a 400 naming the request's parameter."""
    if request.n != 1:
        raise OpenAIError(f"n must be 1 (this server generates one choice per request), got {request.n}", param="n",
                          code="invalid_value")
    try:
        logit_bias = ({int(token): bias for token, bias in request.logit_bias.items()}
                      if request.logit_bias is not None else None)
    except ValueError:
        raise OpenAIError("logit_bias keys must be token ids (integers as strings)", param="logit_bias",
                          code="invalid_value") from None
    fields: dict[str, Any] = dict(
        max_tokens=max_tokens, min_tokens=request.min_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p, seed=request.seed, stop=request.stop,
        stop_token_ids=request.stop_token_ids, ignore_eos=request.ignore_eos,
        presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
        logit_bias=logit_bias, logprobs=logprobs, skip_special_tokens=request.skip_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output)
    for name in ("top_k", "min_p", "repetition_penalty"):
        value = getattr(request, name)
        if value is not None:
            fields[name] = value
    try:
        return SamplingParams(**fields)
    except ValueError as error:
        match = _FIELD_IN_MESSAGE.search(str(error))
        field = match.group(1) if match else None
        param = param_names.get(field, field) if field is not None else None
        message = str(error).replace(f"SamplingParams.{field}", param) if field else str(error)
        raise OpenAIError(message, param=param, code="invalid_value") from None


def completion_sampling_params(request: CompletionRequest) -> SamplingParams:
    if request.best_of not in (None, 1):
        raise OpenAIError(f"best_of must be 1, got {request.best_of}", param="best_of")
    if request.echo:
        raise OpenAIError("echo is not supported", param="echo")
    if request.suffix is not None:
        raise OpenAIError("suffix is not supported", param="suffix")
    return sampling_params_for(request, max_tokens=request.max_tokens, logprobs=request.logprobs,
                               param_names=_COMPLETION_PARAM_NAMES)


def chat_sampling_params(request: ChatCompletionRequest) -> SamplingParams:
    if request.top_logprobs is not None and not request.logprobs:
        raise OpenAIError("top_logprobs requires logprobs to be true", param="top_logprobs")
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    names = dict(_CHAT_PARAM_NAMES)
    if request.max_completion_tokens is None:
        names["max_tokens"] = "max_tokens"
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return sampling_params_for(request, max_tokens=max_tokens, logprobs=logprobs, param_names=names)


def single_prompt(prompt: str | list[int] | list[str] | list[list[int]]) -> str | list[int]:
    """The one prompt of a completions request (a batch of several is refused: one choice per request)."""
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise OpenAIError(f"prompt must be a single prompt; got a batch of {len(prompt)}", param="prompt")
        return prompt[0]
    return prompt
