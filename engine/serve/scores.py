"""vLLM's score and rerank routes on a pooling server (``--runner pooling``): the cosine similarity of two texts'
embeddings (engine/embedding_scores.py), or, when the model is a cross-encoder (a sequence classifier of one
label), the sigmoid of its logit for the pair read as one prompt (engine/cross_encoder.py).

``POST /score`` and ``/v1/score``: ``text_1`` and ``text_2``, each a string or a list of strings (or token-id
lists); one text against each of N, or N against N in order. ``data[i].score`` is pair i's.
``POST /rerank``, ``/v1/rerank`` and ``/v2/rerank`` (Jina's and Cohere's shape): ``query`` and ``documents``;
``results`` best first, each with its document's ``index``, the ``document`` and its ``relevance_score``,
the first ``top_n`` (all when 0 or absent). Each distinct text is embedded once. A generating server answers
404, as vLLM registers these routes only for models that serve them; a classifier of several labels 400."""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from engine.cross_encoder import check_cross_encoder, pair_prompt
from engine.embedding_scores import cosine_similarity, distinct_inputs, score_pairs, score_texts
from engine.serve.embeddings import pool_concurrently, pooling_prompts
from engine.serve.errors import OpenAIError
from engine.serve.state import ServerState, engine_error
from engine.serve.streaming import ClientDisconnected

SCORE_UNSUPPORTED = ("The model does not support {route}: this server generates (start it with --runner pooling "
                     "to score with an embedding model)")


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    text_1: str | list[str] | list[int] | list[list[int]]
    text_2: str | list[str] | list[int] | list[list[int]]
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int = Field(default=0, ge=0)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


def _side(value: str | list, name: str) -> list[str | list[int]]:
    texts = score_texts(value, name)  # the body's types are checked already: it cannot refuse them
    if not texts:
        raise OpenAIError(f"{name} must not be empty", param=name, code="invalid_value")
    return texts


def _labels(texts: list, name: str) -> list[str]:
    return [name] if len(texts) == 1 else [f"{name}[{index}]" for index in range(len(texts))]


async def _scores(state: ServerState, raw_request: Request, request_id: str, texts_1: list, texts_2: list,
                  labels: list[str], truncate_prompt_tokens: int | None) -> tuple[list[float], list] | Response:
    """Each pair's score (score_pairs' order) and the pooling outputs it came from (the distinct texts'
    embeddings, or each pair's classification on a cross-encoder); or the response to give instead when the
    client left (499) or the engine failed. A bad input raises its 400 before any request."""
    engine = state.engine
    try:
        pairs = score_pairs(len(texts_1), len(texts_2))
    except ValueError as error:
        raise OpenAIError(str(error), param="text_2", code="invalid_value") from None
    if engine.labels is not None:
        # A cross-encoder reads each pair as one prompt; a pair too long is named by its second text.
        try:
            check_cross_encoder(engine.labels)
            inputs = [pair_prompt(engine.tokenizer, texts_1[first], texts_2[second]) for first, second in pairs]
        except ValueError as error:
            raise OpenAIError(str(error), code="invalid_value") from None
        prompts = pooling_prompts(state, inputs, [labels[len(texts_1) + second] for _, second in pairs],
                                  truncate_prompt_tokens)
        calls = [functools.partial(engine.classify, prompt, f"{request_id}-{index}")
                 for index, prompt in enumerate(prompts)]
    else:
        distinct, positions = distinct_inputs(texts_1 + texts_2)
        first_labels = {}
        for position, label in zip(positions, labels):
            first_labels.setdefault(position, label)
        prompts = pooling_prompts(state, distinct, [first_labels[index] for index in range(len(distinct))],
                                  truncate_prompt_tokens)
        calls = [functools.partial(engine.embed, prompt, None, f"{request_id}-{index}")
                 for index, prompt in enumerate(prompts)]
    try:
        outputs = await pool_concurrently(raw_request, calls)
    except ClientDisconnected:
        return Response(status_code=499)
    except Exception as error:
        return engine_error(error).to_response()
    if engine.labels is not None:
        return [output.outputs.probs[0] for output in outputs], outputs
    return [cosine_similarity(outputs[positions[first]].outputs.embedding,
                              outputs[positions[len(texts_1) + second]].outputs.embedding)
            for first, second in pairs], outputs


def _check(state: ServerState, model: str | None, route: str) -> None:
    if not state.engine.is_pooling:
        raise OpenAIError(SCORE_UNSUPPORTED.format(route=route), status=404, code="model_not_supported")
    state.check_model(model)


async def create_score(body: ScoreRequest, raw_request: Request, state: ServerState) -> Response:
    _check(state, body.model, "Score API")
    texts_1, texts_2 = _side(body.text_1, "text_1"), _side(body.text_2, "text_2")
    request_id = f"score-{uuid.uuid4().hex}"
    scored = await _scores(state, raw_request, request_id, texts_1, texts_2,
                           _labels(texts_1, "text_1") + _labels(texts_2, "text_2"), body.truncate_prompt_tokens)
    if isinstance(scored, Response):
        return scored
    scores, outputs = scored
    num_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    data: list[dict[str, Any]] = [{"index": index, "object": "score", "score": score}
                                  for index, score in enumerate(scores)]
    return JSONResponse({"id": request_id, "object": "list", "created": int(time.time()),
                         "model": body.model or state.model_name, "data": data,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})


async def create_rerank(body: RerankRequest, raw_request: Request, state: ServerState) -> Response:
    _check(state, body.model, "Rerank API")
    request_id = f"rerank-{uuid.uuid4().hex}"
    scored = await _scores(state, raw_request, request_id, [body.query], list(body.documents),
                           ["query"] + _labels(body.documents, "documents"), body.truncate_prompt_tokens)
    if isinstance(scored, Response):
        return scored
    scores, outputs = scored
    ranked = sorted(range(len(scores)), key=lambda index: -scores[index])
    if body.top_n:
        ranked = ranked[:body.top_n]
    num_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    results = [{"index": index, "document": {"text": body.documents[index]}, "relevance_score": scores[index]}
               for index in ranked]
    return JSONResponse({"id": request_id, "model": body.model or state.model_name,
                         "usage": {"total_tokens": num_tokens}, "results": results})
