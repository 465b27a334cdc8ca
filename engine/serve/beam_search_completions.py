"""``POST /v1/completions`` with vLLM's ``use_beam_search``: for each prompt, the ``n`` best sequences of a
beam search of width ``n`` (``AsyncLLM.beam_search``), best first, as choices ``p * n + i``, as vLLM answers.
The sequences are only known once the search ends, so with ``stream``, as in vLLM, every choice comes whole
in one chunk at the end (then the usage chunk when asked, then ``[DONE]``). protocol.py refuses the fields
the search would ignore."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.beam_search import BeamSearchOutput, BeamSearchSequence
from engine.core import LoRARequest
from engine.serve.protocol import (CompletionRequest, completion_beam_search_params, completion_param_names,
                                   completion_prompts, completion_sampling_params)
from engine.serve.state import ServerState, engine_error, usage
from engine.serve.streaming import DONE_EVENT, ClientDisconnected, run_unless_disconnected, sse_event, sse_response


async def create_beam_search_completion(body: CompletionRequest, raw_request: Request, state: ServerState,
                                        lora_request: LoRARequest | None) -> Response:
    params = completion_sampling_params(body)
    param_names = completion_param_names(body)
    batch = completion_prompts(body.prompt)
    prompts = [state.prepare_prompt(prompt, params, param="prompt", param_names=param_names,
                                    label=None if len(batch) == 1 else f"prompt[{index}]", lora_request=lora_request)
               for index, prompt in enumerate(batch)]
    beam_params = [completion_beam_search_params(body, params, len(prompt.token_ids), state.engine.max_model_len)
                   for prompt in prompts]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "object": "text_completion", "created": int(time.time()),
              "model": body.model or state.model_name}
    searches = asyncio.gather(*(
        state.engine.beam_search(prompt, prompt_params, f"{request_id}-{index}", priority=body.priority,
                                 lora_request=lora_request)
        for index, (prompt, prompt_params) in enumerate(zip(prompts, beam_params))))
    num_prompt_tokens = sum(len(prompt.token_ids) for prompt in prompts)
    if body.stream:
        return sse_response(_stream(searches, header, params.n, body, num_prompt_tokens))
    try:
        outputs: list[BeamSearchOutput] = await run_unless_disconnected(raw_request, searches)
    except ClientDisconnected:  # the searches were cancelled, which aborts their requests
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    choices = _choices(outputs, params.n, body.return_token_ids)
    return JSONResponse({**header, "choices": choices, "usage": _usage(outputs, num_prompt_tokens)})


async def _stream(searches: asyncio.Future, header: dict[str, Any], n: int, body: CompletionRequest,
                  num_prompt_tokens: int) -> AsyncIterator[bytes]:
    try:
        outputs = await searches
        for choice in _choices(outputs, n, body.return_token_ids):
            yield sse_event({**header, "choices": [choice], **({"usage": None} if body.include_usage else {})})
        if body.include_usage:
            yield sse_event({**header, "choices": [], "usage": _usage(outputs, num_prompt_tokens)})
        yield DONE_EVENT
    except Exception as error:
        yield sse_event(engine_error(error).to_dict())
        yield DONE_EVENT
    finally:
        searches.cancel()  # the client left mid-search: cancelling aborts the round's requests


def _choices(outputs: list[BeamSearchOutput], n: int, return_token_ids: bool) -> list[dict[str, Any]]:
    return [_choice(prompt_index * n + index, sequence, return_token_ids)
            for prompt_index, output in enumerate(outputs) for index, sequence in enumerate(output.sequences)]


def _usage(outputs: list[BeamSearchOutput], num_prompt_tokens: int) -> dict[str, Any]:
    num_completion_tokens = sum(len(sequence.logprobs) for output in outputs for sequence in output.sequences)
    return usage(num_prompt_tokens, num_completion_tokens, 0)


def _choice(index: int, sequence: BeamSearchSequence, return_token_ids: bool) -> dict[str, Any]:
    choice = {"index": index, "text": sequence.text or "", "logprobs": None,
              "finish_reason": sequence.finish_reason, "stop_reason": sequence.stop_reason}
    if return_token_ids:
        choice["token_ids"] = sequence.output_token_ids
        choice["prompt_token_ids"] = sequence.tokens[:sequence.num_prompt_tokens]
    return choice
