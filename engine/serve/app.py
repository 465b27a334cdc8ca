"""The FastAPI application: OpenAI's routes over one ``AsyncLLM``.

    GET  /v1/models            the served model (with max_model_len, vocab_size, reserved_token_ids), then each
                               LoRA adapter (root: its folder, parent: its base_model_name, else the model's);
                               GET /v1/models/{id} one of them
    POST /v1/completions       a text or token-id prompt, or a batch of them; n choices each; SSE or not
    POST /v1/chat/completions  messages through the model's chat template, streaming or not
    POST /v1/responses         OpenAI's Responses API: one assistant turn as output items (reasoning, message,
                               function calls), streamed as typed events or not; kept responses continued with
                               previous_response_id, read and deleted at /v1/responses/{id} (responses.py)
    POST /v1/embeddings        one vector per input, on an engine created with runner="pooling" (embeddings.py);
                               the two generation routes then answer 404, as this one does on a generating engine
                               (current vLLM registers each route only for the engines that serve it)
    POST /classify, /v1/classify
                               vLLM's: label probabilities, on a sequence classifier with --runner pooling (classify.py)
    POST /score, /v1/score     vLLM's: two texts' score, 1:N or N:N: the cosine of their embeddings, or a
                               cross-encoder's sigmoid for the pair read as one prompt (scores.py)
    POST /rerank, /v1/rerank, /v2/rerank
                               vLLM's (Jina's and Cohere's shape): documents ranked by their score against a query
    POST /tokenize             prompt text or chat messages -> token ids (vLLM's utility route)
    POST /detokenize           token ids -> text
    GET  /version              the package version
    GET  /health               200 while the engine thread runs, 503 otherwise
    GET  /metrics              Prometheus text format
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter
                               only when runtime LoRA updates are allowed (engine/serve/lora_updates.py)
    POST /reset_prefix_cache   only in development mode (engine/serve/dev_routes.py)

The app does not own the engine unless asked (``shutdown_engine=True``, what ``python -m engine.serve``
does): then leaving the server's lifespan shuts the engine down, aborting requests still in flight.
``on_shutdown`` runs last (uvicorn re-raises SIGTERM after its shutdown, so code after
``uvicorn.run`` may never run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from engine.async_llm import AsyncLLM
from engine.core import LoRARequest
from engine.serve.chat import create_chat_completion
from engine.serve.completions import create_completion
from engine.serve.embeddings import GENERATION_UNSUPPORTED, EmbeddingRequest, create_embedding
from engine.serve.classify import ClassificationRequest, create_classify
from engine.serve.scores import RerankRequest, ScoreRequest, create_rerank, create_score
from engine.serve.api_keys import add_api_key_check
from engine.serve.cors import CorsSettings, add_cors
from engine.serve.dev_routes import add_dev_routes, dev_mode_enabled
from engine.serve.errors import OpenAIError, install_error_handlers
from engine.serve.lora_updates import add_lora_update_routes, runtime_lora_updating_allowed
from engine.serve.prometheus import CONTENT_TYPE, render_metrics
from engine.serve.protocol import ChatCompletionRequest, CompletionRequest
from engine.serve.responses import (cancel_response, create_response, delete_response, stored_input_items,
                                    stored_response)
from engine.serve.responses_protocol import ResponsesRequest
from engine.serve.state import ServerState
from engine.reasoning_parsers import get_parser as get_reasoning_parser
from engine.serve.tool_parsers import get_parser
from engine.serve.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, server_version, tokenize


def build_app(engine: AsyncLLM, served_model_names: list[str] | str | None = None, *,
              shutdown_engine: bool = False, on_shutdown: Callable[[], None] | None = None,
              tool_parser: str | None = None, reasoning_parser: str | None = None,
              lora_requests: dict[str, LoRARequest] | None = None,
              lora_parents: dict[str, str] | None = None,
              allow_runtime_lora_updating: bool | None = None, dev_mode: bool | None = None,
              api_keys: list[str] | None = None, chat_template: str | None = None,
              cors: CorsSettings | None = None) -> FastAPI:
    """``tool_parser`` names the parser of tool_choice "auto" (engine/serve/tool_parsers/); None refuses it.
    ``reasoning_parser`` names the parser that splits chat answers' reasoning from their content
    (engine/reasoning_parsers/); None: no split.
    ``allow_runtime_lora_updating``: serve /v1/load_lora_adapter and /v1/unload_lora_adapter (None: as the
    environment variable SERVESIM_ALLOW_RUNTIME_LORA_UPDATING says).
    ``dev_mode``: serve vLLM's development routes (dev_routes.py; None: as SERVESIM_SERVER_DEV_MODE says).
    ``api_keys``: the /v1 routes answer only requests that send one of them (api_keys.py; None or []: open).
    ``chat_template``: a Jinja chat template that replaces the tokenizer's (vLLM's --chat-template).
    ``cors``: which browser origins may call the server (None: vLLM's defaults, any origin, no credentials)."""
    if tool_parser is not None:
        get_parser(tool_parser)  # a ValueError listing the known names
    if reasoning_parser is not None:
        get_reasoning_parser(reasoning_parser)  # likewise
    if chat_template is not None:
        engine.set_chat_template(chat_template)
    if served_model_names is None:
        served_model_names = [str(engine.engine_args.model or engine.model_path.name)]
    elif isinstance(served_model_names, str):
        served_model_names = [served_model_names]
    state = ServerState(engine, list(served_model_names), tool_parser=tool_parser, reasoning_parser=reasoning_parser,
                        lora_requests=dict(lora_requests or {}), lora_parents=dict(lora_parents or {}))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if shutdown_engine:
            await asyncio.to_thread(engine.shutdown)
        if on_shutdown is not None:
            on_shutdown()

    # A body sent without a Content-Type is read as JSON, leniently, as OpenAI's server does (hand-written
    # clients often omit the header); one with another Content-Type is a 400 saying JSON is required.
    app = FastAPI(title="servesim OpenAI-compatible server", lifespan=lifespan, strict_content_type=False)
    app.state.server = state
    install_error_handlers(app)
    if api_keys:
        add_api_key_check(app, api_keys)
    add_cors(app, cors or CorsSettings())  # last added, so outermost: a preflight is answered before the key check
    if runtime_lora_updating_allowed(allow_runtime_lora_updating):
        add_lora_update_routes(app, state)
    if dev_mode_enabled(dev_mode):
        add_dev_routes(app, state)

    def model_cards() -> list[dict]:
        tokenizer = engine.get_tokenizer()
        reserved = sorted(int(t) for t in tokenizer.all_special_ids) if tokenizer is not None else []
        cards = [{"id": name, "object": "model", "created": state.created, "owned_by": "servesim",
                  "root": str(engine.model_path), "parent": None, "max_model_len": engine.max_model_len,
                  "vocab_size": engine.vocab_size, "reserved_token_ids": reserved}
                 for name in state.served_model_names]
        cards += [{"id": name, "object": "model", "created": state.created, "owned_by": "servesim",
                   "root": lora_request.lora_path, "parent": state.lora_parents.get(name, state.model_name),
                   "max_model_len": engine.max_model_len, "vocab_size": engine.vocab_size,
                   "reserved_token_ids": reserved}
                  for name, lora_request in state.lora_requests.items()]
        return cards

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": model_cards()})

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> JSONResponse:
        """OpenAI's retrieve-model route (the openai client's models.retrieve): one card, or the 404 of a model this
        server does not serve."""
        card = next((card for card in model_cards() if card["id"] == model), None)
        if card is None:
            state.check_model(model)  # raises the 404 naming what is served
        return JSONResponse(card)

    def generating(route: str) -> None:
        """A 404 from a generation route on an engine that embeds (current vLLM does not register them there)."""
        if engine.is_pooling:
            raise OpenAIError(GENERATION_UNSUPPORTED.format(route=route), status=404, code="model_not_supported")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw_request: Request) -> Response:
        generating("Completions API")
        return await create_completion(body, raw_request, state)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw_request: Request) -> Response:
        generating("Chat Completions API")
        return await create_chat_completion(body, raw_request, state)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, raw_request: Request) -> Response:
        generating("Responses API")
        return await create_response(body, raw_request, state)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> JSONResponse:
        return stored_response(state, response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def get_input_items(response_id: str, order: str = "desc") -> JSONResponse:
        return stored_input_items(state, response_id, order)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_background_response(response_id: str) -> JSONResponse:
        return await cancel_response(state, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_stored_response(response_id: str) -> JSONResponse:
        return delete_response(state, response_id)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, raw_request: Request) -> Response:
        return await create_embedding(body, raw_request, state)

    @app.post("/classify")
    @app.post("/v1/classify")
    async def classify(body: ClassificationRequest, raw_request: Request) -> Response:
        return await create_classify(body, raw_request, state)

    @app.post("/score")
    @app.post("/v1/score")
    async def score(body: ScoreRequest, raw_request: Request) -> Response:
        return await create_score(body, raw_request, state)

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    async def rerank(body: RerankRequest, raw_request: Request) -> Response:
        return await create_rerank(body, raw_request, state)

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest) -> JSONResponse:
        return JSONResponse(tokenize(body, state))

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest) -> JSONResponse:
        return JSONResponse(detokenize(body, state))

    @app.get("/version")
    async def version_route() -> JSONResponse:
        return JSONResponse(server_version())

    @app.get("/health")
    async def health() -> Response:
        try:
            engine.check_health()
        except Exception as error:
            return OpenAIError(str(error), status=503, code="engine_unavailable").to_response()
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(engine.get_stats(), state.model_name), media_type=CONTENT_TYPE)

    return app
