"""``POST /v1/embeddings``: OpenAI's embeddings route, on a server whose engine embeds (``--runner pooling``).

``input`` is a string, a list of strings, a list of token ids or a list of such lists (OpenAI's four
forms); each is one embedding, ``data[i]`` for ``input[i]``. ``encoding_format`` ``float`` (a list of
numbers) or ``base64`` (the float32 values, little-endian, base64-encoded, as OpenAI's). ``dimensions``
keeps the first k components (Matryoshka), renormalized. vLLM's extensions: ``truncate_prompt_tokens``
(keep the last k tokens; -1: max_model_len) and ``normalize``. ``user`` is accepted and ignored.
An input the engine cannot take (too long, empty, a token id outside the vocabulary) is a 400 naming
``input`` (``input[2]`` in a batch) before any request starts. A generating server answers this route with a
404, as current vLLM does (it registers the embeddings route only for pooling models), with the message its
older releases gave, "The model does not support Embeddings API", and what to do instead.
"""

from __future__ import annotations

import asyncio
import functools
import base64
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from engine.core import PoolingParams
from engine.pooling_outputs import EmbeddingRequestOutput
from engine.request_inputs import Prompt
from engine.serve.errors import OpenAIError
from engine.serve.state import ServerState, engine_error
from engine.serve.streaming import ClientDisconnected, run_unless_disconnected

EMBEDDINGS_UNSUPPORTED = ("The model does not support Embeddings API: this server generates (start it with "
                          "--runner pooling to embed)")
GENERATION_UNSUPPORTED = ("The model does not support {route}: this server embeds (--runner pooling); "
                          "use /v1/embeddings")


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    input: str | list[int] | list[str] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    normalize: bool | None = None


def embedding_inputs(value: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """One input per embedding: a string or a token-id list is one, a list of them a batch."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise OpenAIError("input must not be empty", param="input", code="invalid_value")
    if isinstance(value[0], (str, list)):
        return list(value)
    return [value]


def encode_embedding(embedding: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return embedding
    return base64.b64encode(np.asarray(embedding, dtype="<f4").tobytes()).decode("ascii")


def _prepare(state: ServerState, body: EmbeddingRequest) -> tuple[PoolingParams, list[Prompt]]:
    engine = state.engine
    try:
        params = engine.resolve_pooling_params(PoolingParams(dimensions=body.dimensions, normalize=body.normalize))
    except ValueError as error:
        raise OpenAIError(str(error).removeprefix("prompt: "), param="dimensions", code="invalid_value") from None
    inputs = embedding_inputs(body.input)
    labels = ["input"] if len(inputs) == 1 else [f"input[{index}]" for index in range(len(inputs))]
    return params, pooling_prompts(state, inputs, labels, body.truncate_prompt_tokens)


def pooling_prompts(state: ServerState, inputs: list[str | list[int]], labels: list[str],
                    truncate_prompt_tokens: int | None) -> list[Prompt]:
    """Each input as the engine's prompt, checked: a bad one is a 400 naming its label (the client's field)."""
    prompts = []
    for value, label in zip(inputs, labels):
        try:
            prompts.append(state.engine.process_pooling_prompt(value, truncate_prompt_tokens))
        except ValueError as error:
            message = str(error)
            if message.startswith("truncate_prompt_tokens"):
                raise OpenAIError(message, param="truncate_prompt_tokens", code="invalid_value") from None
            code = "context_length_exceeded" if "more than the engine allows" in message else "invalid_value"
            # The engine's checks call it "prompt"; the client's field is input (input[i] in a batch).
            raise OpenAIError(label + message.removeprefix("prompt"), param=label, code=code) from None
    return prompts


async def pool_concurrently(raw_request: Request, calls: list[Callable[[], Awaitable]]) -> list:
    """Every call's result (each a pooling request: an embedding, a classification), concurrently; raises
    ClientDisconnected if the client leaves. After a failure or a disconnect the others are cancelled, which
    aborts their requests."""
    async def run_all():
        tasks = [asyncio.ensure_future(call()) for call in calls]
        try:
            return await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    return await run_unless_disconnected(raw_request, run_all())


async def embed_prompts(state: ServerState, prompts: list[Prompt], params: PoolingParams | None, request_id: str,
                        raw_request: Request) -> list[EmbeddingRequestOutput]:
    """Every prompt's embedding, concurrently (``pool_concurrently``)."""
    return await pool_concurrently(raw_request, [functools.partial(state.engine.embed, prompt, params,
                                                                   f"{request_id}-{index}")
                                                 for index, prompt in enumerate(prompts)])


async def create_embedding(body: EmbeddingRequest, raw_request: Request, state: ServerState) -> Response:
    engine = state.engine
    if not engine.is_pooling:
        raise OpenAIError(EMBEDDINGS_UNSUPPORTED, status=404, code="model_not_supported")
    if engine.labels is not None:
        raise OpenAIError("The model does not support Embeddings API: it is a sequence classifier (use /classify, "
                          "/score or /rerank)", status=404, code="model_not_supported")
    state.check_model(body.model)
    params, prompts = _prepare(state, body)
    request_id = f"embd-{uuid.uuid4().hex}"
    try:
        outputs = await embed_prompts(state, prompts, params, request_id, raw_request)
    except ClientDisconnected:
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    num_prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    data: list[dict[str, Any]] = [
        {"object": "embedding", "index": index,
         "embedding": encode_embedding(output.outputs.embedding, body.encoding_format)}
        for index, output in enumerate(outputs)]
    return JSONResponse({"id": request_id, "object": "list", "created": int(time.time()),
                         "model": body.model or state.model_name, "data": data,
                         "usage": {"prompt_tokens": num_prompt_tokens, "total_tokens": num_prompt_tokens}})
