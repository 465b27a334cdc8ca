"""The prompt of a chat body: its messages (and tools) through the tokenizer's chat template, with the
generation prompt. Shared by /v1/chat/completions (sampling and beam search) and /tokenize."""

from __future__ import annotations

from typing import Any

from engine.chat_template import ChatTemplateError, NoChatTemplateError, render_chat
from engine.chat_images import content_parts, image_token, mark_images
from engine.serve.errors import OpenAIError
from engine.serve.state import ServerState
from engine.serve.tool_calls import ToolMode
from engine.serve.tool_prompt import template_messages, template_tools, with_tools_described


def render_chat_prompt(state: ServerState, body: Any, mode: ToolMode | None = None) -> dict[str, Any]:
    """The prompt of ``body``'s messages (and tools); the tools are described in a system message for a
    template that ignores them only when the model may call one (``mode`` other than none; tool_prompt.py)."""
    tokenizer = state.engine.get_tokenizer()
    messages = template_messages(body, tokenizer)
    images = _chat_images(body, messages, state, tokenizer)
    tools = template_tools(body)
    if mode is not None and mode.kind != "none":
        messages = with_tools_described(messages, tools, tokenizer)
    try:
        rendered = render_chat(tokenizer, messages, body.add_generation_prompt, tools=tools,
                               template_kwargs=getattr(body, "chat_template_kwargs", None),
                               continue_final_message=getattr(body, "continue_final_message", False),
                               add_special_tokens=getattr(body, "add_special_tokens", False))
        return {**rendered, "multi_modal_data": {"image": images}} if images else rendered
    except NoChatTemplateError:
        raise OpenAIError("this model has no chat template; use /v1/completions", param="messages",
                          code="no_chat_template") from None
    except ChatTemplateError as error:
        raise OpenAIError(str(error), param="messages") from None



def _chat_images(body: Any, messages: list[dict[str, Any]], state: ServerState, tokenizer: Any) -> list:
    """The images of ``body``'s messages, each marked in the template's ``messages`` as the template reads it
    (engine/chat_images.py); a 400 naming the message for one that cannot be read or taken."""
    try:
        for index, (message, entry) in enumerate(zip(body.messages, messages)):
            if message.image_urls():
                entry["content"] = content_parts([part.model_dump(exclude_none=True) for part in message.content],
                                                 f"messages[{index}]")
        return mark_images(messages, image_token(state.engine.image_inputs, tokenizer),
                           getattr(tokenizer, "chat_template", None))
    except ValueError as error:
        raise OpenAIError(str(error), param="messages") from None
