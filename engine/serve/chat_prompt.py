"""The prompt of a chat body: its messages (and tools) through the tokenizer's chat template, with the
generation prompt. Shared by /v1/chat/completions (sampling and beam search) and /tokenize."""

from __future__ import annotations

from typing import Any

from engine.chat_template import ChatTemplateError, NoChatTemplateError, render_chat
from engine.serve.chat_images import mark_images
from engine.serve.errors import OpenAIError
from engine.serve.state import ServerState
from engine.serve.tool_calls import ToolMode
from engine.serve.tool_prompt import template_messages, template_tools, with_tools_described


def render_chat_prompt(state: ServerState, body: Any, mode: ToolMode | None = None) -> dict[str, Any]:
    """The prompt of ``body``'s messages (and tools); the tools are described in a system message for a
    template that ignores them only when the model may call one (``mode`` other than none; tool_prompt.py)."""
    tokenizer = state.engine.get_tokenizer()
    messages = template_messages(body, tokenizer)
    images = mark_images(body, messages, image_token(state.engine.image_inputs, tokenizer),
                         getattr(tokenizer, "chat_template", None))
    tools = template_tools(body)
    if mode is not None and mode.kind != "none":
        messages = with_tools_described(messages, tools, tokenizer)
    try:
        rendered = render_chat(tokenizer, messages, body.add_generation_prompt, tools=tools)
        return {**rendered, "multi_modal_data": {"image": images}} if images else rendered
    except NoChatTemplateError:
        raise OpenAIError("this model has no chat template; use /v1/completions", param="messages",
                          code="no_chat_template") from None
    except ChatTemplateError as error:
        raise OpenAIError(str(error), param="messages") from None


def image_token(image_inputs, tokenizer) -> str | None:
    """The model's image mark as text (None: a model without images)."""
    if image_inputs is None or tokenizer is None:
        return None
    return tokenizer.convert_ids_to_tokens(image_inputs.image_token_id)
