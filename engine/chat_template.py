"""A conversation -> the prompt the model's chat template makes of it (``LLM.chat`` and the server's chat
routes share it, so both send the model the same tokens).

The template renders the messages as text, with the generation prompt (the assistant's turn opener)
unless told otherwise; the text is then tokenized without adding special tokens again, since templates
put BOS in themselves. A model without a template, or a template that rejects the messages (a role it
does not know), is a ``ChatTemplateError`` that says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.chat_images import content_parts


class ChatTemplateError(ValueError):
    pass


class NoChatTemplateError(ChatTemplateError):
    """The tokenizer has no chat template at all (a base model): the caller should send a prompt."""


def check_messages(messages: Any, label: str = "messages") -> list[dict[str, Any]]:
    """A conversation as the template wants it: a non-empty list of {"role": str, "content": str}, where content may
    also be a list of parts (text, and images for a vision-language model: engine/chat_images.py, which decodes
    them here and names a bad one), or None for an assistant turn that only calls tools."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"{label} must be a non-empty list of {{'role', 'content'}} messages, got {messages!r:.80}")
    checked = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        calls_only = isinstance(message, Mapping) and content is None and message.get("role") == "assistant" \
            and bool(message.get("tool_calls"))  # as OpenAI: an assistant turn of calls may have no content
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) \
                or not (isinstance(content, (str, list)) or calls_only):
            raise ValueError(f"{label}[{index}] must be a mapping with a string 'role' and a string (or a list of "
                             f"parts) 'content', got {message!r:.80}")
        if isinstance(content, list):
            content = content_parts(content, f"{label}[{index}]")
        # Other keys (an assistant's tool_calls, a tool result's tool_call_id, a past thought's reasoning_content) go
        # to the template as they are: templates that know them render them.
        checked.append({**message, "content": content})
    return checked


def load_chat_template(value: str) -> str:
    """vLLM's ``--chat-template``: a file holding a Jinja template, or the template itself; a ValueError for a value
    that is neither (a path that does not exist, most likely)."""
    path = Path(value).expanduser()
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot read the chat template file {value!r}: {error}") from None
    if any(mark in value for mark in ("{{", "{%")):
        return value
    raise ValueError(f"{value!r} is neither a file nor a Jinja template (no '{{{{' or '{{%' in it)")


def render_chat(tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                tools: list[dict[str, Any]] | None = None,
                template_kwargs: dict[str, Any] | None = None, chat_template: str | None = None,
                continue_final_message: bool = False, add_special_tokens: bool = False) -> dict[str, Any]:
    """``{"prompt": text, "prompt_token_ids": ids}`` of the conversation through the tokenizer's template (or
    ``chat_template``, which replaces it); ``tools`` (OpenAI's function definitions) go to the template, for templates
    that render them; ``template_kwargs``, the template's own variables (vLLM's ``chat_template_kwargs``: Qwen3's
    ``enable_thinking``). vLLM's ``continue_final_message``: the last message is left open (no end-of-turn after
    it), for the model to continue rather than answer; ``add_special_tokens``: the tokenizer adds its own (BOS) to
    the rendered text, for a template that does not write them."""
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be true: the model "
                                "either continues the last message or starts a new one")
    if tokenizer is None or not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise NoChatTemplateError("this model has no chat template; send a prompt instead")
    extra = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
    if chat_template:
        extra["chat_template"] = chat_template
    if continue_final_message:
        extra["continue_final_message"] = True
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **extra)
    except Exception as error:  # a template may raise on, e.g., roles it does not know
        raise ChatTemplateError(f"the chat template rejected the messages: {error}") from None
    return {"prompt": text, "prompt_token_ids": list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)}
