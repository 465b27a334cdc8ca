"""``POST /v1/completions`` with vLLM's ``use_beam_search``: for each prompt, the ``n`` best sequences of a
beam search of width ``n`` (``AsyncLLM.beam_search``), best first, as choices ``p * n + i``, as vLLM answers.
beam_search_params.py refuses the fields the search would ignore; beam_search_responses.py answers."""

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
from engine.serve.protocol import (CompletionRequest, completion_param_names, completion_prompts,
                                   completion_sampling_params)
from engine.serve.state import ServerState


async def create_beam_search_completion(body: CompletionRequest, raw_request: Request, state: ServerState,
                                        lora_request: LoRARequest | None) -> Response:
    params = completion_sampling_params(body)
    param_names = completion_param_names(body)
    batch = completion_prompts(body.prompt)
    prompts = [state.prepare_prompt(prompt, params, param="prompt", param_names=param_names,
                                    label=None if len(batch) == 1 else f"prompt[{index}]", lora_request=lora_request)
               for index, prompt in enumerate(batch)]
    beam_params = [beam_search_params(body, params, len(prompt.token_ids), state.engine.max_model_len)
                   for prompt in prompts]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    header = {"id": request_id, "object": "text_completion", "created": int(time.time()),
              "model": body.model or state.model_name}
    searches = asyncio.gather(*(
        state.engine.beam_search(prompt, prompt_params, f"{request_id}-{index}", priority=body.priority,
                                 lora_request=lora_request)
        for index, (prompt, prompt_params) in enumerate(zip(prompts, beam_params))))

    def choices_of(outputs: list[BeamSearchOutput], streamed: bool) -> list[dict[str, Any]]:
        return [_choice(prompt_index * params.n + index, sequence, body.return_token_ids)
                for prompt_index, output in enumerate(outputs) for index, sequence in enumerate(output.sequences)]

    return await beam_search_response(searches, raw_request, header=header, chunk_header=header,
                                      choices_of=choices_of, stream=body.stream, include_usage=body.include_usage,
                                      num_prompt_tokens=sum(len(prompt.token_ids) for prompt in prompts))


def _choice(index: int, sequence: BeamSearchSequence, return_token_ids: bool) -> dict[str, Any]:
    choice = {"index": index, "text": sequence.text or "", "logprobs": None,
              "finish_reason": sequence.finish_reason, "stop_reason": sequence.stop_reason}
    if return_token_ids:
        choice["token_ids"] = sequence.output_token_ids
        choice["prompt_token_ids"] = sequence.tokens[:sequence.num_prompt_tokens]
    return choice
