"""``POST /v1/completions``: a prompt (text or token ids), or a batch of them -> ``n`` choices per prompt,
streamed or not; with ``echo`` each choice starts with its prompt (and the prompt's logprobs, the first
null, when ``logprobs`` is set: the log-likelihood requests of evaluation harnesses). vLLM's
``prompt_logprobs`` field puts the prompt's logprobs on each choice in vLLM's own shape, as do echo with
logprobs (at its top-k) in vLLM; not streamed, and ``null`` when not asked, as vLLM answers.

Streaming sends one chunk per choice per engine output that carries text or tokens (a chunk may hold
several tokens when the client reads slower than the engine generates; ``return_token_ids`` tells how
many, and puts ``prompt_token_ids`` in each choice's first chunk, as vLLM does), each choice's finish
reason in its last chunk, then, with ``stream_options.include_usage``, a chunk with no choices and the
usage (the completion tokens of all choices), then ``[DONE]``.
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
from engine.outputs import CompletionOutput
from engine.request_inputs import Prompt
from engine.serve.beam_search_completions import create_beam_search_completion
from engine.serve.logprobs_format import completion_logprobs, prompt_completion_logprobs, prompt_logprobs_json
from engine.serve.prompt_batch import PromptOutput, merge_prompt_streams
from engine.serve.protocol import (CompletionRequest, completion_param_names, completion_prompts,
                                   completion_sampling_params, echo_only, returned_prompt_logprobs)
from engine.serve.state import ServerState, UsageCounter, engine_error, usage
from engine.serve.streaming import ClientDisconnected, run_unless_disconnected, sse_response, stream_chunks


class _Choices:
    """The choices being built from delta outputs: text, token ids, logprobs, and where each ended. Prompt
    ``p``'s completion ``i`` is choice ``p * n + i`` (OpenAI's and vLLM's order for a batch of prompts).
    With ``echo``, a choice's first chunk starts with its prompt (text, and logprobs when asked)."""

    def __init__(self, params: SamplingParams, body: CompletionRequest, prompts: list[Prompt], tokenizer) -> None:
        self.n = params.n
        self.num_top_logprobs = params.logprobs
        self.return_token_ids = body.return_token_ids
        self.tokens_as_ids = body.return_tokens_as_token_ids
        self.echo = body.echo
        self.echo_only = echo_only(body)  # max_tokens 0: the one token the engine made is left out
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.text_offsets: dict[int, int] = {}  # choice index -> characters of text sent so far
        self.echoed: set[int] = set()  # choice indices whose prompt went out
        # As vLLM: the prompt_logprobs field, or those echo with logprobs had computed (at its top-k).
        self.num_prompt_logprobs = returned_prompt_logprobs(body)
        if self.num_prompt_logprobs is None and body.echo and not body.stream:
            self.num_prompt_logprobs = body.logprobs
        self.prompt_token_ids_sent: set[int] = set()  # choice indices whose prompt token ids went out
        self.prompt_logprobs: dict[int, list[Any]] = {}  # prompt index -> its prompt_logprobs, formatted once
        self.prompt_logprobs_sent: set[int] = set()  # choice indices that carried them
        self.usage_counters = [UsageCounter() for _ in prompts]

    def choices(self, item: PromptOutput) -> list[dict[str, Any]]:
        if self.echo_only:  # the one token the engine made is neither returned nor counted
            item = dataclasses.replace(item, output=dataclasses.replace(item.output, outputs=[
                dataclasses.replace(completion, text="", token_ids=[], logprobs=None)
                for completion in item.output.outputs]))
        self.usage_counters[item.prompt_index].count(item.output)
        return [self._choice(item.prompt_index * self.n + completion.index, completion, item)
                for completion in item.output.outputs]

    def usage(self) -> dict[str, Any]:
        """Every prompt's tokens and every choice's, summed."""
        return usage(sum(counter.num_prompt_tokens for counter in self.usage_counters),
                     sum(counter.num_tokens for counter in self.usage_counters),
                     sum(counter.num_cached_tokens for counter in self.usage_counters))

    def _choice(self, index: int, completion: CompletionOutput, item: PromptOutput) -> dict[str, Any]:
        text, logprobs = completion.text, None
        echo_logprobs = None
        if self.echo and index not in self.echoed:
            self.echoed.add(index)
            prompt = self.prompts[item.prompt_index]
            text = self._prompt_text(prompt) + text
            if self.num_top_logprobs is not None:
                echo_logprobs, self.text_offsets[index] = prompt_completion_logprobs(
                    item.output.prompt_logprobs, prompt.token_ids, self.num_top_logprobs, self._decode_token,
                    self.tokens_as_ids)
        if self.num_top_logprobs is not None and completion.logprobs is not None:
            logprobs, self.text_offsets[index] = completion_logprobs(
                completion.logprobs, completion.token_ids, self.num_top_logprobs, self.text_offsets.get(index, 0),
                self.tokens_as_ids)
        if echo_logprobs is not None:
            logprobs = echo_logprobs if logprobs is None else {
                key: echo_logprobs[key] + logprobs[key] for key in echo_logprobs}
        choice = {"index": index, "text": text, "logprobs": logprobs,
                  "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}
        if self.num_prompt_logprobs is not None:
            choice["prompt_logprobs"] = self._prompt_logprobs(index, item)
        if self.return_token_ids:
            choice["token_ids"] = list(completion.token_ids)
            if index not in self.prompt_token_ids_sent:  # vLLM's: the prompt's ids, in a choice's first chunk
                self.prompt_token_ids_sent.add(index)
                choice["prompt_token_ids"] = list(item.output.prompt_token_ids)
        return choice

    def _prompt_logprobs(self, index: int, item: PromptOutput) -> list[Any] | None:
        """The prompt's logprobs for choice ``index``'s first output that has them (every choice of a prompt
        carries the same list), else None."""
        output = item.output
        if index in self.prompt_logprobs_sent or output.prompt_logprobs is None:
            return None
        self.prompt_logprobs_sent.add(index)
        if item.prompt_index not in self.prompt_logprobs:
            self.prompt_logprobs[item.prompt_index] = prompt_logprobs_json(
                output.prompt_logprobs, output.prompt_token_ids, self.num_prompt_logprobs)
        return self.prompt_logprobs[item.prompt_index]

    def _prompt_text(self, prompt: Prompt) -> str:
        if prompt.text is not None:
            return prompt.text
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(prompt.token_ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"token_id:{token_id}"


async def create_completion(body: CompletionRequest, raw_request: Request, state: ServerState) -> Response:
    lora_request = state.check_model(body.model)
    state.check_priority(body.priority)
    if body.use_beam_search:
        return await create_beam_search_completion(body, raw_request, state, lora_request)
    params = completion_sampling_params(body)
    batch = completion_prompts(body.prompt)
    param_names = completion_param_names(body)
    prompts = [state.prepare_prompt(prompt, params, param="prompt", param_names=param_names,
                                    label=None if len(batch) == 1 else f"prompt[{index}]", lora_request=lora_request,
                                    cache_salt=body.cache_salt)
               for index, prompt in enumerate(batch)]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "object": "text_completion", "created": int(time.time()),
              "model": body.model or state.model_name}
    request_ids = [request_id] if len(prompts) == 1 else [f"{request_id}-{index}" for index in range(len(prompts))]
    outputs = merge_prompt_streams([state.engine.generate(prompt, params, prompt_request_id, priority=body.priority,
                                                          lora_request=lora_request)
                                    for prompt, prompt_request_id in zip(prompts, request_ids)])
    choices = _Choices(params, body, prompts, state.engine.get_tokenizer())
    if body.stream:
        return sse_response(stream_chunks(outputs, choices, header, body.include_usage, state.engine.abort,
                                          request_ids, continuous_usage=body.continuous_usage))
    try:
        final = await run_unless_disconnected(raw_request, _collect(outputs, choices))
    except ClientDisconnected:
        state.engine.abort(request_ids)
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    return JSONResponse({**header, "choices": final, "usage": choices.usage()})


async def _collect(outputs: AsyncIterator[PromptOutput], choices: _Choices) -> list[dict[str, Any]]:
    """Fold the deltas into one choice per index, in index order."""
    merged: dict[int, dict[str, Any]] = {}
    try:
        async for item in outputs:
            for delta in choices.choices(item):
                choice = merged.get(delta["index"])
                if choice is None:
                    merged[delta["index"]] = {**delta, "prompt_logprobs": delta.get("prompt_logprobs")}
                    continue
                if delta.get("prompt_logprobs") is not None:
                    choice["prompt_logprobs"] = delta["prompt_logprobs"]
                choice["text"] += delta["text"]
                choice["finish_reason"], choice["stop_reason"] = delta["finish_reason"], delta["stop_reason"]
                if "token_ids" in choice:
                    choice["token_ids"] += delta["token_ids"]
                if choice["logprobs"] is not None and delta["logprobs"] is not None:
                    for key in choice["logprobs"]:
                        choice["logprobs"][key] += delta["logprobs"][key]
    finally:
        await outputs.aclose()  # a failed prompt ends the merge: the other prompts' requests are aborted
    return [merged[index] for index in sorted(merged)]
