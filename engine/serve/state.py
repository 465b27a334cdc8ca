"""What every endpoint shares: the engine, the served model names, and the checks a request passes
before it reaches the engine (model name, prompt, context length)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from engine.async_llm import AsyncLLM
from engine.core import LoRARequest, SamplingParams
from engine.engine_loop import EngineDeadError, EngineStepError
from engine.request_inputs import Prompt, check_priority
from engine.serve.errors import OpenAIError
from engine.serve.protocol import sampling_error
from engine.serve.responses_background import BackgroundResponses
from engine.serve.responses_store import ResponseStore


@dataclass
class ServerState:
    engine: AsyncLLM
    served_model_names: list[str]
    # The tool-call parser's name when tool_choice "auto" is enabled (--enable-auto-tool-choice), else None.
    tool_parser: str | None = None
    # The reasoning parser's name (--reasoning-parser; engine/reasoning_parsers/), else None.
    reasoning_parser: str | None = None
    # Adapter name -> its LoRARequest (--lora-modules, and /v1/load_lora_adapter when runtime updates are
    # allowed): a request whose model is the name runs with it.
    lora_requests: dict[str, LoRARequest] = field(default_factory=dict)
    # Adapter name -> the base model it was trained on, where --lora-modules gave one (/v1/models' parent).
    lora_parents: dict[str, str] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    # The lora_int_id the next loaded adapter gets: above every id given so far, so none is ever reused (the
    # runner and the prefix cache key adapters by id; engine/serve/lora_updates.py).
    next_lora_int_id: int = 0
    lora_update_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # /v1/responses' kept responses (previous_response_id, GET and DELETE /v1/responses/{id}).
    responses: ResponseStore = field(default_factory=ResponseStore)
    background: BackgroundResponses = field(default_factory=BackgroundResponses)

    def __post_init__(self) -> None:
        self.next_lora_int_id = max([self.next_lora_int_id, 1, *(request.lora_int_id + 1
                                                                  for request in self.lora_requests.values())])

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_priority(self, priority: int) -> None:
        """A 400 for a priority the engine would ignore (its policy is fcfs), before anything streams."""
        try:
            check_priority(priority, self.engine.scheduling_policy)
        except ValueError as error:
            raise OpenAIError(str(error), param="priority") from None

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter the request's ``model`` names (None: the base model), or vLLM's 404 for a model this
        server does not serve."""
        if model is None or model in self.served_model_names:
            return None
        lora_request = self.lora_requests.get(model)
        if lora_request is None:
            served = [*self.served_model_names, *self.lora_requests]
            raise OpenAIError(f"The model `{model}` does not exist. This server serves "
                              f"{', '.join(repr(name) for name in served)}.", status=404, param="model",
                              code="model_not_found")
        return lora_request

    def prepare_prompt(self, prompt: Any, params: SamplingParams, param: str, param_names: dict[str, str],
                       label: str | None = None, lora_request: LoRARequest | None = None,
                       cache_salt: str | None = None) -> Prompt:
        """Tokenize and validate; a 400 names ``param`` for a prompt the engine cannot take, or the sampling
        parameter at fault (``param_names`` maps SamplingParams fields to the request's names). ``label``
        (``prompt[2]`` in a batch) starts the message, so the client knows which prompt it is about.
        ``cache_salt``: the request's (vLLM's), which keeps its prefix-cache hits among requests of the same salt."""
        if cache_salt is not None:
            prompt = {**prompt, "cache_salt": cache_salt} if isinstance(prompt, dict) else \
                {"prompt" if isinstance(prompt, str) else "prompt_token_ids": prompt, "cache_salt": cache_salt}
        try:
            return self._prepare_prompt(prompt, params, param, param_names, lora_request)
        except OpenAIError as error:
            if label is not None:
                error.message = f"{label}: {error.message}"
            raise

    def _prepare_prompt(self, prompt: Any, params: SamplingParams, param: str, param_names: dict[str, str],
                        lora_request: LoRARequest | None) -> Prompt:
        try:
            parsed = self.engine.process_prompt(prompt, params, lora_request)
        except ValueError as error:
            openai_error = sampling_error(error, param_names, default_param=param)
            if "more than the engine allows" in openai_error.message:
                openai_error.code = "context_length_exceeded"
            raise openai_error from None
        max_model_len = self.engine.max_model_len
        # The field the client set: on chat, max_completion_tokens (what the openai client sends) when given.
        max_tokens_param = param_names.get("max_tokens", "max_tokens")
        if params.max_tokens is not None and len(parsed.token_ids) + params.max_tokens > max_model_len:
            raise OpenAIError(
                f"this model's maximum context length is {max_model_len} tokens, but {len(parsed.token_ids) + params.max_tokens} "
                f"were requested ({len(parsed.token_ids)} in the prompt, {params.max_tokens} to generate); "
                f"reduce the prompt or {max_tokens_param}", param=max_tokens_param, code="context_length_exceeded")
        return parsed


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens,
            "prompt_tokens_details": {"cached_tokens": num_cached_tokens}}


class UsageCounter:
    """Counts a request's tokens from its outputs as they stream by, for the ``usage`` object."""

    def __init__(self) -> None:
        self.num_tokens = 0
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0

    def count(self, output) -> None:
        # Every completion's tokens: with n > 1 the usage counts each choice's, the prompt once (as OpenAI).
        self.num_tokens += sum(len(completion.token_ids) for completion in output.outputs)
        self.num_prompt_tokens = len(output.prompt_token_ids)
        self.num_cached_tokens = output.num_cached_tokens

    def usage(self) -> dict[str, Any]:
        return usage(self.num_prompt_tokens, self.num_tokens, self.num_cached_tokens)


def engine_error(error: Exception) -> OpenAIError:
    """An error raised by a request's iterator, as the OpenAI error to report."""
    if isinstance(error, EngineDeadError):
        return OpenAIError(str(error), status=503, code="engine_unavailable")
    if isinstance(error, EngineStepError):
        return OpenAIError(str(error), status=500, error_type="internal_server_error", code="engine_step_failed")
    if isinstance(error, ValueError):
        return OpenAIError(str(error), code="invalid_value")
    return OpenAIError(f"internal server error: {error!r}", status=500, error_type="internal_server_error",
                       code="internal_error")
