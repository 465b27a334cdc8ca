"""``POST /tokenize``, ``POST /detokenize`` and ``GET /version``: vLLM's utility routes.

Clients count tokens the way the server will (prompt budgets, load generators that size requests in
tokens) without loading the tokenizer themselves. ``/tokenize`` takes a ``prompt`` (tokenized as
``/v1/completions`` tokenizes it, special tokens added unless ``add_special_tokens`` is false) or
chat ``messages`` (rendered through the chat template as ``/v1/chat/completions`` renders them), and
returns ``{"count", "max_model_len", "tokens"}`` (with ``"token_strs"`` when asked); ``/detokenize``
turns ``tokens`` back into ``{"prompt": text}``. Token ids outside the vocabulary are a 400 naming
``tokens``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.serve.chat_prompt import render_chat_prompt
from engine.serve.errors import OpenAIError
from engine.serve.protocol import ChatMessage
from engine.serve.state import ServerState

_STRICT = ConfigDict(extra="ignore", strict=True)


class TokenizeRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    # None: vLLM's defaults, true for a prompt (as /v1/completions tokenizes it), false for messages (as the chat
    # route renders them: templates write BOS themselves).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        if self.add_special_tokens is None:
            self.add_special_tokens = self.messages is None
        return self


class DetokenizeRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    tokens: list[int]


def _tokenizer(state: ServerState):
    tokenizer = state.engine.get_tokenizer()
    if tokenizer is None:
        raise OpenAIError("this server has no tokenizer (started without one); it takes token ids only",
                          code="no_tokenizer")
    return tokenizer


def tokenize(body: TokenizeRequest, state: ServerState) -> dict[str, Any]:
    state.check_model(body.model)
    tokenizer = _tokenizer(state)
    if body.messages is not None:
        rendered = render_chat_prompt(state, body)
        token_ids = rendered["prompt_token_ids"]
    else:
        token_ids = list(tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids)
    response: dict[str, Any] = {"count": len(token_ids), "max_model_len": state.engine.max_model_len,
                                "tokens": token_ids}
    if body.return_token_strs:
        response["token_strs"] = tokenizer.convert_ids_to_tokens(token_ids)
    return response


def detokenize(body: DetokenizeRequest, state: ServerState) -> dict[str, Any]:
    state.check_model(body.model)
    tokenizer = _tokenizer(state)
    vocab_size = state.engine.vocab_size
    outside = [token for token in body.tokens if not 0 <= token < vocab_size]
    if outside:
        raise OpenAIError(f"tokens has token id(s) {outside[:5]} outside the vocabulary [0, {vocab_size})",
                          param="tokens")
    return {"prompt": tokenizer.decode(body.tokens)}


def server_version() -> dict[str, str]:
    try:
        return {"version": version("servesim")}
    except PackageNotFoundError:  # run from a checkout that was never installed
        return {"version": "unknown"}
