"""``POST /v1/chat/completions`` with vLLM's ``use_beam_search``: the ``n`` best assistant messages of a beam
search of width ``n`` over the rendered conversation, best first, as choices 0 .. n - 1, as vLLM answers.
beam_search_params.py refuses the fields the search would ignore (tools among them: a search does not call
them); beam_search_responses.py answers, streamed or not."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from engine.beam_search import BeamSearchOutput, BeamSearchSequence
from engine.core import LoRARequest
from engine.serve.beam_search_params import beam_search_params
from engine.serve.beam_search_responses import beam_search_response
from engine.serve.chat_prompt import render_chat_prompt
from engine.serve.errors import OpenAIError
from engine.serve.protocol import ChatCompletionRequest, chat_param_names, chat_sampling_params
from engine.serve.state import ServerState


async def create_beam_search_chat_completion(body: ChatCompletionRequest, raw_request: Request, state: ServerState,
                                             lora_request: LoRARequest | None) -> Response:
    params = chat_sampling_params(body)
    prompt = state.prepare_prompt(render_chat_prompt(state, body), params, param="messages",
                                  param_names=chat_param_names(body), lora_request=lora_request)
    if prompt.mm_features:
        # Beam search runs each beam as a token-id prompt (engine/beam_search.py), which would drop the images.
        raise OpenAIError("use_beam_search does not take image_url content; sample instead", param="messages")
    search_params = beam_search_params(body, params, len(prompt.token_ids), state.engine.max_model_len)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "created": int(time.time()), "model": body.model or state.model_name}
    search = state.engine.beam_search(prompt, search_params, request_id, priority=body.priority,
                                      lora_request=lora_request)

    def choices_of(outputs: list[BeamSearchOutput], streamed: bool) -> list[dict[str, Any]]:
        return [_choice(index, sequence, streamed, body.return_token_ids)
                for index, sequence in enumerate(outputs[0].sequences)]

    def response_fields(outputs: list[BeamSearchOutput]) -> dict[str, Any]:
        # As chat.py's: prompt_logprobs is null (beam search refuses them); the rendered prompt's ids with
        # return_token_ids, on the response since every choice shares the prompt.
        fields: dict[str, Any] = {"prompt_logprobs": None}
        if body.return_token_ids:
            fields["prompt_token_ids"] = list(prompt.token_ids)
        return fields

    return await beam_search_response(asyncio.gather(search), raw_request,
                                      header={**header, "object": "chat.completion"},
                                      chunk_header={**header, "object": "chat.completion.chunk"},
                                      choices_of=choices_of, stream=body.stream, include_usage=body.include_usage,
                                      num_prompt_tokens=len(prompt.token_ids), response_fields=response_fields)


def _choice(index: int, sequence: BeamSearchSequence, streamed: bool, return_token_ids: bool) -> dict[str, Any]:
    message = {"role": "assistant", "content": sequence.text or ""}
    choice = {"index": index, "delta" if streamed else "message": message, "logprobs": None,
              "finish_reason": sequence.finish_reason, "stop_reason": sequence.stop_reason}
    if return_token_ids:
        choice["token_ids"] = sequence.output_token_ids
    return choice
