"""A chat request's messages and tools as the chat template receives them.

Templates of real tool-calling checkpoints (Qwen2.5, Hermes, Llama 3.1, Mistral) render ``tools``, assistant
``tool_calls`` and ``tool`` results themselves: they get them as Hugging Face's ``apply_chat_template`` takes
them, with each call's ``arguments`` as an object (as vLLM passes them; templates write them with ``tojson``).

A template that never mentions them (the offline default model's ``role: content`` template) would drop the
tools and print a call's null content as "None". For such a template, deterministically:
- when the request may call tools (tool_choice other than ``none``), a first system message lists each tool as
  one line of JSON and says how to call one, in the Hermes format the ``hermes`` parser reads;
- an assistant message's calls are written into its content as ``<tool_call>{"name", "arguments"}</tool_call>``
  blocks (null content becomes ""), so the history reads as the model would have written it;
- ``tool`` messages are rendered as any other role (``tool: <result>``).
"""

from __future__ import annotations

import json
from typing import Any

TOOLS_SYSTEM_PROMPT = ("You may call the following functions. Each line is one function, as JSON:\n{tools}\n"
                       "To call a function, write <tool_call>{{\"name\": <function name>, \"arguments\": "
                       "<arguments object>}}</tool_call>.")


def _arguments(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def _template_source(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else None  # several named templates: trust them


def template_messages(body: Any, tokenizer: Any) -> list[dict[str, Any]]:
    source = _template_source(tokenizer)
    renders_calls = source is None or "tool_calls" in source
    messages = []
    for message in body.messages:
        entry: dict[str, Any] = {"role": message.role, "content": message.text()}
        if message.content is None and renders_calls:
            entry["content"] = None
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        thought = message.reasoning_content if message.reasoning_content is not None else message.reasoning
        if thought is not None and message.role == "assistant":
            entry["reasoning_content"] = entry["thinking"] = thought
        calls = message.tool_calls or []
        if renders_calls and calls:
            entry["tool_calls"] = [{"id": call.id, "type": call.type, "function": {
                "name": call.function.name, "arguments": _arguments(call.function.arguments)}} for call in calls]
        elif calls:
            entry["content"] += "".join(
                "<tool_call>" + json.dumps({"name": call.function.name,
                                            "arguments": _arguments(call.function.arguments)},
                                           ensure_ascii=False) + "</tool_call>" for call in calls)
        messages.append(entry)
    return messages


def template_tools(body: Any) -> list[dict[str, Any]] | None:
    """The tools as ``apply_chat_template(tools=...)`` takes them (OpenAI's shape), or None."""
    tools = getattr(body, "tools", None)
    return [tool.model_dump(exclude_none=True) for tool in tools] if tools else None


def with_tools_described(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                         tokenizer: Any) -> list[dict[str, Any]]:
    """``messages`` with the system message listing ``tools``, when the template would not render them."""
    source = _template_source(tokenizer)
    if not tools or source is None or "tools" in source:
        return messages
    lines = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools)
    return [{"role": "system", "content": TOOLS_SYSTEM_PROMPT.format(tools=lines)}, *messages]
