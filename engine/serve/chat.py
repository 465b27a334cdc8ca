"""``POST /v1/chat/completions``: messages -> the model's chat template -> ``n`` assistant messages.

The prompt is the tokenizer's ``apply_chat_template`` rendering (with the generation prompt), tokenized
without adding special tokens again: templates put BOS in themselves. Streaming chunks carry, per
choice, ``delta: {"role": "assistant", "content": ...}`` first, then ``{"content": ...}``; each choice's
last chunk has its finish reason; usage and ``[DONE]`` follow as for completions.

With a reasoning parser (``--reasoning-parser``; engine/reasoning_parsers/), each choice's text is split first: the
reasoning goes to the message's (or delta's) ``reasoning`` (unless the request sets ``include_reasoning: false``),
the rest on as its content. With tools (tool_calls.py decides the mode), each choice's content goes through its
``ChoiceToolOutput``
(tool_output.py): whole, into ``content`` and ``tool_calls``; streamed, into deltas carrying ``content`` and/or
``tool_calls`` (a delta can then be empty while text is held back), and ``tool_calls`` as the finish reason.

vLLM's ``prompt_logprobs`` (the rendered prompt's, after any ``truncate_prompt_tokens``) go on the response,
not on a choice, as vLLM puts them: every choice shares the prompt. ``null`` when not asked; never streamed.
So does ``prompt_token_ids``, with ``return_token_ids`` (not streamed here).

vLLM's ``use_beam_search`` goes to beam_search_chat.py: ``n`` whole messages, best first.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.core import SamplingParams
from engine.outputs import CompletionOutput, RequestOutput
from engine.serve.beam_search_chat import create_beam_search_chat_completion
from engine.serve.chat_prompt import render_chat_prompt
from engine.serve.logprobs_format import chat_logprobs, prompt_logprobs_json
from engine.serve.protocol import (ChatCompletionRequest, chat_param_names, chat_sampling_params,
                                   returned_prompt_logprobs)
from engine.reasoning_parsers import StreamingHarmonyReasoning, StreamingReasoningParser, get_parser
from engine.serve.state import ServerState, UsageCounter, engine_error
from engine.serve.streaming import ClientDisconnected, run_unless_disconnected, sse_response, stream_chunks
from engine.serve.tool_calls import ToolMode, resolve_tool_mode, tool_structured_request
from engine.serve.tool_output import ChoiceToolOutput, choice_tool_output


class AssistantMessages(UsageCounter):
    """The assistant messages being built from delta outputs, one per choice index (also what /v1/responses
    builds its output items from: engine/serve/responses_output.py)."""

    def __init__(self, params: SamplingParams, body: ChatCompletionRequest, mode: ToolMode,
                 reasoning_parser: str | None = None) -> None:
        super().__init__()
        self.mode = mode
        self.reasoning = get_parser(reasoning_parser).for_request(body.chat_template_kwargs) \
            if reasoning_parser is not None else None
        self.include_reasoning = body.include_reasoning
        # Per choice index, when streaming.
        self.reasoning_streams: dict[int, StreamingReasoningParser | StreamingHarmonyReasoning] = {}
        self.tool_outputs: dict[int, ChoiceToolOutput] = {}  # per choice index
        self.num_top_logprobs = params.logprobs
        self.return_token_ids = body.return_token_ids
        self.tokens_as_ids = body.return_tokens_as_token_ids
        self.streaming = False  # streamed deltas go through the tool mode here; whole messages in _collect
        self.sent_role: set[int] = set()  # choice indices whose first chunk (with the role) has gone out
        self.num_prompt_logprobs = returned_prompt_logprobs(body)
        self.prompt_logprobs: list[Any] | None = None  # the response's, formatted from the first output with them
        self.prompt_token_ids: list[int] | None = None

    def choices(self, output: RequestOutput) -> list[dict[str, Any]]:
        self.count(output)
        self.prompt_token_ids = output.prompt_token_ids
        if (self.num_prompt_logprobs is not None and self.prompt_logprobs is None
                and output.prompt_logprobs is not None):
            self.prompt_logprobs = prompt_logprobs_json(output.prompt_logprobs, output.prompt_token_ids,
                                                        self.num_prompt_logprobs)
        return [self._choice(completion) for completion in output.outputs]

    def tool_output(self, index: int) -> ChoiceToolOutput:
        if index not in self.tool_outputs:
            self.tool_outputs[index] = choice_tool_output(self.mode)
        return self.tool_outputs[index]

    def _choice(self, completion: CompletionOutput) -> dict[str, Any]:
        text, reasoning = completion.text, ""
        finish_reason = completion.finish_reason
        if self.streaming and self.reasoning is not None:
            stream = self.reasoning_streams.setdefault(completion.index, self.reasoning.streaming())
            reasoning, text = stream.feed(text)
            if finish_reason is not None:
                rest_reasoning, rest_text = stream.finish()
                reasoning, text = reasoning + rest_reasoning, text + rest_text
        delta: dict[str, Any] = {"content": text}
        if self.streaming and self.mode.kind != "none":
            tools = self.tool_output(completion.index)
            content, tool_calls = tools.stream(text, finished=finish_reason is not None)
            delta = {"content": content} if content else {}
            if tool_calls:
                delta["tool_calls"] = tool_calls
            finish_reason = tools.finish_reason(finish_reason)
        elif self.streaming and self.reasoning is not None and not text:
            delta = {}  # all reasoning, or held back
        if reasoning and self.include_reasoning:
            delta = {"reasoning": reasoning, **delta}
        if completion.index not in self.sent_role:
            delta = {"role": "assistant", **delta}
            self.sent_role.add(completion.index)
        logprobs = None
        if self.num_top_logprobs is not None and completion.logprobs is not None:
            logprobs = chat_logprobs(completion.logprobs, completion.token_ids, self.num_top_logprobs,
                                     self.tokens_as_ids)
        choice = {"index": completion.index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish_reason, "stop_reason": completion.stop_reason}
        if self.return_token_ids:
            choice["token_ids"] = list(completion.token_ids)
        return choice


def keeping_parsed_special_tokens(params: SamplingParams, mode: ToolMode, reasoning_parser: str | None
                                  ) -> SamplingParams:
    """``params`` with special tokens kept in the text when a parser of this request reads some (Mistral's
    [TOOL_CALLS], gpt-oss's harmony markers), as vLLM keeps them for these parsers."""
    tool_parser_reads = mode.kind == "auto" and mode.parser.keeps_special_tokens
    reasoning_reads = reasoning_parser is not None and get_parser(reasoning_parser).keeps_special_tokens
    if (tool_parser_reads or reasoning_reads) and params.skip_special_tokens:
        return dataclasses.replace(params, skip_special_tokens=False)
    return params


def prepare_chat(body: ChatCompletionRequest, state: ServerState, lora_request) -> tuple[Any, SamplingParams,
                                                                                         ToolMode]:
    """The request's prompt (its template's rendering, checked by the engine), sampling parameters and tool mode:
    what the chat route and /v1/responses (which is served as a chat request) send to the engine."""
    mode = resolve_tool_mode(body, state.tool_parser)
    tool_structured = tool_structured_request(body, mode)
    params = keeping_parsed_special_tokens(chat_sampling_params(body, tool_structured), mode, state.reasoning_parser)
    prompt = state.prepare_prompt(render_chat_prompt(state, body, mode), params, param="messages",
                                  param_names=chat_param_names(body, tool_structured), lora_request=lora_request,
                                  cache_salt=body.cache_salt)
    return prompt, params, mode


async def create_chat_completion(body: ChatCompletionRequest, raw_request: Request, state: ServerState) -> Response:
    lora_request = state.check_model(body.model)
    state.check_priority(body.priority)
    if body.use_beam_search:
        return await create_beam_search_chat_completion(body, raw_request, state, lora_request)
    prompt, params, mode = prepare_chat(body, state, lora_request)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "created": int(time.time()), "model": body.model or state.model_name}
    outputs = state.engine.generate(prompt, params, request_id, priority=body.priority, lora_request=lora_request)
    messages = AssistantMessages(params, body, mode, state.reasoning_parser)
    messages.streaming = body.stream
    if body.stream:
        chunk_header = {**header, "object": "chat.completion.chunk"}
        return sse_response(stream_chunks(outputs, messages, chunk_header, body.include_usage, state.engine.abort,
                                          request_id, continuous_usage=body.continuous_usage))
    try:
        choices = await run_unless_disconnected(raw_request, _collect(outputs, messages))
    except ClientDisconnected:
        state.engine.abort(request_id)
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    response = {**header, "object": "chat.completion", "choices": choices, "usage": messages.usage(),
                "prompt_logprobs": messages.prompt_logprobs}
    if body.return_token_ids:  # vLLM's: the rendered (and truncated) prompt's ids, on the response
        response["prompt_token_ids"] = messages.prompt_token_ids
    return JSONResponse(response)


