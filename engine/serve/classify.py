"""``POST /classify`` and ``/v1/classify`` (vLLM's): each input's label probabilities, on a server whose model is a
sequence classifier (a ``*ForSequenceClassification`` checkpoint, ``--runner pooling``).

``input`` as the embeddings route takes it (a string or token ids, or a list of them); ``data[i]`` holds input
i's ``probs`` (softmax over the labels; a single label's sigmoid), ``num_classes`` and the most probable
``label`` (config.json's ``id2label``). A bad input is a 400 naming it before any request starts. A server whose
model has no classification head answers 404, as vLLM registers the route only for classifiers.
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from engine.serve.embeddings import embedding_inputs, pool_concurrently, pooling_prompts
from engine.serve.errors import OpenAIError
from engine.serve.state import ServerState, engine_error
from engine.serve.streaming import ClientDisconnected

CLASSIFY_UNSUPPORTED = ("The model does not support Classification API: it has no classification head (serve a "
                        "*ForSequenceClassification checkpoint with --runner pooling)")


class ClassificationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    input: str | list[int] | list[str] | list[list[int]]
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


async def create_classify(body: ClassificationRequest, raw_request: Request, state: ServerState) -> Response:
    engine = state.engine
    if not engine.is_pooling or engine.labels is None:
        raise OpenAIError(CLASSIFY_UNSUPPORTED, status=404, code="model_not_supported")
    state.check_model(body.model)
    inputs = embedding_inputs(body.input)
    labels = ["input"] if len(inputs) == 1 else [f"input[{index}]" for index in range(len(inputs))]
    prompts = pooling_prompts(state, inputs, labels, body.truncate_prompt_tokens)
    request_id = f"classify-{uuid.uuid4().hex}"
    try:
        outputs = await pool_concurrently(raw_request, [functools.partial(engine.classify, prompt,
                                                                          f"{request_id}-{index}")
                                                        for index, prompt in enumerate(prompts)])
    except ClientDisconnected:
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    num_prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    data: list[dict[str, Any]] = []
    for index, output in enumerate(outputs):
        probs = output.outputs.probs
        data.append({"index": index, "label": engine.labels[max(range(len(probs)), key=probs.__getitem__)],
                     "probs": probs, "num_classes": len(probs)})
    return JSONResponse({"id": request_id, "object": "list", "created": int(time.time()),
                         "model": body.model or state.model_name, "data": data,
                         "usage": {"prompt_tokens": num_prompt_tokens, "total_tokens": num_prompt_tokens}})