async def _collect(outputs: AsyncIterator[RequestOutput], messages: AssistantMessages) -> list[dict[str, Any]]:
    """Fold the deltas into one message per choice index, in index order."""
    text: dict[int, list[str]] = {}
    content_logprobs: dict[int, list[dict[str, Any]]] = {}
    token_ids: dict[int, list[int]] = {}
    last: dict[int, dict[str, Any]] = {}
    async for output in outputs:
        for delta in messages.choices(output):
            index = delta["index"]
            last[index] = delta
            text.setdefault(index, []).append(delta["delta"]["content"])
            token_ids.setdefault(index, []).extend(delta.get("token_ids", []))
            if delta["logprobs"] is not None:
                content_logprobs.setdefault(index, []).extend(delta["logprobs"]["content"])
    choices = []
    for index in sorted(last):
        tools = messages.tool_output(index)
        whole, reasoning = "".join(text[index]), None
        if messages.reasoning is not None:
            reasoning, content = messages.reasoning.extract(whole)
            whole = content or ""
        message = {"role": "assistant", **tools.message(whole)}
        if messages.reasoning is not None:
            message["content"] = message["content"] or None
            if messages.include_reasoning:
                message["reasoning"] = reasoning
        choice = {"index": index, "message": message,
                  "logprobs": {"content": content_logprobs[index]} if index in content_logprobs else None,
                  "finish_reason": tools.finish_reason(last[index]["finish_reason"]),
                  "stop_reason": last[index]["stop_reason"]}
        if messages.return_token_ids:
            choice["token_ids"] = token_ids[index]
        choices.append(choice)
    return choices
